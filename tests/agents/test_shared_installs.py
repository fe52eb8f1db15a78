"""As root, one agent install per version serves every home (``$CORRAL_SHARED_DIR/agents/
installs``), each home's use is recorded, and ``corral agents prune`` removes only what no
existing home links to and no running process uses. Real npm (counted by a wrapper on
PATH), real homes, a real process holding a file of the install."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.agents import _installs, _shared
from corral.testing._plugin import require
from tests.conftest import bwrap_works

NAME, VERSION = "gemini-cli", "0.61.0"  # the smallest pinned CLI (~100 MB)
SANDBOX_RUNS_IT = f"""
import anyio
from corral.agents._prepare import with_agent_binds
from corral.providers._bubblewrap import BubblewrapProvider
from corral.sandbox._contracts import SandboxSpec

async def main() -> None:
    bwrap = BubblewrapProvider()
    handle = await bwrap.create(with_agent_binds(SandboxSpec()))
    try:
        res = await handle.process.exec(["/opt/corral/agents/{NAME}/{VERSION}/node_modules/.bin/gemini",
                                 "--version"], env={{"HOME": "/tmp"}})
        print(res.exit_code, res.stdout.decode(), res.stderr.decode())
        assert res.exit_code == 0
    finally:
        await bwrap.destroy(handle.ref)

anyio.run(main)
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="installs are shared only as root")


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A private ``$CORRAL_SHARED_DIR`` the sandboxes' uid could reach (root-owned, 0755,
    under the sticky /var/tmp), removed at the end."""
    d = Path(tempfile.mkdtemp(prefix="corral-shared-", dir="/var/tmp"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _corral(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corral", *argv], env=env,
                          capture_output=True, text=True, timeout=900, check=False)


def test_two_homes_share_one_install_and_prune_removes_it_when_no_home_uses_it(
        request: pytest.FixtureRequest, tmp_path: Path, shared_dir: Path,
        cli_env: dict[str, str]) -> None:
    npm = shutil.which("npm")
    require(request.config, npm is not None, "npm (Node.js)", "apt-get install nodejs npm")
    log = tmp_path / "npm.log"
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "npm").write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {npm} "$@"\n')
    (shim / "npm").chmod(0o755)
    homes = [tmp_path / "home-a", tmp_path / "home-b"]  # under pytest's 0700 tmp_path
    envs = []
    for home in homes:
        env = {k: v for k, v in cli_env.items() if k != "CORRAL_AGENTS_DIR"}
        env.update({"CORRAL_HOME": str(home), "CORRAL_SHARED_DIR": str(shared_dir),
                    "PATH": f"{shim}:{env['PATH']}"})
        envs.append(env)

    installed = []
    for env in envs:
        out = _corral(env, "agents", "install", NAME, "--json")
        assert out.returncode == 0, out.stderr
        installed.append(json.loads(out.stdout))
    # npm ran once: the second home linked the first home's install
    calls = log.read_text().splitlines()
    assert len(calls) == 1 and calls[0].startswith("install "), calls
    real = shared_dir / "agents" / "installs" / NAME / VERSION
    assert {i["path"] for i in installed} == {str(real)}
    entries = [home / "agents" / NAME / VERSION for home in homes]
    assert all(e.is_symlink() and e.resolve() == real for e in entries)
    assert len({os.stat(e / "corral-install.json").st_ino for e in entries}) == 1
    refs = sorted((shared_dir / "agents" / "refs" / NAME / VERSION).iterdir())
    assert len(refs) == 2 and oct(os.stat(shared_dir / "agents" / "refs").st_mode)[-3:] == "700"
    assert oct(os.stat(real).st_mode)[-3:] == "755"  # the sandboxes' uid reads it

    # a home's isolated sandbox runs the shared CLI (as the sandboxes' unprivileged uid)
    if bwrap_works():
        out = subprocess.run([sys.executable, "-c", SANDBOX_RUNS_IT], env=envs[1],
                             capture_output=True, text=True, timeout=300, check=False)
        assert out.returncode == 0 and VERSION in out.stdout, (out.stdout, out.stderr)

    def prune(*argv: str) -> dict[str, list[dict[str, object]]]:
        out = _corral(envs[1], "agents", "prune", "--json", *argv)
        assert out.returncode == 0, out.stderr
        doc: dict[str, list[dict[str, object]]] = json.loads(out.stdout)
        return doc

    doc = prune()
    assert doc["removed"] == [] and [k["homes"] for k in doc["kept"]] == [
        [str(home / "agents") for home in homes]]
    shutil.rmtree(homes[0])  # a deleted home stops counting, nobody told
    doc = prune()
    assert doc["removed"] == [] and [k["homes"] for k in doc["kept"]] == [
        [str(homes[1] / "agents")]]
    assert real.is_dir()

    # the last home goes while a process still uses the install: kept
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; f = open(sys.argv[1]); print('ready', flush=True); "
         "sys.stdin.read()", str(real / "corral-install.json")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        shutil.rmtree(homes[1])
        doc = prune()
        assert doc["removed"] == [] and len(doc["kept"]) == 1, doc
        assert doc["kept"][0]["reason"] == f"in use by a running process (pid {holder.pid})"
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)

    out = _corral(envs[1], "agents", "prune", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"would remove {NAME} {VERSION} (") and \
        out.stdout.endswith(f" MB) {real}\n"), out.stdout
    assert real.is_dir()
    out = _corral(envs[1], "agents", "prune")
    assert out.returncode == 0 and out.stdout.startswith(f"removed {NAME} {VERSION} ("), out
    assert out.stderr.startswith("corral: removed 1 install(s) (") and \
        out.stderr.endswith("), kept 0\n"), out.stderr
    assert not real.exists() and not (shared_dir / "agents" / "refs" / NAME / VERSION).exists()
    assert os.listdir(real.parent) == []  # nothing half-removed left beside it


def test_an_untrusted_shared_directory_is_not_shared(
        tmp_path: Path, shared_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_shared, "SHARED_ROOT", shared_dir)
    root = tmp_path / "agents"  # under pytest's 0700 tmp_path: the sandbox uid cannot enter
    root.mkdir()
    assert _installs.mount_source(root) == shared_dir / "agents" / "installs"
    os.chmod(shared_dir, 0o777)  # anyone could swap the installs underneath
    assert not _shared.shared_for(root)
    assert "writable by other users" in str(_shared.trust_problem())
    assert _installs.mount_source(root) == _shared.legacy_dir(root)  # per home, as before
    os.chmod(shared_dir, 0o755)
    # a root that already has installs of the older, per-root layout keeps it
    legacy = _shared.legacy_dir(root) / NAME / VERSION
    legacy.mkdir(parents=True)
    (root / NAME).mkdir()
    (root / NAME / VERSION).symlink_to(legacy)
    assert _installs.mount_source(root) == _shared.legacy_dir(root)


def test_prune_as_another_user_says_nothing_is_shared(
        shared_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_shared, "SHARED_ROOT", shared_dir)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    report = _shared.prune_installs()
    assert report.removed == [] and "only when corral runs as root" in report.note
