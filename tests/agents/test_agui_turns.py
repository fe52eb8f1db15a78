"""One durable corral run across several AG-UI runs, driven by the official client's
``HttpAgent`` (tests/server/e2e/agui_turns.mjs) against the real Claude Code CLI and the
scripted model server:

* a frontend tool the client declares is offered to the agent; its call ends the client's
  AG-UI run (``pendingToolCallIds``), the client runs it and sends the result in a ``tool``
  message, and the same corral run goes on with the agent holding that result;
* an ``ask`` of the operator's policy ends the AG-UI run with an interrupt; the client's
  resume entry allows or denies, and the same corral run goes on;
* after every AG-UI run the script replays its input (the same events) and reconnects
  from its middle event (``Last-Event-ID``): nothing lost or repeated, verified.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from corral.testing._model_script import ModelRequest, Reply, Text
from corral.testing._model_server import ModelServer
from corral.testing._model_script import ToolCall, shell_then_text
from corral.testing import wait_until
from tests.server.conftest import TOKEN, Home

from .conftest import REAL_KEY, agent_cli_env

pytestmark = pytest.mark.timeout(300)

PICK = {"name": "pick_color", "description": "Ask the user to pick a color.",
        "parameters": {"type": "object", "properties": {"question": {"type": "string"}},
                       "required": ["question"]}}


def run_turns(e2e: Path, url: str, thread_id: str, prompt: str, props: dict[str, Any],
              plan: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    done = subprocess.run(
        ["node", str(e2e / "agui_turns.mjs"), url, TOKEN, thread_id, prompt,
         json.dumps(props), json.dumps(plan)],
        capture_output=True, text=True, timeout=240, cwd=e2e)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines and lines[-1].startswith("RESULT "), (
        done.stdout[-3000:] + done.stderr[-3000:])
    turns = [json.loads(line[len("TURN "):]) for line in lines if line.startswith("TURN ")]
    return turns, json.loads(lines[-1][len("RESULT "):])


def home_for(corral_home: Path, cli_env: dict[str, str], bwfiles: Path,
             model_server: ModelServer) -> Home:
    home = Home(corral_home)
    home.env.update({k: v for k, v in agent_cli_env(cli_env, bwfiles, model_server).items()
                     if k.startswith(("CORRAL_AGENTS", "CORRAL_BWRAP", "ANTHROPIC_"))})
    return home


def ask_the_client(req: ModelRequest) -> Reply:
    results = req.tool_results
    if results:
        # slow, so the client's dropped connection resumes while the run still streams
        return Text("The client said: " + "\n".join(results).strip(), delay=0.05)
    if "mcp__corral__pick_color" not in req.tools:
        return Text(f"NO FRONTEND TOOL offered; tools: {req.tools}")
    return ToolCall("", tool="mcp__corral__pick_color", args={"question": "which color?"},
                    text="Let me ask.")


def assert_reconnects(turns: list[dict[str, Any]]) -> None:
    for turn in turns:
        assert turn["replayOk"] and turn["tailOk"], turn
        assert turn["tailLength"] > 0, turn  # the reconnect was in the middle, not the end
        # HttpAgent's own connection dropped after 3 events and resumed after the third
        assert turn["droppedAt"] is not None, turn
        types = [e["type"] for e in turn["events"]]
        assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED", types
        assert {turn["events"][0]["runId"], turn["events"][-1]["runId"]} == {turn["runId"]}


def test_a_frontend_tool_round_trips_through_http_agent(
        agents_env: Path, bwrap: object, cli_env: dict[str, str], bwfiles: Path,
        corral_home: Path, model_server: ModelServer, e2e: Path) -> None:
    model_server.script = ask_the_client
    home = home_for(corral_home, cli_env, bwfiles, model_server)
    with home.server(token=TOKEN) as server:
        turns, result = run_turns(
            e2e, f"{server.url}/v1/agui", "agui-fe", "ask me for a color",
            {"corral": {"harness": "claude-code"}},
            {"tools": [PICK], "results": {"pick_color": "teal-42"}})
        runs = server.client().get("/v1/runs", params={"thread_id": "agui-fe"}).json()["runs"]
    # two AG-UI runs, one durable corral run (the first AG-UI run's id)
    assert len(turns) == 2 and [r["run_id"] for r in runs] == [turns[0]["runId"]], runs
    assert runs[0]["status"] == "completed", runs
    assert_reconnects(turns)
    first = turns[0]
    starts = [e for e in first["events"] if e["type"] == "TOOL_CALL_START"]
    assert [s["toolCallName"] for s in starts] == ["pick_color"]
    assert first["outcome"]["outcome"] == "success"
    assert first["outcome"]["pendingToolCallIds"] == [starts[0]["toolCallId"]]
    # the agent received the client's value, and said so in the second AG-UI run
    assert any("teal-42" in r for m in model_server.model_requests for r in m.tool_results)
    said = "".join(e.get("delta", "") for e in turns[1]["events"]
                   if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert "The client said: teal-42" in said, said
    # the client's own tool message holds the result: the agent's copy is not repeated
    assert not [e for e in turns[1]["events"] if e["type"] == "TOOL_CALL_RESULT"]
    tool_messages = [m for m in result["messages"] if m["role"] == "tool"]
    assert [m["toolCallId"] for m in tool_messages] == [starts[0]["toolCallId"]]
    assert all(r.api_key == REAL_KEY for r in model_server.model_requests)


@pytest.mark.parametrize(("answer", "expect"), [
    ({"decision": "allow"}, "Result: approved-ran"),
    ({"decision": "deny", "reason": "not today"}, "denied by a human: not today"),
], ids=["allow", "deny"])
def test_an_approval_is_an_interrupt_the_client_resumes(
        answer: dict[str, Any], expect: str, agents_env: Path, bwrap: object,
        cli_env: dict[str, str], bwfiles: Path, corral_home: Path,
        model_server: ModelServer, e2e: Path, tmp_path: Path) -> None:
    model_server.script = shell_then_text("echo approved-ran", "Result: {output}")
    config = tmp_path / "serve.toml"
    config.write_text('default_sandbox = "gated"\n[sandboxes.gated]\nprovider = "bubblewrap"\n'
                      '[sandboxes.gated.policy]\nask = ["echo *"]\ndefault = "deny"\n')
    home = home_for(corral_home, cli_env, bwfiles, model_server)
    with home.server("--config", str(config), token=TOKEN) as server:
        turns, _result = run_turns(
            e2e, f"{server.url}/v1/agui", "agui-ask", "run echo",
            {"corral": {"harness": "claude-code"}}, {"approvals": [answer]})
        run_id = turns[0]["runId"]
        record = server.run(run_id)
        log = home.log(run_id)
    assert len(turns) == 2 and record["status"] == "completed", (turns, record)
    assert_reconnects(turns)
    outcome = turns[0]["outcome"]
    assert outcome["outcome"] == "interrupt" and len(outcome["interrupts"]) == 1, outcome
    interrupt = outcome["interrupts"][0]
    assert interrupt["metadata"]["tool"] == "Bash"
    assert interrupt["metadata"]["args"]["command"] == "echo approved-ran"
    # the interrupt names the agent's own tool call, which the client saw start
    starts = [e["toolCallId"] for e in turns[0]["events"] if e["type"] == "TOOL_CALL_START"]
    assert interrupt["toolCallId"] in starts
    resolved = [e["value"] for e in log if e["type"] == "CUSTOM"
                and e["name"] == "corral.approval_resolved"]
    assert [(r["approvalId"], r["decision"]) for r in resolved] == [
        (interrupt["id"], answer["decision"])]
    said = "".join(e.get("delta", "") for e in turns[1]["events"]
                   if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert expect in said, said


def sse_events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[len("data: "):]) for line in text.splitlines()
            if line.startswith("data: ")]


def test_an_unanswered_frontend_call_ends_with_the_runs_timeout(
        agents_env: Path, bwrap: object, cli_env: dict[str, str], bwfiles: Path,
        corral_home: Path, model_server: ModelServer) -> None:
    """Nobody answers: the run's own timeout stops the agent, the run fails, and a client
    that answers late is shown the rest of that AG-UI run, ending in RUN_ERROR."""
    model_server.script = ask_the_client
    home = home_for(corral_home, cli_env, bwfiles, model_server)
    user = {"id": "u", "role": "user", "content": "ask me for a color"}
    body = {"threadId": "agui-late", "runId": "agui-late-1", "messages": [user],
            "tools": [PICK], "context": [], "state": {},
            "forwardedProps": {"corral": {"harness": "claude-code", "timeout": 8}}}
    with home.server(token=TOKEN) as server, server.client() as c:
        first = sse_events(c.post("/v1/agui", json=body).text)
        assert first[-1]["type"] == "RUN_FINISHED", first
        (call_id,) = first[-1]["outcome"]["pendingToolCallIds"]
        wait_until(lambda: server.run("agui-late-1")["status"] not in ("running", "pending"),
                   "the run's timeout", timeout=120)
        late = {**body, "runId": "agui-late-2",
                "messages": [user, {"id": "t", "role": "tool", "toolCallId": call_id,
                                    "content": "too late"}]}
        second = sse_events(c.post("/v1/agui", json=late).text)
        record = server.run("agui-late-1")
        log = home.log("agui-late-1")
    assert record["status"] == "failed", record
    assert second[0] == {"type": "RUN_STARTED", "threadId": "agui-late",
                         "runId": "agui-late-2"}, second
    assert second[-1]["type"] == "RUN_ERROR" and second[-1]["code"] == "timeout", second[-1]
    assert "timeout of 8s" in second[-1]["message"]
    # the call ended with the run (no answer was taken), and the late one reached nobody
    assert not [e for e in log if e["type"] == "CUSTOM"
                and e["name"] == "corral.frontend_call_resolved"]
    assert not any("too late" in r for m in model_server.model_requests
                   for r in m.tool_results)
