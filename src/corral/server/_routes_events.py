"""``GET /v1/runs/{run_id}/events``: a run's AG-UI events as server-sent events, resumable
with ``Last-Event-ID`` or ``?after=``; ``?token=`` is documented here and checked by the
guard (EventSource cannot send headers)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response

from corral.server._http_errors import responses
from corral.server._routing import SSE_EVENT, Asgi, Service, resume_point
from corral.server._sse import EventStream

__all__ = ["router"]

router = APIRouter()


@router.get(
    "/v1/runs/{run_id}/events",
    responses={
        200: {
            "description": "server-sent events: `id` is the log offset, `data` the AG-UI "
            "event as JSON; a last `: end` comment marks the end of the log",
            "content": {"text/event-stream": {"schema": SSE_EVENT}},
        },
        204: {"description": "the run's log is closed and nothing follows `after`"},
        **responses(400, 401, 404, 422),
    },
    response_class=Response,
    summary="Stream a run's events (resume with Last-Event-ID or ?after=)",
)
async def run_events(
    run_id: str,
    service: Service,
    after: Annotated[int | None, Query(ge=0, description="resume after this offset")] = None,
    token: Annotated[str | None, Query(description="the API token, for EventSource "
                                        "(which cannot send headers)")] = None,
    last_event_id: Annotated[str | None, Header()] = None,
) -> Any:
    # the browser's resume point wins over the URL's
    position = resume_point(last_event_id, after or 0)
    tail = await service.store.tail(run_id)  # raises UnknownRun for a run it lacks
    if tail.closed and position >= tail.last_offset:
        return Response(status_code=204)
    return Asgi(EventStream(service, run_id, position))
