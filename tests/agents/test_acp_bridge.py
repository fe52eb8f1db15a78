"""The ACP bridge (corral._insandbox.acp_client) against a hostile scripted agent speaking the
real wire format (tests/agents/fake_acp_agent.py), with corral's real permission prompt
(HostToolServer + PermissionPromptTool + a Policy) on a unix socket; and the translator
over arbitrary journals (hypothesis)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from ag_ui.core import EventType
from hypothesis import given, settings
from hypothesis import strategies as st

from corral._insandbox import acp_client
from corral.harness._acp import AcpTranslator
from corral.harness._base import RunContext
from corral.journal._reader import Exit, Line
from corral.policy._policy import Policy
from corral.testing import wait_until
from corral.tools._core import Toolset
from corral.tools._mcp_server import HostToolServer
from corral.tools._permission import PermissionPromptTool

FAKE = Path(__file__).with_name("fake_acp_agent.py")
TERMINAL = (EventType.RUN_FINISHED, EventType.RUN_ERROR)


def bridge(config: dict[str, Any]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-I", "-S", acp_client.__file__],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write(acp_client.encode_header(config))
    proc.stdin.close()
    proc.stdin = None  # (communicate() would flush it)
    return proc


def config(scenario: str, permission: dict[str, Any] | None, **more: Any) -> dict[str, Any]:
    return {"argv": [sys.executable, str(FAKE), scenario, "1000"],
            "env": {"PATH": os.environ["PATH"]}, "cwd": None, "prompt": "go",
            "workdir": "/workspace", "mcp_servers": [], "permission": permission,
            "max_line": 1000, **more}


def translate(journal: bytes, code: int, sig: int | None = None, **kw: Any) -> list[Any]:
    t = AcpTranslator(RunContext("run-1", "thread-1"), **kw)
    events = t.start()
    offset = 0
    for raw in journal.split(b"\n")[:-1]:
        offset += len(raw) + 1
        events += t.feed(Line(raw, offset))
    events += t.feed(Exit(code, sig, offset + 1))
    return events


def run_with_policy(policy: Policy, scenario: str = "edges", *, serve: bool = True,
                    tmp: Path) -> tuple[subprocess.CompletedProcess[bytes], bytes]:
    sock = tmp / "tools.sock"
    server = HostToolServer(Toolset([PermissionPromptTool(policy, None)]), run_id="run-1")
    permission = {"socket": str(sock), "token": server.token, "path": "/mcp",
                  "patience": 1.0}

    async def main() -> tuple[int, bytes, bytes]:
        async with anyio.create_task_group() as tg:
            if serve:
                await tg.start(server.serve, sock)
            proc = bridge(config(scenario, permission))
            out, err = await anyio.to_thread.run_sync(lambda: proc.communicate(timeout=60))
            tg.cancel_scope.cancel()
        return proc.returncode, out, err

    code, out, err = anyio.run(main)
    return subprocess.CompletedProcess([], code, out, err), out


def texts(events: list[Any]) -> str:
    return "".join(e.delta for e in events if e.type == EventType.TEXT_MESSAGE_CONTENT)


def test_a_hostile_agent_meets_the_policy_and_the_bridge_stays_up(tmp_path: Path) -> None:
    done, journal = run_with_policy(Policy(default="allow", deny=("rm *",)), tmp=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(x) for x in journal.splitlines()]  # every journal line is JSON
    notes = [x["event"] for x in lines if x["acp"] == "note"]
    assert notes.count("not-json-rpc") == 2 and "oversized-line" in notes
    events = translate(journal, 0)
    said = texts(events)
    # fs/* and terminal/*: not offered (-32601); the deny rule refused c1; c2 (an argv
    # list) was allowed, by the option's kind (allow_once), never its lying name
    assert "fs: -32601" in said and "terminal: -32601" in said
    assert "c1: no" in said and "c2: yes" in said
    assert "c3: yes" in said and "c4: yes" in said  # default allow
    starts = {e.tool_call_id: e.tool_call_name for e in events
              if e.type == EventType.TOOL_CALL_START}
    # named by kind (not the title "Read"), host tools by their own names
    assert starts == {"run-1-c1": "shell", "run-1-c2": "shell", "run-1-c3": "lookup",
                      "run-1-c4": "tool"}
    results = {e.tool_call_id: e.content for e in events
               if e.type == EventType.TOOL_CALL_RESULT}
    assert results["run-1-c1"].startswith("denied: denied by corral policy")
    assert results["run-1-c2"] == "ran"
    args = {e.tool_call_id: json.loads(e.delta) for e in events
            if e.type == EventType.TOOL_CALL_ARGS}
    assert args["run-1-c2"] == {"command": "echo hi there"}
    assert [e.type for e in events if e.type in TERMINAL] == [EventType.RUN_FINISHED]
    assert events[-1].type == EventType.RUN_FINISHED
    assert any(e.type == EventType.RAW for e in events)
    assert any(e.type == EventType.CUSTOM and e.name == "acp.plan" for e in events)


def test_default_deny_refuses_unknown_tools_but_not_corrals_host_tools(
        tmp_path: Path) -> None:
    done, journal = run_with_policy(Policy(default="deny", allow=("ls *",)), tmp=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    said = texts(translate(journal, 0))
    assert "c1: no" in said and "c2: no" in said and "c4: no" in said
    assert "c3: yes" in said  # the run's own host tools decide their approvals themselves


def test_no_driver_serving_the_permission_prompt_refuses_after_the_patience(
        tmp_path: Path) -> None:
    done, journal = run_with_policy(Policy(default="allow"), serve=False, tmp=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    said = texts(translate(journal, 0))
    assert "c1: no" in said and "c2: no" in said and "c4: no" in said  # fails closed


def test_sigterm_cancels_the_prompt_then_stops_the_agent(tmp_path: Path) -> None:
    proc = bridge(config("hang", None))
    assert proc.stdout is not None
    seen: list[bytes] = []

    def prompted() -> bool:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        seen.append(line)
        return b'"session/prompt"' in line

    wait_until(prompted, "the prompt to be sent", timeout=30)
    proc.send_signal(signal.SIGTERM)
    rest, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM, err
    journal = b"".join(seen) + rest
    assert b'"method":"session/cancel"' in journal
    events = translate(journal, 128 + signal.SIGTERM, signal.SIGTERM)
    assert "cancel seen" in texts(events)
    assert events[-1].type == EventType.RUN_ERROR and events[-1].code == "cancelled"


@pytest.mark.parametrize(("mode", "methods", "notes"), [
    ("resume", ["initialize", "session/resume", "session/prompt", "session/close"], []),
    ("resume-fails", ["initialize", "session/resume", "session/load", "session/prompt",
                      "session/close"], ["resume-failed"]),
    ("load", ["initialize", "session/load", "session/prompt"], []),
])
def test_a_thread_session_is_resumed_when_advertised_else_loaded_then_closed(
        mode: str, methods: list[str], notes: list[str]) -> None:
    """session/resume when the agent advertises it (nothing replayed); session/load when
    it does not, or when resuming fails; session/close after the prompt when advertised.
    The session's earlier history the agent replays is never this run's text."""
    proc = bridge(config(f"reopen:{mode}", None, resume="sess-old"))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    lines = [json.loads(x) for x in out.splitlines()]
    assert [x["msg"]["method"] for x in lines if x["acp"] == "send"] == methods
    assert [x["event"] for x in lines if x["acp"] == "note"] == notes
    prompt = next(x["msg"] for x in lines if x["acp"] == "send"
                  and x["msg"]["method"] == "session/prompt")
    assert prompt["params"]["sessionId"] == "sess-old"
    events = translate(out, 0)
    assert texts(events) == "fresh"
    sessions = [e.value["sessionId"] for e in events
                if e.type == EventType.CUSTOM and e.name == "corral.session"]
    assert sessions == ["sess-old"]
    assert events[-1].type == EventType.RUN_FINISHED


@pytest.mark.parametrize("strict", [False, True])
def test_a_session_the_agent_cannot_reopen_is_said_lost_or_fails_the_run(
        strict: bool) -> None:
    """resume and load both refused: the run goes on in a new session, and the
    translation says so (``corral.session_lost`` naming the session it was to continue
    and why, before anything the agent says); with ``on_session_lost: "fail"`` the
    bridge makes no new session and the run fails by name."""
    more = {"on_session_lost": "fail"} if strict else {}
    proc = bridge(config("reopen:both-fail", None, resume="sess-old", **more))
    out, err = proc.communicate(timeout=60)
    lines = [json.loads(x) for x in out.splitlines()]
    sent = [x["msg"]["method"] for x in lines if x["acp"] == "send"]
    notes = [x["event"] for x in lines if x["acp"] == "note"]
    t = AcpTranslator(RunContext("run-1", "thread-1", resumed_session="sess-old"))
    events = t.start()
    offset = 0
    for raw in out.split(b"\n")[:-1]:
        offset += len(raw) + 1
        events += t.feed(Line(raw, offset))
    events += t.feed(Exit(proc.returncode, None, offset + 1))
    customs = [(e.name, e.value) for e in events if e.type == EventType.CUSTOM]
    lost = [v for n, v in customs if n == "corral.session_lost"]
    if strict:
        assert proc.returncode == 1, err[-2000:]
        assert sent == ["initialize", "session/resume", "session/load"]
        assert notes == ["resume-failed", "load-failed", "session-lost"]
        assert lost == [] and events[-1].type == EventType.RUN_ERROR
        assert events[-1].code == "session_lost"
        assert "sess-old could not be resumed" in events[-1].message
        assert "refused session/load" in events[-1].message
        return
    assert proc.returncode == 0, err[-2000:]
    assert sent == ["initialize", "session/resume", "session/load", "session/new",
                    "session/prompt", "session/close"]
    assert lost == [{"harness": "acp", "expected": "sess-old", "sessionId": "sess-new",
                     "reason": "the agent refused session/resume; the agent refused "
                               "session/load"}]
    names = [n for n, _v in customs]
    assert names.index("corral.session_lost") + 1 == names.index("corral.session")
    at = next(i for i, e in enumerate(events) if e.type == EventType.CUSTOM
              and e.name == "corral.session_lost")
    assert at < [e.type for e in events].index(EventType.TEXT_MESSAGE_START)
    assert texts(events) == "fresh" and events[-1].type == EventType.RUN_FINISHED
    # without a session to continue, a new one is no loss
    plain = translate(out, 0)
    assert not [e for e in plain if e.type == EventType.CUSTOM
                and e.name == "corral.session_lost"]


def test_the_configuration_comes_on_stdin_only(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-I", "-S", acp_client.__file__],
                          input=b"12\n{not json}!", capture_output=True, timeout=30,
                          check=False)
    assert proc.returncode == 2 and proc.stdout == b""
    assert b"corral acp bridge:" in proc.stderr


# ---------------------------------------------------------------- the translator

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-3, 5),
                      st.sampled_from(["end_turn", "cancelled", "max_tokens", "execute",
                                       "completed", "failed", "c1", "c2", "text",
                                       "agent_message_chunk", "tool_call",
                                       "tool_call_update", "session/prompt",
                                       "session/update", "session/new", "session/load",
                                       "session/request_permission", "permission",
                                       "in_progress", '{"k": 1}', "{x", "[1]"]))
json_values = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.sampled_from([
        "acp", "msg", "id", "method", "params", "result", "error", "update",
        "sessionUpdate", "content", "text", "toolCallId", "kind", "status", "rawInput",
        "command", "stopReason", "sessionId", "toolCall", "event", "allowed", "reason",
        "type", "title"]), inner, max_size=5)), max_leaves=25)
line_bytes = st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    st.builds(lambda d, m: json.dumps({"acp": d, "msg": m}).encode(),
              st.sampled_from(["send", "recv", "note"]), json_values),
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")))


@settings(max_examples=300, deadline=None)
def _gemini_call(call: str, status: str, title: str, kind: str, text: str | None) -> bytes:
    content = [] if text is None else [{"type": "content",
                                        "content": {"type": "text", "text": text}}]
    update = {"sessionUpdate": "tool_call" if status == "in_progress" else "tool_call_update",
              "toolCallId": call, "status": status, "title": title, "content": content,
              "locations": [], "kind": kind}
    msg = {"jsonrpc": "2.0", "method": "session/update",
           "params": {"sessionId": "s", "update": update}}
    return json.dumps({"acp": "recv", "msg": msg}).encode() + b"\n"


def test_gemini_calls_get_their_arguments_from_the_title_and_the_content() -> None:
    """gemini 0.61 sends no rawInput: an execute call's command is its title, an MCP tool's
    arguments the JSON text of its content before it runs (getExplanation); past 500
    characters gemini sends "[Payload omitted …]", which gives no arguments, and the
    completed call's content is its result, never its arguments."""
    journal = b"".join([
        _gemini_call("h1", "in_progress", "read_host_state (corral MCP Server)", "other",
                     '{"key":"answer"}'),
        _gemini_call("h1", "completed", "read_host_state (corral MCP Server)", "other",
                     '{"not": "arguments"}'),
        _gemini_call("h2", "in_progress", "read_host_state (corral MCP Server)", "other",
                     "[Payload omitted due to length with parameters: key]"),
        _gemini_call("h2", "completed", "read_host_state (corral MCP Server)", "other",
                     '{"not": "arguments"}'),
        _gemini_call("s1", "in_progress", "echo hi && ls", "execute", None),
        _gemini_call("s1", "completed", "echo hi && ls", "execute", "hi"),
    ])
    events = translate(journal, 0, command_in_title=True, args_in_content=True)
    args = {e.tool_call_id: json.loads(e.delta) for e in events
            if e.type == EventType.TOOL_CALL_ARGS}
    assert args == {"run-1-h1": {"key": "answer"}, "run-1-s1": {"command": "echo hi && ls"}}
    results = {e.tool_call_id: e.content for e in events
               if e.type == EventType.TOOL_CALL_RESULT}
    assert results == {"run-1-h1": '{"not": "arguments"}', "run-1-h2": '{"not": "arguments"}',
                       "run-1-s1": "hi"}
    # another agent's content is never taken for arguments
    plain = translate(journal, 0)
    assert [e for e in plain if e.type == EventType.TOOL_CALL_ARGS] == []


@pytest.mark.parametrize("finished_on", [frozenset({"max_turn_requests"}), frozenset()])
def test_a_stop_reason_the_profile_names_finishes_the_run_and_says_so(
        finished_on: frozenset[str]) -> None:
    """gemini 0.61 stops a turn with ``max_turn_requests`` when its loop detection ends it
    (its headless mode calls that a success with a warning); for another agent it is an
    error."""
    lines = [{"acp": "send", "msg": {"jsonrpc": "2.0", "id": 3, "method": "session/prompt",
                                     "params": {"sessionId": "s", "prompt": []}}},
             {"acp": "recv", "msg": {"jsonrpc": "2.0", "id": 3,
                                     "result": {"stopReason": "max_turn_requests"}}}]
    journal = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    events = translate(journal, 0, finished_on=finished_on)
    stopped = [e.value for e in events if e.type == EventType.CUSTOM and e.name == "acp.stopped"]
    if finished_on:
        assert events[-1].type == EventType.RUN_FINISHED
        assert stopped == [{"stopReason": "max_turn_requests"}]
    else:
        assert events[-1].type == EventType.RUN_ERROR and stopped == []
        assert events[-1].code == "acp:max_turn_requests"


@given(st.lists(line_bytes, max_size=25), st.integers(0, 3), st.booleans(), st.booleans())
def test_any_journal_translates_without_raising_and_ends_once(
        lines: list[bytes], code: int, cut: bool, gemini: bool) -> None:
    kw: dict[str, Any] = {"command_in_title": gemini, "args_in_content": gemini,
                          "finished_on": frozenset({"max_turn_requests"} if gemini else ())}
    journal = b"".join(x + b"\n" for x in lines)
    events = translate(journal, code, **kw)
    assert [e.type for e in events if e.type in TERMINAL] == [events[-1].type]
    assert events[-1].type in TERMINAL
    starts = sorted(e.tool_call_id for e in events if e.type == EventType.TOOL_CALL_START)
    results = sorted(e.tool_call_id for e in events if e.type == EventType.TOOL_CALL_RESULT)
    assert starts == results  # every tool call gets exactly one result
    # state at any boundary is the replay of the prefix: continuing from there gives the
    # uninterrupted run's remaining events
    if cut and lines:
        k = len(lines) // 2
        t = AcpTranslator(RunContext("run-1", "thread-1"), **kw)
        t.start()
        offset = 0
        for raw in lines[:k]:
            offset += len(raw) + 1
            t.feed(Line(raw, offset))
        rest: list[Any] = []
        for raw in lines[k:]:
            offset += len(raw) + 1
            rest += t.feed(Line(raw, offset))
        rest += t.feed(Exit(code, None, offset + 1))
        assert [e.model_dump() for e in rest] == \
            [e.model_dump() for e in events[len(events) - len(rest):]]


@pytest.mark.parametrize("status", ["500 Internal Server Error", "401 Unauthorized"])
def test_a_failing_permission_server_refuses_and_never_hangs_the_agent(
        tmp_path: Path, status: str) -> None:
    """A driver that stops mid-answer leaves its MCP server answering 500 (asked again until
    the patience runs out: a successor may answer); a 401 refuses at once. Either way every
    permission request gets its answer (a refusal) and the run ends."""
    sock_path = tmp_path / "tools.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sock_path))
    server.listen(16)
    asked = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                asked.append(status)
                conn.sendall(f"HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n".encode())

    threading.Thread(target=serve, daemon=True).start()
    permission = {"socket": str(sock_path), "token": "t", "path": "/mcp", "patience": 1.0}
    try:
        proc = bridge(config("edges", permission))
        out, err = proc.communicate(timeout=60)
    finally:
        server.close()
    assert proc.returncode == 0, err[-2000:]
    said = texts(translate(out, 0))
    assert "c1: no" in said and "c2: no" in said and "c4: no" in said  # fails closed
    assert (len(asked) > 3) == status.startswith("500")  # 5xx: asked again
