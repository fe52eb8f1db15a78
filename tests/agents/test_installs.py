"""The agent-CLI installer, ``corral agents`` and the doctor report."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from corral.agents import _installs, _shared
from corral.cli._main import COMMANDS, build_parser
from corral._errors import ConfigError, CorralError
from corral.agents._installs import (
    KNOWN_AGENTS,
    SHARED_ROOT,
    InstalledAgent,
    agents_report,
    find_installed,
    install_agent,
    list_installed,
    mount_source,
)

from .conftest import agent_cache


def cli(*argv: str) -> int:
    args = build_parser({"agents": COMMANDS["agents"]}).parse_args(list(argv))
    try:
        return int(args.func(args))
    except CorralError as exc:
        print(f"corral: error: {exc}")
        return 2


def test_pinned_installs_run(agent_installs: dict[str, InstalledAgent]) -> None:
    for name, agent in agent_installs.items():
        pkg = KNOWN_AGENTS[name]
        assert agent.version == pkg.version and agent.package == pkg.package
        out = subprocess.run([str(agent.bin_path), "--version"], capture_output=True,
                             timeout=60, check=False, stdin=subprocess.DEVNULL)
        assert out.returncode == 0 and pkg.version in out.stdout.decode()
        # readable by the sandboxes' unprivileged uid
        assert os.stat(agent.bin_path).st_mode & 0o005 == 0o005


def test_installing_again_reuses_the_install_without_npm(
        agent_installs: dict[str, InstalledAgent], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # npm cannot be found: nothing may call it
    again = install_agent("claude-code", root=agent_cache())
    assert again.path == agent_installs["claude-code"].path
    assert find_installed("codex", root=agent_cache()) == agent_installs["codex"]
    assert find_installed("codex", "9.9.9", root=agent_cache()) is None


def test_incomplete_installs_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "claude-code" / "2.1.332" / "node_modules").mkdir(parents=True)
    (tmp_path / "codex" / "0.171.0").mkdir(parents=True)
    (tmp_path / "codex" / "0.171.0" / "corral-install.json").write_text(json.dumps(
        {"name": "codex", "version": "0.171.0", "package": "@openai/codex"}))  # no binary
    assert list_installed(tmp_path) == []
    report = {s.name: s for s in agents_report(tmp_path)}
    assert not report["claude-code"].ok and "corral agents install claude-code" in \
        report["claude-code"].message
    assert not report["opencode"].ok and report["opencode"].supported
    assert "corral agents install opencode" in report["opencode"].message


@pytest.mark.parametrize("name, version, fragment", [
    ("aider", None, "unknown agent"),
    ("claude-code", "latest", "invalid version"),
    ("claude-code", "^2.1.0", "invalid version"),
])
def test_bad_requests_are_config_errors(tmp_path: Path, name: str, version: str | None,
                                        fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        install_agent(name, version, root=tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_cli_ls_and_install(agents_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("agents", "ls", "--json") == 0
    [line] = capsys.readouterr().out.splitlines()  # one document: an array
    rows = json.loads(line)
    assert {(r["name"], r["version"]) for r in rows} >= {("claude-code", "2.1.332"),
                                                        ("codex", "0.171.0"),
                                                        ("gemini-cli", "0.61.0")}
    assert cli("agents", "install", "codex") == 0  # already there: reused
    assert "codex 0.171.0 installed at" in capsys.readouterr().out
    assert cli("agents", "install", "codex", "--json") == 0
    installed = json.loads(capsys.readouterr().out)
    assert (installed["name"], installed["version"]) == ("codex", "0.171.0")
    assert cli("agents", "install", "opencode") == 0  # opencode-ai, its binary from npm
    assert "opencode 1.18.33 installed at" in capsys.readouterr().out
    assert cli("agents", "ls") == 0
    listed = capsys.readouterr().out
    assert "claude-code" in listed and "gemini-cli" in listed
    assert "opencode     1.18.33" in listed


@pytest.mark.skipif(os.geteuid() != 0, reason="relocation only happens for root")
def test_roots_the_sandbox_uid_cannot_reach_are_relocated(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    os.chmod(tmp_path, 0o700)
    src = mount_source(private)
    assert src.parent == SHARED_ROOT / "agents" and src != private
    open_root = Path("/tmp")
    assert mount_source(open_root) == open_root.resolve()


def test_claude_code_installs_the_acp_adapter_beside_the_cli(
        agent_installs: dict[str, InstalledAgent], agents_env: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    agent = install_agent("claude-code", root=agent_cache())  # adds it to an older install
    (adapter,) = agent.companions
    assert (adapter.package, adapter.version) == ("@agentclientprotocol/claude-agent-acp",
                                                  "0.101.0")
    binary = agent.path / adapter.rel_bin
    out = subprocess.run([str(binary), "--version"], capture_output=True, timeout=60,
                         check=False, stdin=subprocess.DEVNULL)
    assert out.returncode == 0 and "0.101.0" in out.stdout.decode()
    assert os.stat(binary.resolve()).st_mode & 0o005 == 0o005
    # the SDK's own 330 MB Claude binary (an optional dependency) is not installed: the
    # adapter runs the install's CLI (CLAUDE_CODE_EXECUTABLE)
    sdk = agent.path / "acp" / "node_modules" / "@anthropic-ai"
    assert not [p for p in sdk.iterdir() if p.name.startswith("claude-agent-sdk-")]
    assert cli("agents", "ls", "--json") == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}  # one array
    assert rows["claude-code"]["companions"] == [
        {"package": adapter.package, "version": "0.101.0", "bin": str(binary)}]
    assert cli("agents", "ls") == 0
    assert "+ @agentclientprotocol/claude-agent-acp 0.101.0" in capsys.readouterr().out
    report = {s.name: s for s in agents_report(agent_cache())}
    assert report["claude-code"].ok
    assert "with @agentclientprotocol/claude-agent-acp 0.101.0" in report["claude-code"].message


def test_an_install_without_the_adapter_is_reported_and_completed_by_install(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """An install made before the adapter existed: ls and doctor say what to run, and
    ``corral agents install claude-code`` adds the adapter without reinstalling the CLI."""
    entry = tmp_path / "claude-code" / "2.1.332"
    (entry / "node_modules" / ".bin").mkdir(parents=True)
    cli_bin = entry / "node_modules" / ".bin" / "claude"
    cli_bin.write_text("#!/bin/sh\necho '2.1.332 (Claude Code)'\n")
    cli_bin.chmod(0o755)
    (entry / "corral-install.json").write_text(json.dumps(
        {"name": "claude-code", "version": "2.1.332", "package": "@anthropic-ai/claude-code",
         "installed_at": 1.0}))
    monkeypatch.setenv("CORRAL_AGENTS_DIR", str(tmp_path))
    # a shared directory of this test's own: the machine's (as root, /var/lib/corral) may
    # hold a real install of this version, which the install would take instead
    shared = Path(tempfile.mkdtemp(prefix="corral-shared-", dir="/var/tmp"))
    os.chmod(shared, 0o755)
    monkeypatch.setattr(_shared, "SHARED_ROOT", shared)
    monkeypatch.setattr(_installs, "SHARED_ROOT", shared)
    request.addfinalizer(lambda: shutil.rmtree(shared, ignore_errors=True))
    report = {s.name: s for s in agents_report(tmp_path)}
    assert not report["claude-code"].ok
    assert "missing @agentclientprotocol/claude-agent-acp 0.101.0: run `corral agents " \
        "install claude-code`" in report["claude-code"].message
    assert cli("agents", "ls") == 0
    assert "- @agentclientprotocol/claude-agent-acp 0.101.0 missing" in capsys.readouterr().out
    from corral.cli._doctor import _agents
    (check,) = [c for c in _agents() if c.name == "agent claude-code"]
    assert check.status == "warn" and "missing" in check.detail
    assert cli("agents", "install", "claude-code") == 0
    agent = find_installed("claude-code", root=tmp_path)
    assert agent is not None and agent.path == entry.resolve() and agent.companions
    assert cli_bin.read_text().startswith("#!/bin/sh")  # the CLI was left alone
    assert {s.name: s for s in agents_report(tmp_path)}["claude-code"].ok
