"""AG-UI event helpers: wire form (camelCase, no null optionals) and parsing back."""

from __future__ import annotations

import pytest
from ag_ui.core import EventType

from corral.harness import _events as ev
from corral.harness._events import (
    EventParseError,
    event_from_dict,
    event_from_json,
    event_to_dict,
    event_to_json,
)

SAMPLES = [
    ev.run_started("t1", "r1"),
    ev.text_start("m1"),
    ev.text_content("m1", "héllo\n"),
    ev.text_end("m1"),
    ev.tool_call_start("c1", "Bash", parent_message_id="m1"),
    ev.tool_call_args("c1", '{"command":"ls"}'),
    ev.tool_call_end("c1"),
    ev.tool_call_result("m2", "c1", "out.txt"),
    ev.custom("corral.x", None),
    ev.custom("corral.y", {"a": [1, None]}),
    ev.raw({"type": "whatever"}, source="claude"),
    ev.run_finished("t1", "r1"),
    ev.run_error("boom", "exit:1", {"exitCode": 1}),
]


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: e.type.value)
def test_roundtrip(event: ev.BaseEvent) -> None:
    wire = event_to_dict(event)
    assert wire["type"] == event.type.value
    assert event_from_dict(wire) == event
    assert event_from_json(event_to_json(event)) == event
    assert event_to_dict(event_from_json(event_to_json(event))) == wire


def test_wire_form_is_camel_case_without_null_optionals() -> None:
    assert event_to_dict(ev.run_started("t", "r")) == {
        "type": "RUN_STARTED", "threadId": "t", "runId": "r"}
    assert event_to_dict(ev.tool_call_start("c", "Bash")) == {
        "type": "TOOL_CALL_START", "toolCallId": "c", "toolCallName": "Bash"}
    assert event_to_dict(ev.run_error("m")) == {"type": "RUN_ERROR", "message": "m"}
    # A required null is data, and stays.
    assert event_to_dict(ev.custom("n", None)) == {"type": "CUSTOM", "name": "n", "value": None}


def test_parse_accepts_camel_case_and_rejects_bad_input() -> None:
    e = event_from_dict({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "x"})
    assert e.type is EventType.TEXT_MESSAGE_CONTENT
    with pytest.raises(EventParseError, match="RUN_STARTED"):
        event_from_dict({"type": "RUN_STARTED", "threadId": "t"})
    with pytest.raises(EventParseError):
        event_from_dict({"type": "NOPE"})
    with pytest.raises(EventParseError, match="JSON"):
        event_from_json("{not json")
    with pytest.raises(EventParseError, match="object"):
        event_from_dict(["x"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty"):
        ev.text_content("m", "")


def test_is_terminal() -> None:
    assert ev.is_terminal(ev.run_finished("t", "r")) and ev.is_terminal(ev.run_error("x"))
    assert not ev.is_terminal(ev.text_end("m"))
