"""The AG-UI endpoint's input: an AG-UI ``RunAgentInput`` read as a corral run request.

``POST /v1/agui`` takes the body any AG-UI client (``@ag-ui/client``'s ``HttpAgent``,
CopilotKit) sends. The run it starts is an ordinary corral run on the input's thread, with
the input's ``runId``: the latest user message is the prompt, and what corral needs besides
(harness, model, sandbox, or a command) comes from ``forwardedProps.corral``, checked exactly
as ``POST /v1/runs`` checks its body, so the operator's limits (allowed providers, workspace
roots) hold for both. The input's ``tools`` become the run's frontend tools
(:mod:`corral.tools._frontend`).

An input that answers what a run of its thread waits for (:func:`answers_of`: ``tool``
messages ending its messages, ``resume`` entries) continues that run instead
(:mod:`corral.server._agui_answer`, :mod:`corral.server._agui_runs`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ag_ui.core import RunAgentInput
from pydantic import BaseModel, ConfigDict, ValidationError

from corral.server._models import StartRun
from corral.tools._frontend import check_frontend_tools

__all__ = ["AguiInputError", "Answers", "answers_of", "frontend_descriptors",
           "latest_user_text", "start_body"]


class AguiInputError(ValueError):
    """A ``RunAgentInput`` corral cannot run (the message says what to change)."""


class _Options(BaseModel):
    """``forwardedProps.corral``: the fields of ``POST /v1/runs`` that AG-UI has no place for."""

    model_config = ConfigDict(extra="forbid")

    harness: Any = None
    model: Any = None
    agent: Any = None
    sandbox: Any = None
    command: Any = None
    timeout: Any = None
    token_budget: Any = None
    file_events: Any = None
    output_schema: Any = None


@dataclass(frozen=True, slots=True)
class Answers:
    """What an input answers of a run that waits for its client: frontend tool results in
    ``tool`` messages (``toolCallId`` → content, error) and resume entries by interrupt id:
    approval decisions (→ allow, reason), frontend tool results (→ content, error), and
    cancelled interrupts."""

    results: dict[str, tuple[str, str | None]]
    decisions: dict[str, tuple[bool, str | None]] = field(default_factory=dict)
    outputs: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    cancelled: set[str] = field(default_factory=set)

    @property
    def resumed(self) -> set[str]:
        """The interrupt ids the resume entries name."""
        return set(self.decisions) | set(self.outputs) | self.cancelled

    @property
    def ids(self) -> set[str]:
        return set(self.results) | self.resumed


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = [getattr(part, "text", None) for part in content or ()]
    return "".join(p for p in parts if isinstance(p, str))


_RESUME_SHAPES = ('{"decision": "allow" or "deny", "reason": optional text} (an approval) '
                  'or {"content": text} / {"error": text} (a frontend tool)')


def answers_of(run_input: RunAgentInput) -> Answers:
    """The answers ``run_input`` carries: the ``tool`` messages ending its messages (a
    client's results of frontend tool calls) and its ``resume`` entries (payload
    ``{"decision": "allow"|"deny", "reason"?}`` for an approval, ``{"content"}`` or
    ``{"error"}`` for a frontend tool; a ``cancelled`` entry denies or fails it). Raises
    :class:`AguiInputError` for a resume entry corral cannot read."""
    answers = Answers({})
    for message in reversed(run_input.messages):
        if message.role != "tool":
            break
        error = getattr(message, "error", None)
        answers.results[message.tool_call_id] = (_text(message.content),
                                                 error if isinstance(error, str) else None)
    for entry in run_input.resume or ():
        ident = entry.interrupt_id
        if entry.status == "cancelled":
            answers.cancelled.add(ident)
            continue
        payload = entry.payload if isinstance(entry.payload, dict) else {}
        decision, reason = payload.get("decision"), payload.get("reason")
        content, error = payload.get("content"), payload.get("error")
        if decision in ("allow", "deny") and isinstance(reason, (str, type(None))):
            answers.decisions[ident] = (decision == "allow", reason)
        elif isinstance(content, str) and "decision" not in payload:
            answers.outputs[ident] = (content, None)
        elif isinstance(error, str) and "decision" not in payload:
            answers.outputs[ident] = ("", error)
        else:
            raise AguiInputError(f"resume entry for interrupt {ident[:80]!r}: the payload "
                                 f"must be {_RESUME_SHAPES}")
    return answers


def frontend_descriptors(run_input: RunAgentInput, reserved: Iterable[str]
                         ) -> list[dict[str, Any]]:
    """The input's ``tools`` as frontend tool descriptors for the run's spec; raises
    :class:`AguiInputError` naming a tool corral cannot offer (``reserved``: corral's own
    tool names, which a client's tool never shadows)."""
    try:
        return check_frontend_tools(
            [t.model_dump(by_alias=True) for t in run_input.tools or ()], reserved)
    except ValueError as exc:
        raise AguiInputError(f"tools: {exc}") from None


def latest_user_text(run_input: RunAgentInput) -> str | None:
    """The text of the last ``user`` message (its text parts joined), or ``None``."""
    for message in reversed(run_input.messages):
        if message.role != "user":
            continue
        content = message.content
        if isinstance(content, str):
            return content
        parts = [getattr(part, "text", None) for part in content]
        return "".join(p for p in parts if isinstance(p, str))
    return None


def start_body(run_input: RunAgentInput, default_harness: str | None = None) -> StartRun:
    """The ``POST /v1/runs`` body that ``run_input`` stands for (an agent run with
    ``default_harness`` when the input names none); raises :class:`AguiInputError` naming
    what is missing or wrong."""
    props = run_input.forwarded_props
    raw = props.get("corral", {}) if isinstance(props, dict) else {}
    if not isinstance(raw, dict):
        raise AguiInputError("forwardedProps.corral must be an object (harness, model, "
                             "sandbox, command, timeout, token_budget, file_events, "
                             "output_schema)")
    try:
        options = _Options.model_validate(raw)
    except ValidationError as exc:
        unknown = sorted(str(e["loc"][0]) for e in exc.errors())
        raise AguiInputError(
            f"forwardedProps.corral has unknown fields ({', '.join(unknown)}); it takes "
            "harness, model, agent, sandbox, command, timeout, token_budget, file_events "
            "and output_schema"
        ) from None
    fields: dict[str, Any] = {k: v for k, v in options.model_dump().items() if v is not None}
    fields.update(thread_id=run_input.thread_id, run_id=run_input.run_id)
    if "command" not in fields:
        prompt = latest_user_text(run_input)
        if not (prompt or "").strip():
            raise AguiInputError("the input has no user message with text to use as the "
                                 "agent's prompt")
        fields["prompt"] = prompt
        if "harness" not in fields and default_harness is not None:
            fields["harness"] = default_harness
        if "harness" not in fields:
            raise AguiInputError('name the agent in forwardedProps.corral.harness (e.g. '
                                 '{"corral": {"harness": "claude-code"}})')
    try:
        return StartRun.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        where = _INPUT_NAMES.get(field, f"forwardedProps.corral.{field}" if field
                                 else "forwardedProps.corral")
        raise AguiInputError(f"{where}: {first['msg']}") from None


# Fields of the request that come from the AG-UI input itself, by their AG-UI names.
_INPUT_NAMES = {"thread_id": "threadId", "run_id": "runId",
                "prompt": "the latest user message"}
