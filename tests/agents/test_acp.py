"""`--harness acp --agent opencode`: the real `opencode acp` (opencode-ai, pinned) in
bubblewrap, driven by corral's host-side ACP bridge, against the scripted model server on
127.0.0.1 (Anthropic Messages through the model proxy, which holds the real key)."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest
from ag_ui.core import EventType

from corral.agents._installs import InstalledAgent, install_agent
from corral.harness._acp import AcpHarness
from corral.net._model_proxy import Upstream
from corral.testing import wait_until
from corral.testing._leaks import assert_no_secrets
from corral.testing._model_script import ModelRequest, Reply, Text, ToolCall
from corral.testing._model_server import ModelServer
from corral.tools._approvals import APPROVAL_REQUEST_EVENT

from corral.testing._harness_world import normalized

from .conftest import REAL_KEY, agent_cache, assert_key_outside, run_agent
from tests.helpers import trusted

from .host_tools_flow import check_host_tool_round_trip, host_tool_script
from .test_runner_agents import (  # noqa: F401 - the corral fixture
    Corral,
    corral,
    ndjson,
    texts,
)

pytestmark = [pytest.mark.timeout(300)]


@pytest.fixture(scope="session")
def opencode_install() -> InstalledAgent:
    return install_agent("opencode", root=agent_cache())


@pytest.fixture
def sandbox(opencode_install: InstalledAgent, sandbox_factory: Any) -> Any:
    return sandbox_factory


def check_tool_events(events: list[Any]) -> None:
    """Every tool call has START, END and exactly one RESULT."""
    starts = [e.tool_call_id for e in events if e.type == EventType.TOOL_CALL_START]
    ends = [e.tool_call_id for e in events if e.type == EventType.TOOL_CALL_END]
    results = [e.tool_call_id for e in events if e.type == EventType.TOOL_CALL_RESULT]
    assert sorted(starts) == sorted(ends) == sorted(results), (starts, ends, results)


def shell_script(command: str) -> Any:
    def script(req: ModelRequest) -> Reply:
        if req.tool_results:
            return Text("Done. Output: " + "\n".join(req.tool_results).strip())
        if req.shell_tool is None:
            return Text("a title")  # opencode's tool-less title request
        return ToolCall(command, text="I'll run a command.")
    return script


def upstream(srv: ModelServer) -> Upstream:
    return Upstream("anthropic", srv.url, REAL_KEY)


def test_a_shell_tool_call_round_trip_and_the_key_stays_on_the_host(
        sandbox: Any, model_server: ModelServer) -> None:
    # the bridge lives outside the sandbox: no process in it sees the bridge
    model_server.script = shell_script(
        "echo hi > out.txt && ls; env | grep -i key; echo bridge-seen=$(cat /proc/[0-9]*/cmdline"
        " 2>/dev/null | tr '\\0' ' ' | grep -c 'acp[_]client')")
    harness = AcpHarness(agent="opencode", model="anthropic/claude-fake")

    async def go() -> Any:
        handle = await sandbox()
        return await run_agent(harness, handle, "make out.txt", model_server,
                               upstream=upstream(model_server)), handle

    run, handle = anyio.run(go)
    journal = run.paths.journal.read_text(errors="replace")
    assert run.terminal.type == EventType.RUN_FINISHED, (run.terminal, run.stderr[-2000:],
                                                          journal[-3000:])
    starts = run.of(EventType.TOOL_CALL_START)
    assert [s.tool_call_name for s in starts] == ["shell"], journal[-3000:]
    check_tool_events(run.events)
    (out,) = run.tool_results()
    assert out.startswith("out.txt\n"), out
    assert run.prepared.proxy_token in out and REAL_KEY not in out
    assert "bridge-seen=0" in out, out
    assert "Done. Output: out.txt" in "".join(run.texts())
    assert all(r.api_key == REAL_KEY for r in model_server.model_requests)
    assert all(REAL_KEY not in json.dumps(e.model_dump(mode="json")) for e in run.events)
    assert REAL_KEY not in journal
    assert_key_outside(handle, run)
    sessions = [e for e in run.of(EventType.CUSTOM) if e.name == "corral.session"]
    assert sessions and sessions[0].value["harness"] == "acp"
    assert run.report.session_id == sessions[0].value["sessionId"]


ACP = ["--harness", "acp", "--agent", "opencode", "--model", "anthropic/claude-fake"]


def acp_run(c: Corral, run_id: str, prompt: str, *extra: str) -> Any:
    return c.run("run", *ACP, "--run-id", run_id, "--json", *extra, prompt)


def policy_workspace(tmp_path: Path, name: str, policy: str) -> Path:
    ws = tmp_path / name
    ws.mkdir()
    (ws / "corral.toml").write_text(f'id = "{name}"\n[policy]\n{policy}\n')
    # A repository's own opencode configuration must not loosen corral's policy.
    (ws / "opencode.json").write_text(json.dumps({"permission": {"bash": "allow"}}))
    (ws / ".opencode").mkdir()
    (ws / ".opencode" / "opencode.json").write_text(
        json.dumps({"permission": {"bash": "allow"}}))
    return ws


def one_command(command: str) -> Any:
    def script(req: ModelRequest) -> Reply:
        if req.tool_results:
            return Text("after: " + "\n".join(req.tool_results))
        if req.shell_tool is None:
            return Text("title")
        return ToolCall(command, text="running")
    return script


def results(events: list[dict[str, Any]]) -> list[str]:
    return [e["content"] for e in events if e["type"] == "TOOL_CALL_RESULT"]


def customs(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e["value"] for e in events if e["type"] == "CUSTOM" and e["name"] == name]


def test_a_denied_command_never_runs_whatever_the_repository_configures(
        opencode_install: InstalledAgent, corral: Corral, tmp_path: Path) -> None:  # noqa: F811
    ws = policy_workspace(tmp_path, "deny", 'default = "allow"\ndeny = ["rm *"]')
    (ws / "precious").write_text("keep me")
    corral.srv.script = one_command("rm -f precious")
    out = acp_run(corral, "d1", "clean up", "--workspace", str(ws), *trusted(ws))
    assert out.returncode == 0, out.stderr[-3000:]
    events = corral.log("d1")
    assert events[-1]["type"] == "RUN_FINISHED", events[-3:]
    (result,) = results(events)
    assert result.startswith("denied: denied by corral policy"), result
    assert "rm *" in result
    assert "after:" in texts(events)  # the model was told and the turn went on
    spec = corral.raw_record("d1")["spec"]
    assert spec["permission_prompt"] is True and spec["harness_options"]["agent"] == "opencode"
    # the sandbox's copy of the workspace still has the file: ask the agent's own shell
    corral.srv.script = one_command("cat precious")
    out = acp_run(corral, "d2", "show it", "--workspace", str(ws), *trusted(ws))
    assert out.returncode == 0, out.stderr[-3000:]
    (shown,) = results(corral.log("d2"))
    assert "keep me" in shown, shown


def test_allowed_commands_run_asked_for_each(
        opencode_install: InstalledAgent, corral: Corral, tmp_path: Path) -> None:  # noqa: F811
    ws = policy_workspace(tmp_path, "allow", 'default = "deny"\nallow = ["echo *"]')
    corral.srv.script = one_command("echo allowed-ran")
    out = acp_run(corral, "a1", "say it", "--workspace", str(ws), *trusted(ws))
    assert out.returncode == 0, out.stderr[-3000:]
    events = corral.log("a1")
    assert events[-1]["type"] == "RUN_FINISHED", events[-3:]
    (result,) = results(events)
    assert "allowed-ran" in result
    # default deny: anything else is refused (opencode asked about this one too)
    corral.srv.script = one_command("touch made-it")
    assert acp_run(corral, "a2", "touch", "--workspace", str(ws), *trusted(ws)).returncode == 0
    (result,) = results(corral.log("a2"))
    assert result.startswith("denied: ") and "default" in result, result


def approve_when_asked(corral: Corral, run_id: str,  # noqa: F811 - not the fixture
                       allow: bool) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def asked() -> bool:
        try:
            found[:] = customs(corral.log(run_id), APPROVAL_REQUEST_EVENT)
        except sqlite3.OperationalError:  # the store is not made yet
            return False
        return bool(found)

    wait_until(asked, "the approval request", timeout=90)
    out = corral.run("approve", run_id, found[0]["approvalId"],
                     "--allow" if allow else "--deny")
    assert out.returncode == 0, out.stderr
    return found[0]


def _normal(events: list[dict[str, Any]], run_id: str) -> list[str]:
    return [re.sub(r'"(approvalId|expiresAt)": [^,}]+', r'"\1": "*"',
                   re.sub(r"(prt|ses|msg)_[A-Za-z0-9]+", r"\1_*", e))
            for e in normalized(events, run_id)]


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["killed", "detached"])
def test_the_driver_goes_while_an_approval_is_pending(
        opencode_install: InstalledAgent, corral: Corral, tmp_path: Path,  # noqa: F811
        stop: signal.Signals) -> None:
    """The bridge outlives the driver (SIGKILLed, or detaching on SIGTERM) with the
    permission request open; the approval is answered with no driver; the successor
    (attach) serves the run's tool socket again, the bridge asks again and gets the stored
    answer: the log equals an uninterrupted run's."""
    ws = policy_workspace(tmp_path, "askk", 'default = "deny"\nask = ["echo *"]')
    corral.srv.script = one_command("echo approved-ran")
    proc = corral.popen("run", *ACP, "--run-id", "ref", "--json", "--workspace", str(ws),
                        "say it")
    approve_when_asked(corral, "ref", True)
    proc.communicate(timeout=120)
    reference = corral.log("ref")
    assert reference[-1]["type"] == "RUN_FINISHED"

    proc = corral.popen("run", *ACP, "--run-id", "k2", "--json", "--workspace", str(ws),
                        "say it")
    found: list[dict[str, Any]] = []
    def asked() -> bool:
        found[:] = customs(corral.log("k2"), APPROVAL_REQUEST_EVENT)
        return bool(found)

    wait_until(asked, "the approval request", timeout=90)
    proc.send_signal(stop)
    proc.communicate(timeout=60)
    assert corral.raw_record("k2")["status"] == "running"
    out = corral.run("approve", "k2", found[0]["approvalId"], "--allow")
    assert out.returncode == 0, out.stderr
    att = corral.run("attach", "k2", "--json")
    assert att.returncode == 0, att.stderr[-3000:]
    log = corral.log("k2")
    assert [p["event"] for p in ndjson(att.stdout)] == log
    assert "approved-ran" in results(log)[0]
    assert len(customs(log, APPROVAL_REQUEST_EVENT)) == 1
    assert _normal(log, "k2") == _normal(reference, "ref")


def test_host_tools_reach_the_agent_as_mcp_servers_in_session_new(
        opencode_install: InstalledAgent, bwrap: Any, host_env: ModelServer,
        corral_home: Path, tmp_path: Path) -> None:
    def offered(req: ModelRequest, name: str, args: dict[str, Any]) -> ToolCall | None:
        return ToolCall("", tool=f"corral_{name}", args=args) \
            if f"corral_{name}" in req.tools else None

    def call_then_answer(name: str, args: dict[str, Any]) -> Any:
        inner = host_tool_script(offered)(name, args)
        return lambda req: Text("a title") if not req.tools else inner(req)

    check_host_tool_round_trip(
        harness="acp", options={"agent": "opencode", "model": "anthropic/claude-fake"},
        host_env=host_env, corral_home=corral_home, tmp_path=tmp_path,
        call_then_answer=call_then_answer)
    # the tools token reached the agent on the wire only: the journal names the variable
    journals = [p for p in corral_home.rglob("*") if p.is_file() and b'"acp":"send"' in
                p.read_bytes()]
    assert journals
    for path in journals:
        assert b"Bearer ${CORRAL_TOOLS_TOKEN}" in path.read_bytes()


def test_a_second_prompt_on_the_thread_loads_the_session_in_a_fresh_sandbox(
        opencode_install: InstalledAgent, corral: Corral) -> None:  # noqa: F811
    def script(req: ModelRequest) -> Reply:
        if not req.tools:
            return Text("title")
        return Text("second answer" if "second" in req.last_user_text else "FIRST-ANSWER-42")

    corral.srv.script = script
    first = acp_run(corral, "r1", "first prompt XYZZY-7", "--thread", "T")
    assert first.returncode == 0, first.stderr[-3000:]
    second = acp_run(corral, "r2", "second prompt", "--thread", "T")
    assert second.returncode == 0, second.stderr[-3000:]
    assert corral.raw_record("r1")["sandbox_ref"]["id"] != \
        corral.raw_record("r2")["sandbox_ref"]["id"]  # the first sandbox is gone
    last = [r for r in corral.srv.model_requests if r.tools][-1]
    assert "second prompt" in last.last_user_text
    history = "\n".join(last.texts)
    assert "first prompt XYZZY-7" in history and "FIRST-ANSWER-42" in history
    sessions = [e["value"]["sessionId"] for r in ("r1", "r2") for e in corral.log(r)
                if e["type"] == "CUSTOM" and e["name"] == "corral.session"]
    assert len(sessions) == 2 and sessions[0] == sessions[1]
    # the history the agent replays on session/load is not this run's events
    log2 = corral.log("r2")
    assert "FIRST-ANSWER-42" not in texts(log2) and texts(log2) == "second answer"


def test_agent_command_runs_any_acp_agent_and_refuses_a_policy(
        corral: Corral, tmp_path: Path) -> None:  # noqa: F811
    """``--agent-command``: the scripted hostile agent from the workspace, in bubblewrap,
    through the whole Runner; no policy (all its permission requests are allowed). With
    a policy: one line at definition time, nothing recorded."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "agent.py").write_bytes(
        (Path(__file__).with_name("fake_acp_agent.py")).read_bytes())
    command = "python3 /workspace/agent.py edges 1000"
    out = corral.run("run", "--harness", "acp", "--agent-command", command, "--run-id", "x1",
                     "--json", "--workspace", str(ws), "go")
    assert out.returncode == 0, out.stderr[-3000:]
    events = corral.log("x1")
    assert events[-1]["type"] == "RUN_FINISHED", events[-3:]
    said = texts(events)
    assert "fs: -32601" in said and "c1: yes" in said and "c2: yes" in said
    assert results(events) == ["ran"] * 4
    # the same from corral.toml's [agent] table
    (ws / "corral.toml").write_text(
        f'id = "cmd"\n[agent]\nharness = "acp"\nagent_command = "{command}"\n')
    # found in the workspace: the repository's file cannot choose an agent run itself
    out = corral.run("run", "--run-id", "x2", "--json", "--workspace", str(ws), "go")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "--harness acp" in out.stderr and "--config" in out.stderr
    out = corral.run("run", "--run-id", "x2", "--json", "--config", str(ws / "corral.toml"),
                     "--workspace", str(ws), "go")
    assert out.returncode == 0, out.stderr[-3000:]
    assert corral.raw_record("x2")["harness"] == "acp"
    assert results(corral.log("x2")) == ["ran"] * 4
    (ws / "corral.toml").write_text('id = "cmd"\n[agent]\nharnes = "acp"\n')
    out = corral.run("run", "--workspace", str(ws), "go")
    assert out.returncode == 2 and "[agent] has no key 'harnes'" in out.stderr, out.stderr
    pol = policy_workspace(tmp_path, "cmdpol", 'default = "allow"\ndeny = ["rm *"]')
    out = corral.run("run", "--harness", "acp", "--agent-command", command, "--workspace",
                     str(pol), *trusted(pol), "go")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "--agent-command" in out.stderr and "policy" in out.stderr
    out = corral.run("run", "--harness", "opencode", "--agent", "opencode", "go")
    assert out.returncode == 2 and "--harness acp" in out.stderr, out.stderr
    out = corral.run("run", "--harness", "acp", "--agent", "nope", "go")
    assert out.returncode == 2 and "unknown ACP agent 'nope'" in out.stderr, out.stderr
    out = corral.run("run", "--harness", "acp", "--provider", "docker", "--agent",
                     "opencode", "go")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "docker provider runs the supervisor in the sandbox" in out.stderr


def test_the_local_provider_runs_the_agent_from_its_host_install(
        opencode_install: InstalledAgent, corral: Corral) -> None:  # noqa: F811
    corral.srv.script = one_command("echo local-ran")
    out = acp_run(corral, "l1", "say it", "--provider", "local")
    assert out.returncode == 0, out.stderr[-3000:]
    events = corral.log("l1")
    assert events[-1]["type"] == "RUN_FINISHED", events[-3:]
    assert "local-ran" in results(events)[0]


def test_a_secret_in_a_command_that_asks_is_redacted_in_the_request(
        opencode_install: InstalledAgent, corral: Corral, tmp_path: Path) -> None:  # noqa: F811
    """The agent writes a run secret's value into a command the policy asks about: the
    approval request (its event, the store's row) and the policy's notes carry the
    secret's name, never its value — nor does anything else corral writes."""
    secret = "sk-live-" + "7Q" * 12
    ws = policy_workspace(tmp_path, "sec", 'default = "deny"\nask = ["echo *"]')
    toml = ws / "corral.toml"
    toml.write_text(toml.read_text() + '[secrets]\nAPI_TOKEN = { env = "CORRAL_TEST_SECRET" }\n')
    corral.env = {**corral.env, "CORRAL_TEST_SECRET": secret}
    corral.srv.script = one_command(f"echo {secret}")
    proc = corral.popen("run", *ACP, "--run-id", "s1", "--json", "--workspace", str(ws),
                        "say it")
    request = approve_when_asked(corral, "s1", True)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "[REDACTED:API_TOKEN]" in json.dumps(request["args"])
    log = corral.log("s1")
    assert log[-1]["type"] == "RUN_FINISHED"
    assert secret not in out and secret not in err
    assert_no_secrets([corral.home], {"API_TOKEN": secret})
