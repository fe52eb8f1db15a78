"""The cut of one corral run's log into AG-UI runs (hypothesis over generated logs): every
segment is a well-formed AG-UI run, the segments together show every event of the log
exactly once (bar the agent's copies of frontend results), and a resume from any offset
is the tail of the full segment."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.server._agui_runs import Segments
from corral.stores._protocols import LoggedEvent


def _block(kind: str, n: int, frontend_first: bool, named: bool) -> list[dict[str, Any]]:
    tid = f"toolu_{n}"
    if kind == "text":
        return [{"type": "TEXT_MESSAGE_START", "messageId": f"m{n}", "role": "assistant"},
                {"type": "TEXT_MESSAGE_CONTENT", "messageId": f"m{n}", "delta": "hi"},
                {"type": "TEXT_MESSAGE_END", "messageId": f"m{n}"}]
    call = [{"type": "TOOL_CALL_START", "toolCallId": tid, "toolCallName": "t"},
            {"type": "TOOL_CALL_ARGS", "toolCallId": tid, "delta": "{}"},
            {"type": "TOOL_CALL_END", "toolCallId": tid}]
    result = {"type": "TOOL_CALL_RESULT", "messageId": f"r{n}", "toolCallId": tid,
              "content": "x"}
    if kind == "tool":
        return [*call, result]
    if kind == "frontend":
        ask = {"type": "CUSTOM", "name": "corral.frontend_call",
               "value": {"approvalId": f"a{n}", "toolCallId": tid, "tool": "t", "args": {}}}
        if not named:  # a CLI that does not name its calls: corral shows one of its own
            del ask["value"]["toolCallId"]
        done = {"type": "CUSTOM", "name": "corral.frontend_call_resolved",
                "value": {"approvalId": f"a{n}", "decision": "allow"}}
        # the driver may log the call's announcement before the journal's tool call
        return [ask, *call, done, result] if frontend_first else [*call, ask, done, result]
    ask = {"type": "CUSTOM", "name": "corral.approval_request",
           "value": {"approvalId": f"a{n}", "tool": "Bash", "args": {}, "expiresAt": 1.0}}
    done = {"type": "CUSTOM", "name": "corral.approval_resolved",
            "value": {"approvalId": f"a{n}", "decision": "allow"}}
    return [ask, done]


def _log(blocks: list[tuple[str, bool, bool]], turns: int) -> list[dict[str, Any]]:
    """A run's log; with ``turns``, its blocks split into that many steps (Codex's turns,
    open across the waits in them)."""
    events: list[dict[str, Any]] = []
    per = -(-len(blocks) // turns) if turns else 0
    for n, (k, f, m) in enumerate(blocks):
        if turns and n % per == 0:
            if n:
                events.append({"type": "STEP_FINISHED", "stepName": f"turn-{n // per}"})
            events.append({"type": "STEP_STARTED", "stepName": f"turn-{n // per + 1}"})
        events += _block(k, n, f, m)
    if turns and blocks:
        events.append({"type": "STEP_FINISHED", "stepName": f"turn-{(len(blocks) - 1) // per + 1}"})
    return [{"type": "RUN_STARTED", "threadId": "th", "runId": "r0"}, *events,
            {"type": "RUN_FINISHED", "threadId": "th", "runId": "r0"}]


logs = st.builds(_log, st.lists(st.tuples(
    st.sampled_from(["text", "tool", "frontend", "approval"]), st.booleans(), st.booleans()),
    max_size=8), st.integers(min_value=0, max_value=3))


def decode_frame(frame: bytes) -> LoggedEvent:
    """The event of an SSE frame ``encode_event`` wrote."""
    head, _, data = frame.partition(b"\ndata: ")
    return LoggedEvent(int(head.removeprefix(b"id: ")), 0, json.loads(data))


def render(log: list[dict[str, Any]], target: int | None, after: int = 0,
           run_id: str = "agui") -> tuple[list[tuple[int, dict[str, Any]]], Segments]:
    seg = Segments("th", run_id if target else "r0", target=target, after=after)
    frames: list[bytes] = []
    for offset, event in enumerate(log, start=1):
        frames += seg.feed(LoggedEvent(offset, offset, json.loads(json.dumps(event))))
    decoded = [decode_frame(f) for f in frames]
    return [(d.offset, dict(d.event)) for d in decoded], seg


def well_formed(events: list[dict[str, Any]], run_id: str) -> None:
    """What @ag-ui/client's verifyEvents checks of one AG-UI run, plus its run id."""
    assert events[0]["type"] == "RUN_STARTED" and events[0]["runId"] == run_id
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["runId"] == run_id
    open_: set[str] = set()
    for e in events[1:-1]:
        assert e["type"] not in ("RUN_STARTED", "RUN_FINISHED")
        key = e.get("messageId") or e.get("toolCallId") or e.get("stepName")
        if e["type"] in ("TEXT_MESSAGE_START", "TOOL_CALL_START", "STEP_STARTED"):
            assert key not in open_
            open_.add(key)
        if e["type"] in ("TEXT_MESSAGE_END", "TOOL_CALL_END", "STEP_FINISHED"):
            assert key in open_  # nothing ends that this AG-UI run did not begin
            open_.discard(key)
        if e["type"] in ("TEXT_MESSAGE_CONTENT", "TOOL_CALL_ARGS"):
            assert key in open_
    assert not open_


@settings(max_examples=300, deadline=None)
@given(log=logs, cut=st.integers(min_value=0, max_value=60))
def test_segments_are_ag_ui_runs_that_cover_the_log_and_resume_exactly(
        log: list[dict[str, Any]], cut: int) -> None:
    _, learned = render(log, None)
    waits = sum(1 for e in log if e["type"] == "CUSTOM" and e["name"] in (
        "corral.frontend_call", "corral.approval_request"))
    assert len(learned.ends) == waits  # every wait ends an AG-UI run
    shown: list[int] = []
    for target in range(len(learned.ends) + 1):
        run_id = "r0" if target == 0 else f"agui-{target}"
        frames, _ = render(log, target, run_id=run_id)
        well_formed([e for _, e in frames], run_id)
        resumed, _ = render(log, target, after=cut, run_id=run_id)
        assert resumed == [(i, e) for i, e in frames if i > cut]
        # corral's own events at a cut (its tool calls, a step ended and begun again) are
        # not the log's
        shown += [i for i, e in frames if e["type"] not in ("RUN_STARTED", "RUN_FINISHED")
                  and not str(e.get("toolCallId")).startswith("a")
                  and log[i - 1]["type"] == e["type"]]
        if target < len(learned.ends):
            end = frames[-1][1]["outcome"]
            ended = learned.ends[target]
            if any(not w.frontend for w in ended):
                assert end["type"] == "interrupt"
                # a frontend call ending the same AG-UI run is an interrupt of its own
                assert [(i["id"], i["reason"]) for i in end["interrupts"]] == [
                    (w.approval_id, "corral.frontend_tool" if w.frontend
                     else "corral.approval") for w in ended]
            else:
                assert end == {"type": "success", "pendingToolCallIds": [
                    w.tool_call_id for w in ended]}
                # the client saw each pending call end before the AG-UI run did
                ends = {e["toolCallId"] for _, e in frames if e["type"] == "TOOL_CALL_END"}
                assert set(end["pendingToolCallIds"]) <= ends
            assert learned.segment_after(w.approval_id for w in ended) == target + 1
    # every event of the log shown once, except the agent's copy of a frontend result
    frontend_results = {i for i, e in enumerate(log, start=1)
                        if e["type"] == "TOOL_CALL_RESULT" and any(
                            x.get("value", {}).get("toolCallId") == e["toolCallId"]
                            for x in log if x.get("name") == "corral.frontend_call")}
    expected = [i for i in range(2, len(log)) if i not in frontend_results]
    assert sorted(shown) == expected and len(set(shown)) == len(shown)
