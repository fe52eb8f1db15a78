"""Policy → CLI permission mapping: what each harness enforces, what it refuses at definition
time, and a real Claude Code run where a deny rule stops a command."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from ag_ui.core import EventType

from corral._errors import ConfigError
from corral.harness._base import AgentRequest
from corral.harness._claude_code import ClaudeCodeHarness
from corral.harness._cli_base import PolicyLike
from corral.harness._codex import CodexHarness
from corral.policy._policy import Policy
from corral.testing._model_script import shell_then_text
from corral.testing._model_server import ModelServer

from .conftest import run_agent, upstream_for


@dataclass(frozen=True)
class P:
    """A minimal structural policy (corral.Policy has the same attributes)."""

    allow: tuple[str, ...] = ()
    ask: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    default: str = "allow"
    file_write: str = "allow"
    network: str = "deny"


def flag_values(argv: tuple[str, ...], flag: str) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == flag:
            i += 1
            while i < len(argv) and not argv[i].startswith("--"):
                out.append(argv[i])
                i += 1
        else:
            i += 1
    return out


def test_policy_like_is_structural() -> None:
    assert isinstance(P(), PolicyLike)


def test_claude_without_rules_bypasses_its_own_checks() -> None:
    m = ClaudeCodeHarness().policy_mapping
    assert m.bypass and flag_values(m.argv, "--permission-mode") == ["bypassPermissions"]
    assert m.env == {"IS_SANDBOX": "1"}
    m = ClaudeCodeHarness(policy=P()).policy_mapping
    assert m.bypass and flag_values(m.argv, "--disallowedTools") == ["WebFetch", "WebSearch"]
    assert any("network: deny" in e for e in m.enforced)


def test_allow_hosts_keeps_server_side_search_off() -> None:
    # WebSearch runs on the model provider's servers, beyond the egress proxy.
    pol = Policy(default="allow", network="allow", allow_hosts=["pypi.org"])
    m = ClaudeCodeHarness(policy=pol).policy_mapping
    assert m.bypass and flag_values(m.argv, "--disallowedTools") == ["WebSearch"]
    assert any("allow_hosts ['pypi.org']" in e for e in m.enforced)
    m = ClaudeCodeHarness(policy=Policy(default="allow", network="allow")).policy_mapping
    assert "--disallowedTools" not in m.argv
    ruled = Policy(default="allow", deny=["rm *"], network="allow", allow_hosts=["pypi.org"])
    m = ClaudeCodeHarness(policy=ruled).policy_mapping
    assert "WebFetch" in flag_values(m.argv, "--allowedTools")
    assert "WebSearch" in flag_values(m.argv, "--disallowedTools")
    assert 'web_search="disabled"' in CodexHarness(policy=pol).policy_mapping.argv
    assert 'web_search="disabled"' not in CodexHarness(
        policy=Policy(default="allow", network="allow")).policy_mapping.argv


def test_claude_maps_prefix_rules() -> None:
    m = ClaudeCodeHarness(policy=P(deny=("rm *", "git push"), default="allow")).policy_mapping
    assert not m.bypass
    assert flag_values(m.argv, "--permission-mode") == ["dontAsk"]
    assert "Bash" in flag_values(m.argv, "--allowedTools")
    assert flag_values(m.argv, "--disallowedTools")[:2] == ["Bash(rm:*)", "Bash(git push)"]
    assert "deny 'rm *' -> --disallowedTools Bash(rm:*)" in m.enforced

    m = ClaudeCodeHarness(policy=P(allow=("pytest *", "git status"), default="deny",
                                   file_write="deny")).policy_mapping
    allowed = flag_values(m.argv, "--allowedTools")
    assert "Bash(pytest:*)" in allowed and "Bash(git status)" in allowed
    assert "Bash" not in allowed and "Edit" not in allowed
    assert {"Edit", "Write"} <= set(flag_values(m.argv, "--disallowedTools"))
    assert m.report().startswith("claude-code enforces:")


@pytest.mark.parametrize("policy, fragment", [
    (P(ask=("git push *",)), "ask rules"),
    (P(default="ask"), "default: ask"),
    (P(deny=("rm -r*",)), "deny 'rm -r*'"),
    (P(allow=("py?est",), default="deny"), "allow 'py?est'"),
    (P(deny=("x",), file_write="deny"), "file_write: deny with default: allow"),
    (P(deny=("x",), file_write="ask"), "file_write: ask"),
])
def test_claude_refuses_unenforceable_rules_at_definition_time(policy: P, fragment: str) -> None:
    with pytest.raises(ConfigError, match="Claude Code cannot enforce") as err:
        ClaudeCodeHarness(policy=policy)
    assert fragment in str(err.value)


def test_codex_mapping() -> None:
    m = CodexHarness().policy_mapping
    assert m.bypass and m.argv == ("--dangerously-bypass-approvals-and-sandbox",)
    m = CodexHarness(policy=P()).policy_mapping
    assert m.argv[-2:] == ("-c", 'web_search="disabled"')
    for policy in (P(deny=("rm *",)), P(allow=("ls",)), P(default="deny"),
                   P(file_write="deny"), P(ask=("x",))):
        with pytest.raises(ConfigError, match="Codex cannot enforce"):
            CodexHarness(policy=policy)
    # the mapping lands in the command line
    cmd = CodexHarness(policy=P()).build_command(AgentRequest(prompt="hi", options={
        "base_url": "http://127.0.0.1:9/v1"}))
    assert 'web_search="disabled"' in cmd.argv
    # With corral's command gate (a Runner run), command rules are enforced by the hook;
    # file_write still cannot be.
    for policy in (P(deny=("rm *",)), P(allow=("ls",)), P(default="deny"), P(ask=("x",))):
        m = CodexHarness(policy=policy, permission_prompt=True).policy_mapping
        assert m.permission_prompt and any("PreToolUse" in e for e in m.enforced)
    with pytest.raises(ConfigError, match="file_write"):
        CodexHarness(policy=P(deny=("x",), file_write="deny"), permission_prompt=True)
    assert not CodexHarness(policy=P(), permission_prompt=True).policy_mapping.permission_prompt
    with pytest.raises(ConfigError, match="host_tools=True"):
        CodexHarness(policy=P(deny=("x",)), permission_prompt=True).build_command(
            AgentRequest(prompt="hi", options={"base_url": "http://127.0.0.1:9/v1"}))


def test_claude_deny_rule_stops_the_command(sandbox_factory: Any,
                                            model_server: ModelServer) -> None:
    model_server.script = shell_then_text("rm -f precious.txt; ls", "Result: {output}")
    harness = ClaudeCodeHarness(policy=P(deny=("rm *",)))

    async def go() -> Any:
        handle = await sandbox_factory()
        await handle.fs.write("/workspace/precious.txt", b"keep me")
        run = await run_agent(harness, handle, "clean up", model_server)
        return run, await handle.fs.exists("/workspace/precious.txt")

    run, exists = anyio.run(go)
    assert exists, run.tool_results()
    assert run.terminal.type == EventType.RUN_FINISHED, (
        getattr(run.terminal, "message", None), run.stderr,
        [r.reply for r in model_server.requests])
    result = run.tool_results()[0]
    assert "precious.txt" in result and "denied" in result.lower(), result


def test_claude_allowed_command_runs_under_a_deny_policy(sandbox_factory: Any,
                                                         model_server: ModelServer) -> None:
    model_server.script = shell_then_text("touch made.txt", "ok {output}")
    harness = ClaudeCodeHarness(policy=P(deny=("rm *",)))

    async def go() -> Any:
        handle = await sandbox_factory()
        run = await run_agent(harness, handle, "make a file", model_server)
        return run, await handle.fs.exists("/workspace/made.txt")

    run, exists = anyio.run(go)
    assert run.terminal.type == EventType.RUN_FINISHED, (run.terminal, run.stderr)
    assert exists, ([e.model_dump() for e in run.events], run.stderr)


def test_harnesses_from_a_run_spec_with_the_real_policy() -> None:
    from corral.policy._policy import Policy

    policy = Policy(allow=("pytest *",), deny=("rm -rf *",), default="deny",
                    file_write="deny")
    h = ClaudeCodeHarness.from_spec({"policy": policy.to_dict()})
    assert isinstance(h, ClaudeCodeHarness) and h.policy == policy
    assert "Bash(pytest:*)" in flag_values(h.policy_mapping.argv, "--allowedTools")
    assert "Bash(rm -rf:*)" in flag_values(h.policy_mapping.argv, "--disallowedTools")
    assert ClaudeCodeHarness.from_spec({"version": "2.1.332"}).version == "2.1.332"
    assert CodexHarness.from_spec({}).policy_mapping.bypass
    with pytest.raises(ConfigError, match="Codex cannot enforce"):
        CodexHarness.from_spec({"policy": policy.to_dict()})
    with pytest.raises(ConfigError, match="bad policy"):
        ClaudeCodeHarness.from_spec({"policy": {"bogus": 1}})
    with pytest.raises(ConfigError):
        ClaudeCodeHarness.from_spec({"policy": {"default": "ask"}})  # Policy's default


def test_codex_config_planted_in_the_home_is_removed_before_a_gated_run(
        sandbox_factory: Any, model_server: ModelServer) -> None:
    """The gate runs Codex with --dangerously-bypass-hook-trust, which would run user-level
    hooks unreviewed: whatever sits at ~/.codex/hooks.json or ~/.codex/config.toml (say,
    planted by the thread's previous run) is gone before the CLI starts."""
    from corral.agents._prepare import prepare_agent
    from corral.agents._sessions import SANDBOX_HOME

    harness = CodexHarness(policy=P(deny=("rm *",)), permission_prompt=True)

    async def go() -> tuple[bool, bool, bool]:
        handle = await sandbox_factory()
        await handle.fs.write(f"{SANDBOX_HOME}/.codex/hooks.json", b'{"hooks": {}}')
        await handle.fs.mkdir(f"{SANDBOX_HOME}/.codex/config.toml", parents=True)  # even a dir
        await handle.fs.write(f"{SANDBOX_HOME}/.codex/sessions/keep.jsonl", b"{}")
        await prepare_agent(harness, handle, AgentRequest(prompt="hi", options={"model": "gpt-fake"}),
                            thread_id="t", run_id="r", host_tools=True,
                            upstream=upstream_for(harness, model_server))
        return (await handle.fs.exists(f"{SANDBOX_HOME}/.codex/hooks.json"),
                await handle.fs.exists(f"{SANDBOX_HOME}/.codex/config.toml"),
                await handle.fs.exists(f"{SANDBOX_HOME}/.codex/sessions/keep.jsonl"))

    assert anyio.run(go) == (False, False, True)
