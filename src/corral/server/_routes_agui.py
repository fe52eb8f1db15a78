"""``POST /v1/agui``: AG-UI's HTTP endpoint. An AG-UI ``RunAgentInput`` starts the durable
run it describes (or, retried or reconnecting, streams the same run again), or continues a
waiting run of its thread with frontend tool results and resume entries; the answer is the
run's AG-UI events as server-sent events (:mod:`corral.server._agui` reads the input)."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any

from ag_ui.core import RunAgentInput
from fastapi import APIRouter, Header, Request, Response

from corral._telemetry import context_of, span
from corral.server._agui import AguiInputError, answers_of, frontend_descriptors, start_body
from corral.server._agui_answer import apply_answers
from corral.server._agui_runs import Segments
from corral.server._http_errors import responses
from corral.server._requests import ApiError, request_for
from corral.server._routing import SSE_EVENT, Asgi, Service, http_attrs, resume_point
from corral.server._service import RunService
from corral.server._sse import EventStream
from corral.stores._protocols import RunExists
from corral.tools._output import SUBMIT_TOOL
from corral.tools._permission import PERMISSION_TOOL

__all__ = ["router"]

router = APIRouter()


@router.post(
    "/v1/agui",
    responses={
        200: {
            "description": "the run's AG-UI events as server-sent events (AG-UI's SSE "
            "encoding; `id` is the log offset, so a reconnect resumes with "
            "Last-Event-ID)",
            "content": {"text/event-stream": {"schema": SSE_EVENT}},
        },
        **responses(400, 401, 403, 409, 413, 422, 429, 500),
    },
    response_class=Response,
    summary="AG-UI: start (or resume) the durable run an AG-UI RunAgentInput describes, "
    "or continue it with frontend tool results and resume entries",
)
async def agui(
    run_input: RunAgentInput,
    request: Request,
    service: Service,
    last_event_id: Annotated[str | None, Header()] = None,
) -> Any:
    position = resume_point(last_event_id)
    config = service.config
    try:
        answers = answers_of(run_input)
        if answers.ids:
            # the client answers what a run of the thread waits for: the same corral
            # run goes on, shown as the AG-UI run of this input
            going_on = await apply_answers(service.store, run_input.thread_id, answers)
            return Asgi(EventStream(
                service, going_on.record.run_id, 0,
                project=Segments(run_input.thread_id, run_input.run_id,
                                 going_on.segment, position).feed_events))
        existing = await service.store.get(run_input.run_id)
        if existing is None:
            body = start_body(run_input, config.default_harness)
            frontend = frontend_descriptors(run_input, _reserved_tool_names(service))
        elif existing.thread_id != run_input.thread_id:
            raise RunExists(f"run {run_input.run_id!r} exists on another thread")
    except AguiInputError as exc:
        raise ApiError(400, "invalid_agui_input", str(exc)) from None
    if existing is None:
        with span("POST /v1/agui", http_attrs(request), parent=context_of(request.headers)):
            await service.start_run(replace(request_for(config, body),
                                            frontend_tools=frontend or None))
    # else: the client retries or reconnects: the same run's stream, from where it was
    return Asgi(EventStream(service, run_input.run_id, 0, project=Segments(
        run_input.thread_id, run_input.run_id, 0, position).feed_events))


def _reserved_tool_names(service: RunService) -> set[str]:
    """corral's own host tool names: a client's tool never shadows one."""
    own = service.runner.tools
    return {PERMISSION_TOOL, SUBMIT_TOOL, *(t.name for t in own or ())}
