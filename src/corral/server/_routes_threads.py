"""``/v1/threads``: list threads, show one (runs and checkpoints), its running run, undo its
last turn, fork it, remove it (#27; the work is :class:`~corral.runs._threads.Threads`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from corral.server._http_errors import responses
from corral.server._models import ForkBody, RunOut, ThreadList, ThreadOut, ThreadRemoved
from corral.server._requests import ApiError
from corral.server._routing import Service, prefix_of

__all__ = ["router"]

router = APIRouter()


@router.get("/v1/threads/{thread_id}/active", response_model=RunOut,
            responses=responses(401, 404), summary="The thread's running run")
async def active_run(thread_id: str, request: Request, service: Service) -> RunOut:
    record = await service.store.find_active_run(thread_id)
    if record is None:
        raise ApiError(404, "no_active_run", f"thread {thread_id!r} has no running run")
    return RunOut.of(record, prefix_of(request))


@router.get("/v1/threads", response_model=ThreadList, responses=responses(401, 422),
            summary="List threads, newest activity first")
async def list_threads(service: Service,
                       limit: Annotated[int, Query(ge=1, le=1000)] = 50) -> ThreadList:
    found = await service.runner.threads.list(limit=limit)
    return ThreadList(threads=[t.to_dict() for t in found])


@router.get("/v1/threads/{thread_id}", response_model=ThreadOut,
            responses=responses(400, 401, 404), summary="A thread's runs and checkpoints")
async def get_thread(thread_id: str, service: Service) -> ThreadOut:
    return ThreadOut(**(await service.runner.threads.show(thread_id)).to_dict())


@router.post("/v1/threads/{thread_id}/undo", response_model=ThreadOut,
             responses=responses(400, 401, 403, 404, 409),
             summary="Undo the thread's last turn (workspace and conversation)")
async def undo_thread(thread_id: str, service: Service) -> ThreadOut:
    return ThreadOut(**(await service.runner.threads.undo(thread_id)).to_dict())


@router.post("/v1/threads/{thread_id}/fork", response_model=ThreadOut,
             responses=responses(400, 401, 403, 404, 409, 413, 422),
             summary="Start a new thread from this one's state after a run")
async def fork_thread(thread_id: str, body: ForkBody, service: Service) -> ThreadOut:
    detail = await service.runner.threads.fork(thread_id, body.as_, at=body.at)
    return ThreadOut(**detail.to_dict())


@router.delete("/v1/threads/{thread_id}", response_model=ThreadRemoved,
               responses=responses(400, 401, 403, 404, 409),
               summary="Remove a thread's sessions, checkpoints and sandboxes (and, with "
                       "?runs=true, its runs and their logs)")
async def remove_thread(
    thread_id: str,
    service: Service,
    runs: Annotated[bool, Query(description="also remove the thread's runs: their "
                                "records, event logs and approvals")] = False,
) -> ThreadRemoved:
    removed = await service.runner.threads.remove(thread_id, runs=runs)
    return ThreadRemoved(thread_id=thread_id, **removed)
