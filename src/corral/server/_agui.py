"""The AG-UI endpoint's input: an AG-UI ``RunAgentInput`` read as a corral run request.

``POST /v1/agui`` takes the body any AG-UI client (``@ag-ui/client``'s ``HttpAgent``,
CopilotKit) sends. The run it starts is an ordinary corral run on the input's thread, with
the input's ``runId``: the latest user message is the prompt, and what corral needs besides
(harness, model, sandbox, or a command) comes from ``forwardedProps.corral``, checked exactly
as ``POST /v1/runs`` checks its body, so the operator's limits (allowed providers, workspace
roots) hold for both.
"""

from __future__ import annotations

from typing import Any

from ag_ui.core import RunAgentInput
from pydantic import BaseModel, ConfigDict, ValidationError

from corral.server._models import StartRun

__all__ = ["AguiInputError", "latest_user_text", "start_body"]


class AguiInputError(ValueError):
    """A ``RunAgentInput`` corral cannot run (the message says what to change)."""


class _Options(BaseModel):
    """``forwardedProps.corral``: the fields of ``POST /v1/runs`` that AG-UI has no place for."""

    model_config = ConfigDict(extra="forbid")

    harness: Any = None
    model: Any = None
    sandbox: Any = None
    command: Any = None
    timeout: Any = None
    token_budget: Any = None
    file_events: Any = None


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
    if run_input.tools:
        names = ", ".join(sorted(t.name for t in run_input.tools))
        raise AguiInputError(
            f"frontend tools ({names}) are not offered to corral's agents yet; send the "
            "input without tools")
    props = run_input.forwarded_props
    raw = props.get("corral", {}) if isinstance(props, dict) else {}
    if not isinstance(raw, dict):
        raise AguiInputError("forwardedProps.corral must be an object (harness, model, "
                             "sandbox, command, timeout, token_budget, file_events)")
    try:
        options = _Options.model_validate(raw)
    except ValidationError as exc:
        unknown = sorted(str(e["loc"][0]) for e in exc.errors())
        raise AguiInputError(
            f"forwardedProps.corral has unknown fields ({', '.join(unknown)}); it takes "
            "harness, model, sandbox, command, timeout, token_budget and file_events"
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
