"""Store kit, approval requests and their answers (the first answer wins)."""

from __future__ import annotations

import anyio
import anyio.lowlevel

from corral.stores._protocols import (
    ApprovalAnswer, ApprovalExists, Store, StoreError, UnknownApproval,
)
from corral.testing._kit import Kit, raises
from corral.testing._store_fixtures import DEADLINE, T0, approval

__all__ = ["APPROVAL_CHECKS"]

APPROVAL_CHECKS: Kit[Store] = Kit("store")
"""This part's checks, in the order written (the store kit joins the parts)."""


# ------------------------------------------------------------------ approvals
# Requests and answers shared by every host: the first answer wins. Keyed by run id; no run
# record is needed.

@APPROVAL_CHECKS.add
async def check_approval_round_trip(store: Store) -> None:
    assert await store.get_approval("run-1", "a1") is None
    req = approval(args={"env": "prod", "n": [1, 2.5, None], "s": "é\u2028", "b": True},
                   call_id="call-1")
    await store.add_approval(req)
    got = await store.get_approval("run-1", "a1")
    assert got == (req, None)
    assert got is not None
    got[0].args["env"] = "mutated"  # the stored request is not the caller's object
    again = await store.get_approval("run-1", "a1")
    assert again is not None and again[0].args["env"] == "prod"
    bare = approval("a2", args=["x"])  # no call id; args any JSON value
    await store.add_approval(bare)
    assert await store.get_approval("run-1", "a2") == (bare, None)
    with raises(StoreError):
        await store.add_approval(approval("a3", args={"f": object()}))  # not JSON
    assert await store.get_approval("run-1", "a3") is None


@APPROVAL_CHECKS.add
async def check_pending_oldest_first_ties_in_insertion_order(store: Store) -> None:
    for aid, at in [("late", T0 + 5), ("z", T0), ("a", T0), ("mid", T0 + 1), ("m", T0)]:
        await store.add_approval(approval(aid, created_at=at))
    pending = await store.list_pending_approvals("run-1")
    assert [r.approval_id for r in pending] == ["z", "a", "m", "mid", "late"]
    assert pending[0] == approval("z", created_at=T0)
    await store.answer_approval("run-1", "a", ApprovalAnswer("allow", None, T0 + 2))
    await store.answer_approval("run-1", "late", ApprovalAnswer("timeout", "no answer", T0 + 9))
    assert [r.approval_id for r in await store.list_pending_approvals("run-1")] == [
        "z", "m", "mid"]
    assert await store.list_pending_approvals("ghost") == []


@APPROVAL_CHECKS.add
async def check_add_existing_approval_changes_nothing(store: Store) -> None:
    first = approval("a1", tool="deploy")
    await store.add_approval(first)
    with raises(ApprovalExists):
        await store.add_approval(approval("a1", tool="other", created_at=T0 + 1))
    assert await store.get_approval("run-1", "a1") == (first, None)
    answer = ApprovalAnswer("deny", "no", T0 + 2)
    await store.answer_approval("run-1", "a1", answer)
    with raises(ApprovalExists):
        await store.add_approval(approval("a1"))  # an answered one is not reset either
    assert await store.get_approval("run-1", "a1") == (first, answer)
    assert await store.list_pending_approvals("run-1") == []


@APPROVAL_CHECKS.add
async def check_first_answer_wins(store: Store) -> None:
    req = approval()
    await store.add_approval(req)
    first = ApprovalAnswer("allow", "looks fine", T0 + 1)
    assert await store.answer_approval("run-1", "a1", first) == first
    for late in (ApprovalAnswer("deny", "too late", T0 + 2),
                 ApprovalAnswer("timeout", "no answer within 300s", T0 + 300),
                 ApprovalAnswer("allow", None, T0 + 3)):
        assert await store.answer_approval("run-1", "a1", late) == first
    assert await store.get_approval("run-1", "a1") == (req, first)


@APPROVAL_CHECKS.add
async def check_first_answer_wins_among_concurrent_answers(store: Store) -> None:
    """Concurrent answers (a human and the gate's timeout, two hosts): all but one lose,
    and every caller is told the same standing answer."""
    await store.add_approval(approval())
    standing: list[ApprovalAnswer] = []

    async def answer(i: int) -> None:
        decision = ("allow", "deny", "timeout")[i % 3]
        standing.append(await store.answer_approval(
            "run-1", "a1", ApprovalAnswer(decision, f"answer {i}", T0 + i)))

    with anyio.fail_after(DEADLINE):
        async with anyio.create_task_group() as tg:
            for i in range(12):
                tg.start_soon(answer, i)
    assert len(standing) == 12 and len(set(standing)) == 1, standing
    got = await store.get_approval("run-1", "a1")
    assert got is not None and got[1] == standing[0]


@APPROVAL_CHECKS.add
async def check_unknown_approval(store: Store) -> None:
    with raises(UnknownApproval) as info:
        await store.answer_approval("run-1", "nope", ApprovalAnswer("allow", None, T0))
    assert info.value.run_id == "run-1" and info.value.approval_id == "nope"
    assert await store.get_approval("run-1", "nope") is None
    await store.add_approval(approval("a1", "run-1"))
    with raises(UnknownApproval):  # the id of another run's request
        await store.answer_approval("run-2", "a1", ApprovalAnswer("allow", None, T0))
    assert await store.get_approval("run-2", "a1") is None
    assert [r.approval_id for r in await store.list_pending_approvals("run-1")] == ["a1"]


@APPROVAL_CHECKS.add
async def check_approvals_are_per_run(store: Store) -> None:
    await store.add_approval(approval("a1", "run-1"))
    await store.add_approval(approval("a1", "run-2", tool="other"))  # same id, other run
    await store.add_approval(approval("b", "run-2", created_at=T0 - 1))
    answer = ApprovalAnswer("deny", None, T0 + 1)
    await store.answer_approval("run-1", "a1", answer)
    got = await store.get_approval("run-2", "a1")
    assert got is not None and got[0].tool == "other" and got[1] is None
    assert await store.list_pending_approvals("run-1") == []
    assert [r.approval_id for r in await store.list_pending_approvals("run-2")] == ["b", "a1"]
