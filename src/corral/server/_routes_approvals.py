"""``/v1/runs/{run_id}/approvals``: a run's pending approval requests, and the answer to
one (allow or deny)."""

from __future__ import annotations

from fastapi import APIRouter

from corral.server._http_errors import responses
from corral.server._models import ApprovalAnswer, ApprovalList, ApprovalOut, ApprovalResult
from corral.server._requests import ApiError
from corral.server._routing import Service
from corral.stores._protocols import UnknownRun
from corral.tools._approvals import ApprovalError, answer_approval, list_pending

__all__ = ["router"]

router = APIRouter()


@router.get("/v1/runs/{run_id}/approvals", response_model=ApprovalList,
            responses=responses(401, 404), summary="A run's pending approval requests")
async def pending_approvals(run_id: str, service: Service) -> ApprovalList:
    if await service.store.get(run_id) is None:
        raise UnknownRun(run_id)
    pending = await list_pending(service.store, run_id)
    return ApprovalList(approvals=[
        ApprovalOut(approval_id=a.approval_id, run_id=a.run_id, tool=a.tool, args=a.args,
                    created_at=a.created_at, expires_at=a.expires_at)
        for a in pending
    ])


@router.post("/v1/runs/{run_id}/approvals/{approval_id}", response_model=ApprovalResult,
             responses=responses(400, 401, 403, 404, 409, 413, 422),
             summary="Answer a host tool's approval request (allow or deny)")
async def answer(run_id: str, approval_id: str, body: ApprovalAnswer,
                 service: Service) -> ApprovalResult:
    if await service.store.get(run_id) is None:
        raise UnknownRun(run_id)
    allow = body.decision == "allow"
    try:
        await answer_approval(service.store, run_id, approval_id, allow, reason=body.reason)
    except ApprovalError as exc:
        # a forged or foreign id, an unknown, expired or already answered request
        raise ApiError(409, "approval_refused", str(exc)) from None
    return ApprovalResult(approval_id=approval_id, decision=body.decision)
