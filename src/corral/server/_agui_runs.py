"""One durable corral run as a sequence of AG-UI runs.

A corral run that stops for its client (a frontend tool call, an approval) goes on in the
same run once answered, while an AG-UI run ends there: the client answers in a new
``RunAgentInput`` with a new ``runId``. So the endpoint shows the corral run's log cut into
*segments*, each an AG-UI run of its own:

* segment 0 is AG-UI run ``<corral run id>`` (the ``runId`` of the input that started it);
* a segment ends at the first log offset where the run waits for the client and every
  event begun before has ended (no text message, tool call or reasoning open; a step open
  across the wait, such as Codex's turn, is ended there and begun again after): with
  ``RUN_FINISHED {outcome: {type: "interrupt", interrupts}}`` for approvals, or ``{type:
  "success", pendingToolCallIds}`` for frontend tool calls (AG-UI 1.0's two shapes);
* the segment after the one a client's answers name is the AG-UI run of the input carrying
  them, its ``runId`` in its synthesized ``RUN_STARTED`` and in the log's own
  ``RUN_FINISHED``/``RUN_ERROR`` when the corral run ends in it.

The cut is a pure function of the log, so a repeated input (a reconnect, with
``Last-Event-ID``: the log offset of the last event seen) gets the same segment, resumed
without loss or repeats; events synthesized at an offset carry that offset's id. The
agent's ``TOOL_CALL_RESULT`` of a frontend call is left out: the client holds the result
as its own ``tool`` message.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from corral.server._sse import encode_event
from corral.stores._protocols import LoggedEvent
from corral.tools._approvals import APPROVAL_REQUEST_EVENT, APPROVAL_RESOLVED_EVENT
from corral.tools._frontend import FRONTEND_CALL_EVENT, FRONTEND_RESOLVED_EVENT

__all__ = ["APPROVAL_SCHEMA", "RESULT_SCHEMA", "Segments", "Waiting"]

APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"decision": {"enum": ["allow", "deny"]}, "reason": {"type": "string"}},
    "required": ["decision"],
}
"""The ``payload`` of a resume entry answering a corral approval."""

RESULT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"content": {"type": "string"}, "error": {"type": "string"}},
}
"""The ``payload`` of a resume entry answering a frontend tool call shown as an interrupt
(an AG-UI run that ended on an approval and a frontend call at once)."""

# Event pairs that must be closed before RUN_FINISHED (the client's verification).
_OPENERS = {"TEXT_MESSAGE_START": "messageId", "TOOL_CALL_START": "toolCallId",
            "REASONING_START": "messageId", "REASONING_MESSAGE_START": "messageId",
            "STEP_STARTED": "stepName"}
_CLOSERS = {"TEXT_MESSAGE_END": ("TEXT_MESSAGE_START", "messageId"),
            "TOOL_CALL_END": ("TOOL_CALL_START", "toolCallId"),
            "REASONING_END": ("REASONING_START", "messageId"),
            "REASONING_MESSAGE_END": ("REASONING_MESSAGE_START", "messageId"),
            "STEP_FINISHED": ("STEP_STARTED", "stepName")}


@dataclass(frozen=True, slots=True)
class Waiting:
    """Something the run waits for: a frontend tool call or an approval."""

    approval_id: str
    tool_call_id: str | None
    tool: str
    args: Any
    expires_at: float | None
    frontend: bool

    @property
    def ids(self) -> set[str]:
        """The ids a client answers it by."""
        return {self.approval_id} | ({self.tool_call_id} if self.tool_call_id else set())


def _frame(offset: int, event: dict[str, Any]) -> bytes:
    return encode_event(LoggedEvent(offset, 0, event))  # the frame every stream sends


def _iso(ts: Any) -> str | None:
    if isinstance(ts, (int, float)) and not isinstance(ts, bool):
        return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")
    return None


@dataclass
class Segments:
    """Cuts a run's log (fed in order from offset 1) into AG-UI runs and renders segment
    ``target`` as AG-UI run ``agui_run_id`` (``target=None``: render nothing, only learn
    where segments end: :attr:`ends`). Frames with ids up to ``after`` are left out."""

    thread_id: str
    agui_run_id: str
    target: int | None = 0
    after: int = 0
    segment: int = 0
    ends: list[list[Waiting]] = field(default_factory=list)
    """The waits that ended each finished segment, in order."""
    done: bool = False
    _open: dict[tuple[str, str], None] = field(default_factory=dict)
    """Begun, not yet ended (insertion order): text messages, tool calls, reasoning, steps."""
    _ended_calls: set[str] = field(default_factory=set)
    _frontend_calls: set[str] = field(default_factory=set)
    _waiting: list[Waiting] = field(default_factory=list)

    def segment_after(self, answered: Iterable[str]) -> int | None:
        """The segment following the last one ended by a wait ``answered`` names."""
        wanted = set(answered)
        hits = [i for i, waits in enumerate(self.ends) if any(w.ids & wanted for w in waits)]
        return max(hits) + 1 if hits else None

    def tool_calls(self) -> set[str]:
        """The ids of the tool calls seen so far (begun and ended)."""
        return set(self._ended_calls)

    def waits(self) -> list[Waiting]:
        """Every wait the segments seen so far ended with."""
        return [w for waits in self.ends for w in waits]

    def feed_events(self, events: list[LoggedEvent]) -> tuple[list[bytes], bool]:
        """:meth:`feed` for a batch of the event stream; ``True``: the segment ended."""
        out: list[bytes] = []
        for logged in events:
            out += self.feed(logged)
            if self.done:
                break
        return out, self.done

    def feed(self, logged: LoggedEvent) -> list[bytes]:
        """The frames of the target segment this event yields."""
        if self.done:
            return []
        offset, event = logged.offset, dict(logged.event)
        kind = event.get("type")
        out: list[dict[str, Any]] = []
        show = self.segment == self.target
        if kind == "RUN_STARTED":
            if self.segment == 0:
                out.append({**event, "runId": self.agui_run_id})
        elif kind in ("RUN_FINISHED", "RUN_ERROR"):
            out.append({**event, "threadId": self.thread_id, "runId": self.agui_run_id}
                       if kind == "RUN_FINISHED" else event)
            self.done = show
            self._waiting = []
        elif kind == "TOOL_CALL_RESULT" and event.get("toolCallId") in self._frontend_calls:
            pass  # the client's own tool message holds it
        elif kind == "CUSTOM" and isinstance(event.get("value"), dict):
            out.append(event)
            out += self._custom(str(event.get("name")), event["value"])
        else:
            out.append(event)
            self._track(str(kind), event)
        frames = [_frame(offset, e) for e in out] if show and offset > self.after else []
        if self._waiting and not self._blocking() and not self.done and all(
                w.tool_call_id in self._ended_calls for w in self._waiting if w.frontend):
            frames += self._end(offset)
        return frames

    def _blocking(self) -> bool:
        """Whether something begun must end before the AG-UI run can. A step (Codex's
        turn) spans the wait itself: it is ended at the cut and begun again after it."""
        return any(kind != "STEP_STARTED" for kind, _ in self._open)

    def _steps(self) -> list[str]:
        return [name for kind, name in self._open if kind == "STEP_STARTED"]

    def _track(self, kind: str, event: dict[str, Any]) -> None:
        if kind in _OPENERS:
            self._open[(kind, str(event.get(_OPENERS[kind])))] = None
        elif kind in _CLOSERS:
            opener, key = _CLOSERS[kind]
            self._open.pop((opener, str(event.get(key))), None)
            if kind == "TOOL_CALL_END":
                self._ended_calls.add(str(event.get(key)))

    def _custom(self, name: str, value: dict[str, Any]) -> list[dict[str, Any]]:
        approval_id = value.get("approvalId")
        if not isinstance(approval_id, str):
            return []
        if name in (APPROVAL_RESOLVED_EVENT, FRONTEND_RESOLVED_EVENT):
            self._waiting = [w for w in self._waiting if w.approval_id != approval_id]
            return []
        if name not in (APPROVAL_REQUEST_EVENT, FRONTEND_CALL_EVENT):
            return []
        frontend = name == FRONTEND_CALL_EVENT
        call_id = value.get("toolCallId")
        call_id = call_id if isinstance(call_id, str) else None
        tool = str(value.get("tool"))
        wait = Waiting(approval_id, call_id or (approval_id if frontend else None), tool,
                       value.get("args"), value.get("expiresAt"), frontend)
        self._waiting.append(wait)
        if not frontend:
            return []
        assert wait.tool_call_id is not None
        self._frontend_calls.add(wait.tool_call_id)
        if call_id is not None:
            return []  # the agent's journal carries the call's own events
        # The agent's CLI did not name its call: show the client one of corral's.
        self._ended_calls.add(approval_id)
        return [{"type": "TOOL_CALL_START", "toolCallId": approval_id, "toolCallName": tool},
                {"type": "TOOL_CALL_ARGS", "toolCallId": approval_id,
                 "delta": json.dumps(value.get("args"), ensure_ascii=False)},
                {"type": "TOOL_CALL_END", "toolCallId": approval_id}]

    def _end(self, offset: int) -> list[bytes]:
        waits, self._waiting = self._waiting, []
        self.ends.append(waits)
        ended, self.segment = self.segment, self.segment + 1
        frames: list[bytes] = []
        if ended == self.target:
            # With an approval among them the outcome is an interrupt, which cannot name
            # pending tool calls: a frontend call there is an interrupt of its own.
            interrupts = ([self._interrupt(w) for w in waits]
                          if any(not w.frontend for w in waits) else [])
            outcome: dict[str, Any] = (
                {"type": "interrupt", "interrupts": interrupts} if interrupts else
                {"type": "success",
                 "pendingToolCallIds": [w.tool_call_id for w in waits if w.frontend]})
            finished = {"type": "RUN_FINISHED", "threadId": self.thread_id,
                        "runId": self.agui_run_id, "outcome": outcome}
            frames += [_frame(offset, {"type": "STEP_FINISHED", "stepName": name})
                       for name in reversed(self._steps())]
            frames.append(_frame(offset, finished))
            self.done = True
        elif self.segment == self.target:
            started = {"type": "RUN_STARTED", "threadId": self.thread_id,
                       "runId": self.agui_run_id}
            frames.append(_frame(offset, started))
            frames += [_frame(offset, {"type": "STEP_STARTED", "stepName": name})
                       for name in self._steps()]
        return [f for f in frames if offset > self.after]

    @staticmethod
    def _interrupt(wait: Waiting) -> dict[str, Any]:
        out: dict[str, Any] = (
            {"id": wait.approval_id, "reason": "corral.frontend_tool",
             "message": f"Run the frontend tool {wait.tool} and resume with its result.",
             "responseSchema": RESULT_SCHEMA} if wait.frontend else
            {"id": wait.approval_id, "reason": "corral.approval",
             "message": f"The agent asks to use {wait.tool}; allow or deny it.",
             "responseSchema": APPROVAL_SCHEMA})
        out["metadata"] = {"tool": wait.tool, "args": wait.args}
        if wait.tool_call_id:
            out["toolCallId"] = wait.tool_call_id
        expires = _iso(wait.expires_at)
        if expires:
            out["expiresAt"] = expires
        return out
