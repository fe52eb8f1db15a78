"""``/v1/runs``: start a run, list runs, show one, cancel one."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from corral._telemetry import context_of, span
from corral.server._http_errors import responses
from corral.server._models import RunCreated, RunList, RunOut, StartRun, events_url
from corral.server._requests import request_for
from corral.server._routing import Service, http_attrs, prefix_of
from corral.stores._protocols import UnknownRun
from corral.stores._records import RunStatus

__all__ = ["router"]

router = APIRouter()


@router.post(
    "/v1/runs",
    status_code=201,
    response_model=RunCreated,
    responses=responses(400, 401, 403, 409, 413, 422, 429, 500),
    summary="Start a run; the server drives it until it ends",
)
async def start_run(body: StartRun, response: Response, request: Request,
                    service: Service) -> RunCreated:
    with span("POST /v1/runs", http_attrs(request), parent=context_of(request.headers)):
        record = await service.start_run(request_for(service.config, body))
    url = prefix_of(request) + events_url(record.run_id)
    response.headers["location"] = url.removesuffix("/events")
    return RunCreated(run_id=record.run_id, thread_id=record.thread_id,
                      status=record.status, events_url=url)


@router.get("/v1/runs", response_model=RunList, responses=responses(401, 422),
            summary="List runs, newest first")
async def list_runs(
    request: Request,
    service: Service,
    thread_id: Annotated[str | None, Query(max_length=200)] = None,
    status: RunStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> RunList:
    store = service.store
    if thread_id is not None:
        records = list(reversed(await store.list_by_thread(thread_id)))
        if status is not None:
            records = [r for r in records if r.status is status]
        records = records[:limit]
    else:
        records = await store.list_runs(status=status, limit=limit)
    return RunList(runs=[RunOut.of(r, prefix_of(request)) for r in records])


@router.get("/v1/runs/{run_id}", response_model=RunOut, responses=responses(401, 404),
            summary="One run")
async def get_run(run_id: str, request: Request, service: Service) -> RunOut:
    record = await service.store.get(run_id)
    if record is None:
        raise UnknownRun(run_id)
    return RunOut.of(record, prefix_of(request))


@router.post("/v1/runs/{run_id}/cancel", response_model=RunOut,
             responses=responses(401, 403, 404), summary="Cancel a run (idempotent)")
async def cancel_run(run_id: str, request: Request, service: Service) -> RunOut:
    return RunOut.of(await service.cancel(run_id), prefix_of(request))
