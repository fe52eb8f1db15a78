"""AG-UI events: constructors, and the wire form (JSON dicts) both ways.

Events are the ``ag-ui-protocol`` package's pydantic models (``ag_ui.core``). The wire form
is what the AG-UI spec says: camelCase keys (``by_alias``) and no key for an optional field
that has no value (the package's base model omits those on every dump path; a *required*
``null`` such as ``CUSTOM.value = None`` is kept, as the spec requires).

Translators never set ``timestamp``: translation must be a pure function of the journal so a
successor host reproduces it exactly (see :mod:`corral.harness._base`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ag_ui.core import (
    BaseEvent,
    CustomEvent,
    Event,
    EventType,
    RawEvent,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)
from pydantic import TypeAdapter, ValidationError

from corral._errors import CorralError

__all__ = [
    "BaseEvent",
    "EventParseError",
    "EventType",
    "custom",
    "event_from_dict",
    "event_from_json",
    "event_to_dict",
    "event_to_json",
    "is_terminal",
    "raw",
    "run_error",
    "run_finished",
    "run_started",
    "text_content",
    "text_end",
    "text_start",
    "tool_call_args",
    "tool_call_end",
    "tool_call_result",
    "tool_call_start",
]

_ADAPTER: TypeAdapter[Any] = TypeAdapter(Event)


class EventParseError(CorralError, ValueError):
    """A value is not a valid AG-UI event (the message names the problem)."""


def event_to_dict(event: BaseEvent) -> dict[str, Any]:
    """The event's JSON object: camelCase keys, optional ``None`` fields left out."""
    out: dict[str, Any] = event.model_dump(mode="json", by_alias=True)
    return out


def event_to_json(event: BaseEvent) -> str:
    """The event as compact JSON text (same content as :func:`event_to_dict`)."""
    return event.model_dump_json(by_alias=True)


def event_from_dict(data: Mapping[str, Any]) -> BaseEvent:
    """Parse a wire-form event (camelCase; snake_case is accepted too)."""
    if not isinstance(data, Mapping):
        raise EventParseError(f"an AG-UI event must be a JSON object, got {type(data).__name__}")
    try:
        event: BaseEvent = _ADAPTER.validate_python(dict(data))
    except ValidationError as exc:
        kind = data.get("type")
        errors = exc.errors()
        msg = errors[0]["msg"] if errors else str(exc)
        where = ".".join(str(p) for p in errors[0]["loc"]) if errors else "?"
        raise EventParseError(f"invalid AG-UI event of type {kind!r}: {msg} at {where}") from None
    return event


def event_from_json(text: str | bytes) -> BaseEvent:
    """Parse :func:`event_to_json` output."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise EventParseError(f"an AG-UI event must be JSON: {exc}") from None
    return event_from_dict(data)


def is_terminal(event: BaseEvent) -> bool:
    """``RUN_FINISHED`` or ``RUN_ERROR``."""
    return event.type in (EventType.RUN_FINISHED, EventType.RUN_ERROR)


# ---------------------------------------------------------------- constructors


def run_started(thread_id: str, run_id: str) -> RunStartedEvent:
    return RunStartedEvent(thread_id=thread_id, run_id=run_id)


def run_finished(thread_id: str, run_id: str, result: Any = None) -> RunFinishedEvent:
    return RunFinishedEvent(thread_id=thread_id, run_id=run_id, result=result)


def run_error(
    message: str, code: str | None = None, metadata: dict[str, Any] | None = None
) -> RunErrorEvent:
    return RunErrorEvent(message=message, code=code, metadata=metadata)


def text_start(message_id: str, role: str = "assistant") -> TextMessageStartEvent:
    return TextMessageStartEvent(message_id=message_id, role=role)  # type: ignore[arg-type]


def text_content(message_id: str, delta: str) -> TextMessageContentEvent:
    if not delta:
        raise ValueError("a TEXT_MESSAGE_CONTENT delta must not be empty")
    return TextMessageContentEvent(message_id=message_id, delta=delta)


def text_end(message_id: str) -> TextMessageEndEvent:
    return TextMessageEndEvent(message_id=message_id)


def tool_call_start(
    tool_call_id: str, name: str, parent_message_id: str | None = None
) -> ToolCallStartEvent:
    return ToolCallStartEvent(
        tool_call_id=tool_call_id, tool_call_name=name, parent_message_id=parent_message_id
    )


def tool_call_args(tool_call_id: str, delta: str) -> ToolCallArgsEvent:
    return ToolCallArgsEvent(tool_call_id=tool_call_id, delta=delta)


def tool_call_end(tool_call_id: str) -> ToolCallEndEvent:
    return ToolCallEndEvent(tool_call_id=tool_call_id)


def tool_call_result(message_id: str, tool_call_id: str, content: str) -> ToolCallResultEvent:
    return ToolCallResultEvent(
        message_id=message_id, tool_call_id=tool_call_id, content=content, role="tool"
    )


def custom(name: str, value: Any) -> CustomEvent:
    return CustomEvent(name=name, value=value)


def raw(event: Any, source: str | None = None) -> RawEvent:
    return RawEvent(event=event, source=source)
