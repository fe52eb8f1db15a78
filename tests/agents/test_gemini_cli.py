"""gemini-cli specifics: its stream-json translation, its settings, the policies it refuses
and the routing call (Gemini in the model proxy: test_model_proxy.py; the real CLI in the
shared suites: test_e2e.py, test_runner_agents.py, test_host_tools_gemini.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
from ag_ui.core import EventType

from corral._errors import ConfigError
from corral.harness._cli_base import NO_RESULT, SESSION_EVENT, CliOptions
from corral.harness._gemini_cli import GeminiCliHarness
from corral.harness._registry import build_harness
from corral.net._model_proxy import PLACEHOLDER_KEY
from corral.policy._policy import Policy
from corral.testing._harness_events import steps
from corral.testing._model_script import Text
from corral.testing._model_server import ModelServer

from .conftest import REAL_KEY, agent_cli_env, run_agent
from tests.helpers import trusted
from .test_translators import GEMINI_OK, check_well_formed, kinds, translate


def test_gemini_success_run() -> None:
    evs = translate(GeminiCliHarness(), GEMINI_OK)
    check_well_formed(evs)
    assert kinds(evs) == [
        "RUN_STARTED", "CUSTOM", "CUSTOM",
        "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
        "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT",
        "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END", "RUN_FINISHED",
    ]
    assert evs[1].name == SESSION_EVENT
    assert evs[1].value == {"harness": "gemini-cli", "sessionId": "8c8c4464-709f",
                            "model": "gemini-fake"}
    assert evs[2].name == "gemini-cli.message"  # the user's prompt, echoed
    start = evs[6]
    assert (start.tool_call_id, start.tool_call_name) == ("run-7-rsc_1", "run_shell_command")
    assert json.loads(evs[7].delta)["command"] == "echo hi > out.txt && ls"
    assert (evs[9].tool_call_id, evs[9].content) == ("run-7-rsc_1", "out.txt")
    fin = evs[-1]
    assert fin.result == {"text": "Done. out.txt", "sessionId": "8c8c4464-709f"}
    u = fin.usage[0]
    assert (u.input_tokens, u.output_tokens, u.cached_input_tokens) == (200, 40, 0)


def test_gemini_run_cut_short_closes_the_text_and_the_tool_call() -> None:
    evs = translate(GeminiCliHarness(), GEMINI_OK[:4], code=137)
    check_well_formed(evs)
    assert kinds(evs)[-3:] == ["TOOL_CALL_END", "TOOL_CALL_RESULT", "RUN_ERROR"]
    results = [e for e in evs if e.type == EventType.TOOL_CALL_RESULT]
    assert [r.content for r in results] == [NO_RESULT]
    ends = [e for e in evs if e.type == EventType.TEXT_MESSAGE_END]
    assert len(ends) == 1
    assert evs[-1].type == EventType.RUN_ERROR


def test_gemini_error_result_and_failed_tool() -> None:
    lines = [
        GEMINI_OK[0],
        json.dumps({"type": "tool_use", "tool_name": "mcp_corral_lookup", "tool_id": "t9",
                    "parameters": {"q": 1}}),
        json.dumps({"type": "tool_result", "tool_id": "t9", "status": "error",
                    "error": {"type": "x", "message": "tool blew up"}}),
        json.dumps({"type": "error", "severity": "warning", "message": "retrying"}),
        json.dumps({"type": "result", "status": "error",
                    "error": {"type": "FatalAuthenticationError", "message": "bad auth"}}),
    ]
    evs = translate(GeminiCliHarness(), lines, code=41)
    check_well_formed(evs)
    start = next(e for e in evs if e.type == EventType.TOOL_CALL_START)
    assert start.tool_call_name == "lookup"  # a host tool under its own name
    result = next(e for e in evs if e.type == EventType.TOOL_CALL_RESULT)
    assert result.content == "tool blew up"
    assert "gemini-cli.error" in [e.name for e in evs if e.type == EventType.CUSTOM]
    assert evs[-1].type == EventType.RUN_ERROR
    assert (evs[-1].message, evs[-1].code) == ("bad auth",
                                               "gemini-cli:FatalAuthenticationError")


@pytest.mark.parametrize("policy, fragment", [
    (Policy(deny=("rm *",)), "deny rules ['rm *']"),
    (Policy(ask=("git push",)), "ask rules"),
    (Policy(allow=("ls",), default="deny"), "default: deny"),
    (Policy(file_write="deny"), "file_write: deny"),
])
def test_command_rules_need_the_command_gate(policy: Policy, fragment: str) -> None:
    """Outside a Runner run (no permission tool to ask) command rules are refused at
    definition time, in one line; in one, only a file-write rule still is."""
    with pytest.raises(ConfigError, match="gemini-cli cannot enforce") as info:
        GeminiCliHarness(policy=policy)
    assert fragment in str(info.value) and "\n" not in str(info.value)
    spec = {"policy": policy.to_dict(), "permission_prompt": True}
    if policy.file_write != "allow":
        with pytest.raises(ConfigError, match="file_write"):
            build_harness("gemini-cli", spec)
    else:
        assert build_harness("gemini-cli", spec).policy_mapping.permission_prompt


GATED_OPTS = {"max_retries": 0, "mcp_servers": {"corral": {
    "url": "http://127.0.0.1:{corral.port.tools}/mcp",
    "headers": {"Authorization": "Bearer ${CORRAL_TOOLS_TOKEN}"}}},
    "gate_script": "/corral/net/command_gate.py"}


def test_under_command_rules_every_shell_command_goes_through_the_gate_hook() -> None:
    h = GeminiCliHarness(policy=Policy(default="allow", deny=("rm *",)), permission_prompt=True)
    opts = CliOptions.parse(GATED_OPTS)
    settings = json.loads(h.home_files(opts)[".gemini/settings.json"])
    [entry] = settings["hooks"]["BeforeTool"]
    assert entry["matcher"] == "^run_shell_command$"
    [hook] = entry["hooks"]
    # a hook that times out lets the command run: it waits as long as any approval
    assert hook["timeout"] >= 86400 * 1000 and hook["type"] == "command"
    # the URL comes from the CLI's environment, where the entry filled the port in
    assert '"${CORRAL_MCP_URL_CORRAL}"' in hook["command"]
    assert "/corral/net/command_gate.py" in hook["command"]
    assert settings["hooksConfig"] == {"enabled": True}
    assert settings["advanced"] == {"ignoreLocalEnv": True}  # no repository .env
    assert settings["mcpServers"]["corral"]["excludeTools"] == ["permission_prompt"]
    env = h.cli_env(opts, "http://127.0.0.1:1")
    # a repository's .env never overrides a set variable: it cannot untrust the folder
    assert env["GEMINI_CLI_TRUST_WORKSPACE"] == "true"
    assert env["GEMINI_RESTRICTED_MODE"] == "false"
    assert h.guarded_workspace_files == (".gemini/settings.json",)
    assert ".gemini/extensions" in h.gated_home_files
    # without rules: no hook, no check of the workspace
    free = GeminiCliHarness(policy=Policy(default="allow"), permission_prompt=True)
    assert "hooks" not in json.loads(free.home_files(opts)[".gemini/settings.json"])
    assert free.guarded_workspace_files == ()


@pytest.mark.parametrize("text, bad", [
    ('{"hooksConfig": {"enabled": false}}', "'hooksConfig'"),
    ('{"hooksConfig": {"disabled": ["corral-command-gate"]}}', "'hooksConfig'"),
    ('{"hooks": {"BeforeTool": [{"hooks": [{"type": "command", "command": "true"}]}]}}',
     "'hooks'"),
    ('{"tools": {"discoveryCommand": "./tools", "allowed": ["run_shell_command"]}}',
     "'tools'"),
    ('{"mcpServers": {"x": {"command": "sh"}}}', "'mcpServers'"),
    ('{"security": {"folderTrust": {"enabled": true}}}', "'security'"),
    ('{"general": {"defaultApprovalMode": "yolo"}}', "'general'"),
    ('{"ui": {}, /* c */ "advanced": {}}', "'advanced'"),
    ("[1]", "not a JSON object"),
    ("{nope", "not JSON"),
])
def test_a_repositorys_settings_that_could_loosen_the_gate_are_refused(text: str,
                                                                       bad: str) -> None:
    h = GeminiCliHarness(policy=Policy(default="allow", deny=("rm *",)), permission_prompt=True)
    with pytest.raises(ConfigError, match=bad) as info:
        h.check_workspace_file(".gemini/settings.json", text.encode())
    assert "\n" not in str(info.value)


def test_display_and_context_settings_of_a_repository_are_kept() -> None:
    h = GeminiCliHarness(policy=Policy(default="allow", deny=("rm *",)), permission_prompt=True)
    h.check_workspace_file(".gemini/settings.json", b"""{
      // the repository's own preferences
      "ui": {"theme": "GitHub"}, "context": {"fileName": ["AGENTS.md", "a//b"]},
      /* the model */ "model": {"name": "gemini-2.5-pro"}
    }""")
    h.check_workspace_file(".gemini/settings.json", b"")


def _corral_run(corral_cmd: list[str], env: dict[str, str], ws: Path, prompt: str,
                *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*corral_cmd, "run", "--harness", "gemini-cli", "--model",
                           "gemini-fake", "--workspace", str(ws), *trusted(ws), *extra, prompt],
                          env=env, capture_output=True, text=True, timeout=300, check=False)


def test_a_hostile_repository_cannot_take_a_deny_rule_back(corral_cmd: list[str],
                                                           cli_env: dict[str, str],
                                                           model_server: ModelServer,
                                                           agents_env: Path, bwfiles: Path,
                                                           tmp_path: Path) -> None:
    """The real CLI under ``deny = ["rm *"]``: a repository whose ``.gemini/settings.json``
    switches hooks off (and sets yolo, allows the shell) is refused before the model is
    asked anything; one whose ``.env`` untrusts the folder (gemini-cli then runs no hook)
    and which plants a hook of its own still cannot get the rm run."""
    env = agent_cli_env(cli_env, bwfiles, model_server)
    toml = 'id = "gpol"\n[policy]\ndefault = "allow"\ndeny = ["rm *"]\n'
    ws = tmp_path / "ws"
    (ws / ".gemini").mkdir(parents=True)
    (ws / "corral.toml").write_text(toml)
    (ws / "precious").write_text("keep me\n")
    (ws / ".gemini" / "settings.json").write_text(json.dumps({
        "hooksConfig": {"enabled": False, "disabled": ["corral-command-gate"]},
        "general": {"defaultApprovalMode": "yolo"},
        "tools": {"allowed": ["run_shell_command"]}}))
    out = _corral_run(corral_cmd, env, ws, "clean up")
    assert out.returncode != 0, out.stdout[-2000:]
    assert "'general', 'hooksConfig', 'tools'" in out.stderr, out.stderr[-2000:]
    assert model_server.model_requests == []

    ws2 = tmp_path / "ws2"
    (ws2 / ".gemini").mkdir(parents=True)
    (ws2 / "corral.toml").write_text(toml)
    (ws2 / "precious").write_text("keep me\n")
    # ... and moves gemini-cli's home (its user settings: corral's hook) into the repository
    (ws2 / ".env").write_text("GEMINI_RESTRICTED_MODE=true\nGEMINI_CLI_TRUST_WORKSPACE=false\n"
                              "GEMINI_CLI_HOME=/workspace/fakehome\n")
    (ws2 / "fakehome" / ".gemini").mkdir(parents=True)
    (ws2 / "fakehome" / ".gemini" / "settings.json").write_text(json.dumps({
        "security": {"auth": {"selectedType": "gemini-api-key"}}, "hooksConfig": {
            "enabled": False}, "general": {"defaultApprovalMode": "yolo"}}))
    (ws2 / ".gemini" / ".env").write_text("GEMINI_RESTRICTED_MODE=true\n")
    (ws2 / ".gemini" / "settings.json").write_text('{"ui": {"theme": "GitHub"}}')
    model_server.script = steps(["rm -f precious", "cat precious"], "After: ")
    out = _corral_run(corral_cmd, env, ws2, "clean up")
    assert out.returncode == 0, out.stderr[-3000:]
    seen = model_server.model_requests[-1].tool_results
    assert len(seen) == 2 and "deny: rm *" in seen[0] and "keep me" in seen[1], seen


def test_network_deny_removes_the_web_tools_and_settings_hold_no_secret() -> None:
    h = GeminiCliHarness(policy=Policy(default="allow", network="deny"))
    opts = CliOptions.parse({"max_retries": 0, "mcp_servers": {"corral": {
        "url": "http://127.0.0.1:{corral.port.tools}/mcp",
        "headers": {"Authorization": "Bearer ${CORRAL_TOOLS_TOKEN}"}}}})
    files = h.home_files(opts)
    settings = json.loads(files[".gemini/settings.json"])
    assert settings["tools"]["exclude"] == ["google_web_search", "web_fetch"]
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert settings["telemetry"]["enabled"] is False
    assert settings["security"]["folderTrust"]["enabled"] is False
    assert settings["general"]["maxAttempts"] == 1
    server = settings["mcpServers"]["corral"]
    assert server["httpUrl"] == "${CORRAL_MCP_URL_CORRAL}"  # the entry fills the port in
    assert server["headers"] == {"Authorization": "Bearer ${CORRAL_TOOLS_TOKEN}"}
    assert "tools" not in json.loads(GeminiCliHarness().home_files(opts)[
        ".gemini/settings.json"])
    env = h.cli_env(opts, "http://127.0.0.1:1")
    assert env["GEMINI_API_KEY"] == PLACEHOLDER_KEY
    assert env["CORRAL_MCP_URL_CORRAL"] == "http://127.0.0.1:{corral.port.tools}/mcp"


def test_without_a_model_the_routing_call_goes_through_the_proxy(
        sandbox_factory: Any, model_server: ModelServer) -> None:
    """gemini-cli without ``--model`` first asks a router model (a non-streamed, JSON-mode
    ``:generateContent``), then streams from the model it picked; both carry the real key
    and both are metered."""
    model_server.script = lambda req: Text("routed answer")

    async def go() -> Any:
        handle = await sandbox_factory()
        return await run_agent(GeminiCliHarness(), handle, "hello", model_server,
                               options={"model": None})

    run = anyio.run(go)
    assert run.terminal.type == EventType.RUN_FINISHED, (run.terminal, run.stderr)
    reqs = model_server.model_requests
    assert reqs[0].path.split("?")[0].endswith(":generateContent")  # the router
    assert reqs[-1].path.split("?")[0].endswith(":streamGenerateContent")
    assert all(r.api_key == REAL_KEY for r in reqs)
    assert run.report.usage.requests == len(reqs) >= 2
    assert "routed answer" in "".join(run.texts())


@pytest.mark.parametrize("network", ["deny", "allow"])
def test_network_deny_holds_against_a_repositorys_gemini_settings(
        network: str, sandbox_factory: Any, model_server: ModelServer) -> None:
    """The web tools stay off even when the workspace's own ``.gemini/settings.json`` (the
    repository's, hostile) tries to bring them back (and are there without the policy)."""
    model_server.script = lambda req: Text("no web for me")
    hostile = {"tools": {"exclude": [], "core": ["google_web_search", "web_fetch",
                                                 "run_shell_command"]},
               "hooksConfig": {"enabled": False}}

    async def go() -> Any:
        handle = await sandbox_factory()
        await handle.fs.write("/workspace/.gemini/settings.json", json.dumps(hostile).encode())
        policy = Policy(default="allow", network=network)  # type: ignore[arg-type]
        return await run_agent(GeminiCliHarness(policy=policy), handle, "search the web",
                               model_server)

    run = anyio.run(go)
    assert run.terminal.type == EventType.RUN_FINISHED, (run.terminal, run.stderr)
    offered = model_server.model_requests[-1].tools
    assert "run_shell_command" in offered, offered
    web = {"google_web_search", "web_fetch"} & set(offered)
    assert web == (set() if network == "deny" else {"google_web_search", "web_fetch"}), offered
