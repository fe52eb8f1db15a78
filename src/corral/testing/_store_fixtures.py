"""What the store checks make: runs, claims, approval requests and events, at fixed times.

Shared by the store kit's parts (``_store_*``) and the pipe kit.
"""

from __future__ import annotations

from typing import Any

from corral.stores._protocols import ApprovalRequest, NewRun, Store
from corral.stores._records import RunRecord

__all__ = ["DEADLINE", "T0", "approval", "claimed_run", "event", "new_run"]

T0 = 1_700_000_000.0
DEADLINE = 10.0


async def new_run(store: Store, run_id: str = "run-1", thread_id: str = "thread-1",
                  started_at: float = T0, **extra: Any) -> RunRecord:
    """Create a run (at ``T0``)."""
    return await store.create(NewRun(run_id, thread_id, started_at=started_at, **extra), now=T0)


async def claimed_run(store: Store, run_id: str = "run-1", owner: str = "host-a") -> int:
    """Create a run and claim it; returns the epoch."""
    await new_run(store, run_id)
    claim = await store.acquire_claim(run_id, owner, 30.0)
    return claim.epoch


def approval(approval_id: str = "a1", run_id: str = "run-1", *, created_at: float = T0,
             tool: str = "deploy", args: Any = None, call_id: str | None = None
             ) -> ApprovalRequest:
    """An approval request (expiring 300 s after ``created_at``)."""
    return ApprovalRequest(approval_id, run_id, tool, {"env": "prod"} if args is None else args,
                           created_at, created_at + 300, call_id=call_id)


def event(i: int, **more: Any) -> dict[str, Any]:
    """A text event whose delta is ``d<i>``."""
    return {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": f"d{i}", **more}
