"""Claude Code and Codex translators: fixture lines (shapes from the CLI facts reference and
real runs) → expected events; garbage never crashes; resuming at any logged offset gives
exactly the uninterrupted translation's tail."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import anyio
import pytest
from ag_ui.core import BaseEvent, EventType
from hypothesis import given, settings
from hypothesis import strategies as st

from corral._errors import ConfigError
from corral.harness._base import Batch, RunContext, translate_run
from corral.harness._claude_code import ClaudeCodeHarness
from corral.harness._cli_base import NO_RESULT, SESSION_EVENT, CliHarness
from corral.harness._codex import CodexHarness
from corral.harness._gemini_cli import GeminiCliHarness
from corral.harness._events import event_to_dict
from corral.journal._reader import Exit, Line
from corral.journal._sentinel import format_trailer, new_nonce

CTX = RunContext("run-7", "thread-7")
GEMINI_OK = [  # gemini-cli 0.61.0 --output-format stream-json against the scripted server
    '{"type":"init","timestamp":"t","session_id":"8c8c4464-709f","model":"gemini-fake"}',
    '{"type":"message","timestamp":"t","role":"user","content":"do the thing\\n"}',
    '{"type":"message","timestamp":"t","role":"assistant","content":"I\'ll run it.","delta":true}',
    '{"type":"tool_use","timestamp":"t","tool_name":"run_shell_command","tool_id":"rsc_1",'
    '"parameters":{"command":"echo hi > out.txt && ls","description":"scripted"}}',
    '{"type":"tool_result","timestamp":"t","tool_id":"rsc_1","status":"success",'
    '"output":"out.txt"}',
    '{"type":"message","timestamp":"t","role":"assistant","content":"Done. ","delta":true}',
    '{"type":"message","timestamp":"t","role":"assistant","content":"out.txt","delta":true}',
    '{"type":"result","timestamp":"t","status":"success","stats":{"total_tokens":240,'
    '"input_tokens":200,"output_tokens":40,"cached":0,"input":200,"duration_ms":2010,'
    '"tool_calls":1}}',
]
NONCE = new_nonce()
SID = "e45a0c1d-6a7b-4c8d-9e0f-112233445566"


def j(obj: Any) -> str:
    return json.dumps(obj)


CLAUDE_OK = [
    j({"type": "system", "subtype": "init", "cwd": "/workspace", "session_id": SID,
       "tools": ["Bash", "Edit", "Read"], "mcp_servers": [], "model": "claude-opus-5-5",
       "permissionMode": "bypassPermissions", "apiKeySource": "ANTHROPIC_API_KEY",
       "claude_code_version": "2.1.332", "uuid": "u1"}),
    j({"type": "assistant", "message": {"id": "msg_1", "role": "assistant",
       "model": "claude-opus-5-5", "content": [{"type": "thinking", "thinking": "Plan it."}],
       "stop_reason": None}, "parent_tool_use_id": None, "session_id": SID}),
    j({"type": "assistant", "message": {"id": "msg_1", "role": "assistant",
       "model": "claude-opus-5-5", "content": [{"type": "text", "text": "I'll run a command."}],
       "stop_reason": None, "usage": {}}, "parent_tool_use_id": None, "session_id": SID}),
    j({"type": "assistant", "message": {"id": "msg_1", "role": "assistant",
       "model": "claude-opus-5-5", "content": [{"type": "tool_use", "id": "toolu_01",
       "name": "Bash", "input": {"command": "echo hi > out.txt && ls",
       "description": "Create"}}]}, "parent_tool_use_id": None, "session_id": SID}),
    j({"type": "user", "message": {"role": "user", "content": [{"tool_use_id": "toolu_01",
       "type": "tool_result", "content": "out.txt", "is_error": False}]},
       "parent_tool_use_id": None, "session_id": SID,
       "tool_use_result": {"stdout": "out.txt", "stderr": "", "interrupted": False}}),
    j({"type": "assistant", "message": {"id": "msg_2", "role": "assistant",
       "model": "claude-opus-5-5", "content": [{"type": "text", "text": "Done."}]},
       "parent_tool_use_id": None, "session_id": SID}),
    j({"type": "result", "subtype": "success", "is_error": False, "result": "Done.",
       "num_turns": 2, "duration_ms": 190, "stop_reason": "end_turn",
       "terminal_reason": "completed", "session_id": SID, "total_cost_usd": 0.0016,
       "usage": {"input_tokens": 200, "cache_creation_input_tokens": 5,
                 "cache_read_input_tokens": 7, "output_tokens": 40},
       "modelUsage": {"claude-opus-5-5": {"inputTokens": 200}}, "permission_denials": []}),
]

CLAUDE_API_ERROR = [
    CLAUDE_OK[0],
    j({"type": "system", "subtype": "api_retry", "attempt": 1, "max_retries": 10,
       "retry_delay_ms": 609, "error_status": None, "error": "unknown", "session_id": SID}),
    j({"type": "assistant", "message": {"id": "msg_x", "role": "assistant",
       "model": "<synthetic>", "content": [{"type": "text",
       "text": "API Error: Connection refused (ECONNREFUSED)"}]}, "error": "server_error",
       "parent_tool_use_id": None, "session_id": SID}),
    j({"type": "result", "subtype": "success", "is_error": True,
       "result": "API Error: Connection refused (ECONNREFUSED)",
       "terminal_reason": "api_error", "session_id": SID, "usage": {}}),
]

CODEX_OK = [
    j({"type": "thread.started", "thread_id": "01a22c70-6d34-71d3-aaaa-000000000001"}),
    j({"type": "item.completed", "item": {"id": "item_0", "type": "error",
       "message": "Model metadata for `gpt-fake` not found."}}),
    j({"type": "turn.started"}),
    j({"type": "item.completed", "item": {"id": "item_1", "type": "reasoning",
       "text": "**Planning** I should run the command."}}),
    j({"type": "item.started", "item": {"id": "item_2", "type": "command_execution",
       "command": "/bin/bash -lc 'echo hi > out.txt && ls'", "aggregated_output": "",
       "exit_code": None, "status": "in_progress"}}),
    j({"type": "item.completed", "item": {"id": "item_2", "type": "command_execution",
       "command": "/bin/bash -lc 'echo hi > out.txt && ls'", "aggregated_output": "out.txt\n",
       "exit_code": 0, "status": "completed"}}),
    j({"type": "item.completed", "item": {"id": "item_3", "type": "agent_message",
       "text": "Done. Tool output was: out.txt"}}),
    j({"type": "turn.completed", "usage": {"input_tokens": 200, "cached_input_tokens": 50,
       "cache_write_input_tokens": 0, "output_tokens": 40, "reasoning_output_tokens": 3}}),
]

CODEX_FAILED = [
    CODEX_OK[0],
    CODEX_OK[2],
    j({"type": "error", "message": "Reconnecting... 2/5 (stream disconnected)"}),
    j({"type": "turn.failed", "error": {
        "message": "stream disconnected before completion: error sending request"}}),
]


def journal(d: str, lines: list[str | bytes], code: int) -> Path:
    p = Path(d) / "journal"
    body = b"\n".join(x if isinstance(x, bytes) else x.encode() for x in lines)
    p.write_bytes(body + format_trailer(NONCE, code, None))
    return p


def batches(harness: CliHarness, path: Path, **kw: Any) -> list[Batch]:
    async def go() -> list[Batch]:
        with anyio.fail_after(30):
            return [b async for b in translate_run(harness, CTX, path, nonce=NONCE,
                                                   follow=False, **kw)]

    return anyio.run(go)


def translate(harness: CliHarness, lines: list[str | bytes], code: int = 0) -> list[BaseEvent]:
    with tempfile.TemporaryDirectory() as d:
        return [e for b in batches(harness, journal(d, lines, code)) for e in b.events]


def kinds(events: list[BaseEvent]) -> list[str]:
    return [e.type.value for e in events]


def check_well_formed(events: list[BaseEvent]) -> None:
    """One RUN_STARTED first, one terminal last, every tool call started/ended/resulted
    once, text and reasoning messages balanced."""
    assert events[0].type == EventType.RUN_STARTED
    terminal = [e for e in events if e.type in (EventType.RUN_FINISHED, EventType.RUN_ERROR)]
    assert len(terminal) == 1 and terminal[0] is events[-1]
    starts = [e.tool_call_id for e in events if e.type == EventType.TOOL_CALL_START]
    ends = [e.tool_call_id for e in events if e.type == EventType.TOOL_CALL_END]
    results = [e.tool_call_id for e in events if e.type == EventType.TOOL_CALL_RESULT]
    assert len(set(starts)) == len(starts)
    assert sorted(starts) == sorted(ends) == sorted(results)
    for e in events:
        if e.type == EventType.TOOL_CALL_RESULT:
            i = events.index(e)
            assert any(x.type == EventType.TOOL_CALL_START and x.tool_call_id == e.tool_call_id
                       for x in events[:i])
    open_msgs: set[str] = set()
    for e in events:
        if e.type == EventType.TEXT_MESSAGE_START:
            assert e.message_id not in open_msgs
            open_msgs.add(e.message_id)
        elif e.type == EventType.TEXT_MESSAGE_CONTENT:
            assert e.message_id in open_msgs and e.delta
        elif e.type == EventType.TEXT_MESSAGE_END:
            open_msgs.remove(e.message_id)
    assert not open_msgs
    # Every event survives the wire form.
    for e in events:
        json.dumps(event_to_dict(e))


# ---------------------------------------------------------------- fixtures → events


def test_claude_success_run() -> None:
    evs = translate(ClaudeCodeHarness(), CLAUDE_OK)
    check_well_formed(evs)
    assert kinds(evs) == [
        "RUN_STARTED", "CUSTOM",
        "REASONING_START", "REASONING_MESSAGE_START", "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_END", "REASONING_END",
        "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
        "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
        "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    session = evs[1]
    assert session.name == SESSION_EVENT
    assert session.value == {"harness": "claude-code", "sessionId": SID,
                             "model": "claude-opus-5-5", "cwd": "/workspace",
                             "tools": ["Bash", "Edit", "Read"],
                             "permissionMode": "bypassPermissions", "version": "2.1.332"}
    start = evs[10]
    assert (start.tool_call_id, start.tool_call_name, start.parent_message_id) == (
        "toolu_01", "Bash", "msg_1")
    assert json.loads(evs[11].delta)["command"] == "echo hi > out.txt && ls"
    assert evs[13].content == "out.txt" and evs[13].tool_call_id == "toolu_01"
    assert evs[15].delta == "Done."
    fin = evs[-1]
    assert fin.result["text"] == "Done." and fin.result["sessionId"] == SID
    u = fin.usage[0]
    assert (u.input_tokens, u.output_tokens, u.cached_input_tokens,
            u.cache_write_input_tokens, u.total_tokens, u.model) == (
        200, 40, 7, 5, 252, "claude-opus-5-5")
    # ids derive from the run id and journal offsets only
    assert evs[7].message_id.startswith("run-7-m")


def test_claude_api_error_becomes_run_error_with_claudes_message() -> None:
    evs = translate(ClaudeCodeHarness(), CLAUDE_API_ERROR, code=1)
    check_well_formed(evs)
    assert any(e.type == EventType.CUSTOM and e.name == "claude-code.system.api_retry"
               for e in evs)
    err = evs[-1]
    assert err.type == EventType.RUN_ERROR
    assert err.message == "API Error: Connection refused (ECONNREFUSED)"
    assert err.code == "claude-code:api_error"
    assert err.metadata["exitCode"] == 1


def test_claude_run_cut_short_closes_open_tool_calls() -> None:
    evs = translate(ClaudeCodeHarness(), CLAUDE_OK[:4], code=137)
    check_well_formed(evs)
    res = [e for e in evs if e.type == EventType.TOOL_CALL_RESULT]
    assert [r.content for r in res] == [NO_RESULT]
    assert evs[-1].type == EventType.RUN_ERROR and evs[-1].code == "exit:137"


def test_claude_exit_zero_without_result_is_an_error() -> None:
    evs = translate(ClaudeCodeHarness(), CLAUDE_OK[:3], code=0)
    assert evs[-1].type == EventType.RUN_ERROR
    assert "without reporting a result" in evs[-1].message


def test_claude_unknown_events_are_kept_as_custom_or_raw() -> None:
    lines = [
        CLAUDE_OK[0],
        j({"type": "stream_event", "event": {"type": "content_block_delta"},
           "session_id": SID}),
        j({"type": "brand_new_kind", "x": 1}),
        "this is not json",
        j(["a", "list"]),
        j({"type": "assistant", "message": {"content": [{"type": "image", "x": 1}]}}),
        *CLAUDE_OK[1:],
    ]
    evs = translate(ClaudeCodeHarness(), lines)
    check_well_formed(evs)
    customs = [e.name for e in evs if e.type == EventType.CUSTOM]
    assert "claude-code.stream_event" in customs and "claude-code.brand_new_kind" in customs
    assert "claude-code.assistant.block" in customs
    raws = [e for e in evs if e.type == EventType.RAW]
    assert [r.event["line"] for r in raws] == ["this is not json", '["a", "list"]']
    assert all(r.source == "claude-code" for r in raws)
    assert evs[-1].type == EventType.RUN_FINISHED


def test_codex_success_run() -> None:
    evs = translate(CodexHarness(), CODEX_OK)
    check_well_formed(evs)
    assert kinds(evs) == [
        "RUN_STARTED", "CUSTOM", "CUSTOM", "STEP_STARTED",
        "REASONING_START", "REASONING_MESSAGE_START", "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_END", "REASONING_END",
        "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT",
        "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
        "STEP_FINISHED", "RUN_FINISHED",
    ]
    assert evs[1].value == {"harness": "codex",
                            "sessionId": "01a22c70-6d34-71d3-aaaa-000000000001"}
    assert evs[2].name == "codex.warning"  # item type "error" is not fatal
    start = evs[9]
    assert (start.tool_call_id, start.tool_call_name) == ("run-7-item_2", "shell")
    assert "echo hi > out.txt" in json.loads(evs[10].delta)["command"]
    assert evs[12].content == "out.txt\n"
    assert evs[14].delta == "Done. Tool output was: out.txt"
    fin = evs[-1]
    assert fin.result["text"] == "Done. Tool output was: out.txt"
    u = fin.usage[0]
    assert (u.input_tokens, u.cached_input_tokens, u.output_tokens, u.reasoning_tokens) == (
        150, 50, 40, 3)


def test_codex_failed_turn_is_run_error_with_codex_message() -> None:
    evs = translate(CodexHarness(), CODEX_FAILED, code=1)
    check_well_formed(evs)
    assert any(e.type == EventType.CUSTOM and e.name == "codex.error" for e in evs)
    err = evs[-1]
    assert err.type == EventType.RUN_ERROR
    assert err.message == "stream disconnected before completion: error sending request"
    assert err.code == "codex:turn.failed"


def test_codex_other_tool_items_and_nonzero_exit_codes() -> None:
    lines = [
        CODEX_OK[0], CODEX_OK[2],
        j({"type": "item.completed", "item": {"id": "item_5", "type": "command_execution",
           "command": "false", "aggregated_output": "", "exit_code": 1,
           "status": "failed"}}),
        j({"type": "item.started", "item": {"id": "item_6", "type": "mcp_tool_call",
           "server": "corral", "tool": "lookup", "arguments": {"q": 1},
           "status": "in_progress"}}),
        j({"type": "item.completed", "item": {"id": "item_6", "type": "mcp_tool_call",
           "server": "corral", "tool": "lookup", "arguments": {"q": 1},
           "result": {"content": [{"type": "text", "text": "found"}]},
           "status": "completed"}}),
        j({"type": "item.completed", "item": {"id": "item_7", "type": "file_change",
           "changes": [{"path": "a.py", "kind": "add"}], "status": "completed"}}),
        j({"type": "item.updated", "item": {"id": "item_8", "type": "todo_list",
           "items": []}}),
        CODEX_OK[-1],
    ]
    evs = translate(CodexHarness(), lines)
    check_well_formed(evs)
    names = {e.tool_call_id: e.tool_call_name for e in evs
             if e.type == EventType.TOOL_CALL_START}
    # the run's host tools (MCP server "corral") go by their own names
    assert names == {"run-7-item_5": "shell", "run-7-item_6": "lookup",
                     "run-7-item_7": "apply_patch"}
    results = {e.tool_call_id: e.content for e in evs if e.type == EventType.TOOL_CALL_RESULT}
    assert results["run-7-item_5"] == "exit code 1"
    assert results["run-7-item_6"] == "found"
    assert results["run-7-item_7"] == "completed"
    assert any(e.type == EventType.CUSTOM and e.name == "codex.item.updated.todo_list"
               for e in evs)


@given(st.sampled_from(["corral", "github", "corralx", "mcp", ""]),
       st.text(min_size=1, max_size=20))
def test_codex_only_corral_mcp_tools_lose_the_server_name(server: str, tool: str) -> None:
    item = {"id": "item_1", "type": "mcp_tool_call", "server": server, "tool": tool,
            "arguments": {}, "status": "in_progress"}
    evs = translate(CodexHarness(), [CODEX_OK[0], CODEX_OK[2],
                                     j({"type": "item.started", "item": item}), CODEX_OK[-1]])
    names = [e.tool_call_name for e in evs if e.type == EventType.TOOL_CALL_START]
    assert names == [tool if server == "corral" else f"{server or 'mcp'}.{tool}"]


def test_translators_ignore_items_after_exit_and_refuse_offset_resume() -> None:
    for harness in (ClaudeCodeHarness(), CodexHarness()):
        t = harness.translator(CTX)
        t.start()
        assert t.feed(Exit(0, None, 10))
        assert t.feed(Line(b'{"type":"turn.started"}', 40)) == []
        with pytest.raises(ConfigError):
            harness.translator(CTX, at_offset=5)


# ---------------------------------------------------------------- properties

known_types = st.sampled_from([
    "system", "assistant", "user", "result", "stream_event", "thread.started",
    "turn.started", "turn.completed", "turn.failed", "item.started", "item.updated",
    "item.completed", "error", "x", "init", "message", "tool_use", "tool_result"])
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=8),
                      st.sampled_from(["text", "tool_use", "tool_result", "thinking",
                                       "command_execution", "agent_message", "reasoning",
                                       "mcp_tool_call", "file_change", "init", "toolu_1",
                                       "item_1", "success"]))
json_value = st.recursive(
    json_leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.sampled_from(["type", "id", "message", "content", "item", "text",
                                         "input", "tool_use_id", "session_id", "thread_id",
                                         "usage", "is_error", "result", "subtype", "error",
                                         "name", "aggregated_output", "exit_code",
                                         "input_tokens", "output_tokens", "thinking",
                                         "role", "delta", "tool_id", "tool_name",
                                         "parameters", "status", "output", "stats"]),
                        children, max_size=6)),
    max_leaves=25)
event_obj = st.builds(lambda t, rest: {**rest, "type": t} if isinstance(rest, dict) else rest,
                      known_types, json_value)
line_st = st.one_of(
    event_obj.map(lambda o: json.dumps(o).encode()),
    st.binary(max_size=40).filter(lambda b: b"\n" not in b),
    st.sampled_from([x.encode() for x in CLAUDE_OK + CODEX_OK + CLAUDE_API_ERROR
                     + GEMINI_OK]),
)
harnesses = st.sampled_from([ClaudeCodeHarness(), CodexHarness(), GeminiCliHarness()])


@settings(max_examples=150, deadline=None)
@given(harness=harnesses, lines=st.lists(line_st, max_size=14),
       code=st.sampled_from([0, 1, 137]))
def test_property_garbage_never_crashes_and_runs_stay_well_formed(
        harness: CliHarness, lines: list[bytes], code: int) -> None:
    t = harness.translator(CTX)
    evs = t.start()
    offset = 0
    for raw in lines:
        offset += len(raw) + 1
        evs += t.feed(Line(raw, offset))
    evs += t.feed(Exit(code, None, offset + 10))
    check_well_formed(evs)
    if code != 0:
        assert evs[-1].type == EventType.RUN_ERROR
    # deterministic: the same input gives the same events
    t2 = harness.translator(CTX)
    again = t2.start()
    offset = 0
    for raw in lines:
        offset += len(raw) + 1
        again += t2.feed(Line(raw, offset))
    again += t2.feed(Exit(code, None, offset + 10))
    assert [event_to_dict(e) for e in again] == [event_to_dict(e) for e in evs]


@settings(max_examples=60, deadline=None)
@given(harness=harnesses, lines=st.lists(line_st, min_size=1, max_size=10),
       code=st.sampled_from([0, 1]), data=st.data())
def test_property_resume_at_any_logged_offset_equals_the_full_tail(
        harness: CliHarness, lines: list[bytes], code: int, data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = journal(d, list(lines), code)
        full = batches(harness, path)
        k = data.draw(st.integers(0, len(full) - 1), label="last logged batch")
        resumed = batches(harness, path, after=full[k].journal_offset)

    def wire(bs: list[Batch]) -> list[tuple[int, list[dict[str, Any]]]]:
        return [(b.journal_offset, [event_to_dict(e) for e in b.events]) for b in bs]

    assert wire(resumed) == wire(full[k + 1:])


def _claude_tool_names(names: list[str]) -> list[str]:
    lines = [j({"type": "assistant", "message": {"id": "msg_t", "role": "assistant",
                "model": "claude-opus-5-5", "content": [
                    {"type": "tool_use", "id": f"toolu_{i}", "name": n, "input": {}}
                    for i, n in enumerate(names)]},
                "parent_tool_use_id": None, "session_id": SID})]
    tr = ClaudeCodeHarness().translator(CTX)
    events = [e for line in lines for e in tr.feed(Line(line.encode(), 0))]
    return [e.tool_call_name for e in events if e.type == EventType.TOOL_CALL_START]


def test_claude_host_tools_keep_their_own_names() -> None:
    names = _claude_tool_names(["mcp__corral__read_host_state", "mcp__github__search",
                                "Bash", "mcp__corral__", "mcp__corralx__t"])
    assert names == ["read_host_state", "mcp__github__search", "Bash", "mcp__corral__",
                     "mcp__corralx__t"]


@given(st.text(min_size=1, max_size=30))
def test_claude_only_the_corral_prefix_is_removed(name: str) -> None:
    from corral.harness._claude_code import host_tool_name

    assert host_tool_name(f"mcp__corral__{name}") == name
    other = f"mcp__other__{name}"
    assert host_tool_name(other) == other
