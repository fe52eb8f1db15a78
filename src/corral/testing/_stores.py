"""Store conformance kit: the :class:`~corral.abc.Store` contract, as plain checks.

Every backend (memory, SQLite, and third-party ones) must pass it::

    from corral.testing import check_store

    async def make_store():
        return await open_my_store()      # closed with aclose() after each check

    report = await check_store(make_store)   # raises KitFailed naming each failed check

Each check gets a fresh, empty store from the factory. The checks cover run records
(create, resume, patch semantics, queries), ``list_runs``, driver claims (leases, epochs,
refusals: the fencing a takeover relies on), the event log (append under the epoch fence,
read/tail, close, snapshot), sandbox instance records, named locks, approval requests and
their answers (first answer wins), corral's shared secrets, deleting an ended run (and
refusing one that has not ended) and a thread's head in one read. They use anyio and
run on asyncio or trio. ``corral.testing.pytest_checks(STORE_KIT, ...)`` makes one pytest
test per check.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import anyio
import anyio.lowlevel

from corral.stores._protocols import (
    ApprovalAnswer,
    ApprovalExists,
    ApprovalRequest,
    ClaimLost,
    ClaimRefused,
    InstanceRecord,
    InvalidEvent,
    LogClosed,
    NewRun,
    RefusalReason,
    RunActive,
    RunExists,
    Store,
    StoreError,
    UnknownApproval,
    UnknownRun,
)
from corral.stores._checkpoints import Checkpoint, CheckpointEntry
from corral.stores._records import RunError, RunPatch, RunRecord, RunStatus
from corral.testing._kit import Factory, Kit, KitReport, raises
from corral.testing._polling import wait_until_async

__all__ = [
    "STORE_KIT",
    "approval",
    "check_store",
    "claimed_run",
    "event",
    "new_run",
    "check_add_existing_approval_changes_nothing",
    "check_approval_round_trip",
    "check_approvals_are_per_run",
    "check_first_answer_wins",
    "check_first_answer_wins_among_concurrent_answers",
    "check_pending_oldest_first_ties_in_insertion_order",
    "check_shared_secret_first_callers_agree",
    "check_shared_secret_is_stable_and_per_name",
    "check_unknown_approval",
    "check_break_lease_only_of_the_named_owner",
    "check_cancelled_run_claimable_for_finalizing",
    "check_claim_can_clear_detached_since",
    "check_claims_bump_the_epoch",
    "check_close_never_fenced",
    "check_create_and_get_round_trip",
    "check_create_or_resume_never_overwrites",
    "check_create_refuses_existing_id",
    "check_delete_run_refuses_a_run_that_has_not_ended",
    "check_delete_run_removes_its_record_log_and_approvals",
    "check_delete_run_ends_a_tail_of_its_log",
    "check_thread_head_is_the_newest_run_and_checkpoint",
    "check_empty_patch_leaves_fields_alone",
    "check_events_round_trip_as_json",
    "check_exclusive_until_released_or_expired",
    "check_expired_lease_can_be_taken_over",
    "check_fenced_update_refuses_stale_epoch",
    "check_find_active_run",
    "check_get_upsert_delete",
    "check_interrupted_is_claimable",
    "check_invalid_batch_lands_nothing",
    "check_list_by_thread_oldest_first",
    "check_list_expired_inclusive",
    "check_list_reclaimable_detached_since_wins_and_order_mixes_both",
    "check_list_reclaimable_inclusive_cutoff",
    "check_list_reclaimable_lapsed_lease_counts_from_its_end",
    "check_list_reclaimable_oldest_first_and_limit",
    "check_list_reclaimable_released_claim_counts_from_the_release",
    "check_logs_are_per_run",
    "check_many_readers_see_every_event",
    "check_newest_first_with_status_filter_and_limit",
    "check_offsets_gap_free_and_increasing",
    "check_patch_sets_and_clears_each_field_distinctly",
    "check_read_from_offset_tails_until_closed",
    "check_read_of_closed_log_returns_everything_then_ends",
    "check_read_unknown_run_raises",
    "check_records_are_not_shared_with_callers",
    "check_refused_claim_changes_nothing",
    "check_renew_and_loss",
    "check_request_cancel_is_sticky_and_atomic",
    "check_snapshot_never_waits_and_is_a_copy",
    "check_stale_epoch_lands_nothing",
    "check_tail_keeps_the_highest_journal_offset",
    "check_terminal_event_does_not_end_a_read",
    "check_unclaimed_run_takes_no_appends",
    "check_unknown_run_and_closed_log",
    "check_unknown_run_reads_none",
    "check_update_unknown_run_is_noop",
]

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


STORE_KIT: Kit[Store] = Kit("store")
"""Every store check; the subject is the store the factory makes."""


# ------------------------------------------------------------------ run store contract
# Run records: create, resume, patch semantics, queries.

@STORE_KIT.add
async def check_create_and_get_round_trip(store: Store) -> None:
    created = await store.create(
        NewRun("r", "t", started_at=T0, harness="command", spec={"argv": ["echo", "hi"]},
               sandbox_key="k", journal={"path": "/j"}),
        now=T0 + 1,
    )
    got = await store.get("r")
    assert got == created
    assert got is not None
    assert got.status is RunStatus.RUNNING
    assert got.started_at == T0 and got.updated_at == T0 + 1
    assert got.spec == {"argv": ["echo", "hi"]}
    data = got.to_dict()
    # Never-written fields read back absent, not null/false/0.
    for absent in ("finished_at", "error", "usage", "detached_since", "cancel_requested",
                   "exit_code", "claim_owner"):
        assert absent not in data
    assert data["driver_epoch"] == 0


@STORE_KIT.add
async def check_unknown_run_reads_none(store: Store) -> None:
    assert await store.get("nope") is None


@STORE_KIT.add
async def check_create_or_resume_never_overwrites(store: Store) -> None:
    first = await store.create_or_resume(NewRun("r", "t1", started_at=T0), now=T0)
    again = await store.create_or_resume(
        NewRun("r", "t2", started_at=T0 + 50, status=RunStatus.INTERRUPTED, harness="x"),
        now=T0 + 50,
    )
    assert again == first
    assert await store.get("r") == first


@STORE_KIT.add
async def check_create_refuses_existing_id(store: Store) -> None:
    first = await new_run(store, "r")
    with raises(RunExists):
        await store.create(NewRun("r", "other"), now=T0 + 5)
    assert await store.get("r") == first


@STORE_KIT.add
async def check_update_unknown_run_is_noop(store: Store) -> None:
    assert await store.update("ghost", RunPatch(status=RunStatus.FAILED)) is None
    assert await store.get("ghost") is None


@STORE_KIT.add
async def check_patch_sets_and_clears_each_field_distinctly(store: Store) -> None:
    await new_run(store, "r")
    values: dict[str, Any] = {
        "finished_at": T0 + 9,
        "exit_code": 3,
        "error": RunError("boom", "E1"),
        "usage": {"input_tokens": 5},
        "sandbox_key": "key-1",
        "sandbox_ref": {"provider": "local", "id": "s1"},
        "harness": "command",
        "spec": {"argv": ["x"]},
        "journal": {"path": "/j"},
        "detached_since": T0 + 3,
        "cancel_requested": False,
    }
    await store.update("r", RunPatch(**values), now=T0 + 10)
    got = await store.get("r")
    assert got is not None
    for name, value in values.items():
        assert getattr(got, name) == value, name
    assert got.cancel_requested is False  # False is a value, distinct from absent
    for name in values:
        before = await store.get("r")
        assert before is not None
        clear: dict[str, Any] = {name: None}
        await store.update("r", RunPatch(**clear))
        after = await store.get("r")
        assert after is not None
        assert getattr(after, name) is None, name
        assert name not in after.to_dict()
        # Only the named field changed.
        for other in values:
            if other != name:
                assert getattr(after, other) == getattr(before, other), (name, other)
    assert (await store.get("r")) is not None


@STORE_KIT.add
async def check_empty_patch_leaves_fields_alone(store: Store) -> None:
    await new_run(store, "r")
    await store.update("r", RunPatch(detached_since=T0 + 1, sandbox_key="k"))
    await store.update("r", RunPatch(status=RunStatus.INTERRUPTED))
    got = await store.get("r")
    assert got is not None
    assert (got.status, got.detached_since, got.sandbox_key) == (
        RunStatus.INTERRUPTED, T0 + 1, "k")


@STORE_KIT.add
async def check_fenced_update_refuses_stale_epoch(store: Store) -> None:
    await new_run(store, "r")
    first = await store.acquire_claim("r", "a", 1.0, now=T0)
    second = await store.acquire_claim("r", "b", 1.0, now=T0 + 5)  # a's lease expired
    before = await store.get("r")
    with raises(ClaimLost) as info:
        await store.update(
            "r", RunPatch(status=RunStatus.COMPLETED, finished_at=T0 + 6),
            expect_epoch=first.epoch,
        )
    assert info.value.observed_epoch == second.epoch
    assert await store.get("r") == before
    done = await store.update(
        "r", RunPatch(status=RunStatus.COMPLETED), expect_epoch=second.epoch)
    assert done is not None and done.status is RunStatus.COMPLETED


@STORE_KIT.add
async def check_find_active_run(store: Store) -> None:
    assert await store.find_active_run("t") is None
    await new_run(store, "old", "t", started_at=T0)
    await new_run(store, "new", "t", started_at=T0 + 10)
    await new_run(store, "paused", "t", started_at=T0 + 20)
    await store.update("paused", RunPatch(status=RunStatus.INTERRUPTED))
    await new_run(store, "done", "t", started_at=T0 + 30)
    await store.update("done", RunPatch(status=RunStatus.COMPLETED))
    await new_run(store, "elsewhere", "u", started_at=T0 + 40)
    active = await store.find_active_run("t")
    assert active is not None and active.run_id == "new"
    await store.update("new", RunPatch(status=RunStatus.ABORTED))
    active = await store.find_active_run("t")
    assert active is not None and active.run_id == "old"


@STORE_KIT.add
async def check_list_by_thread_oldest_first(store: Store) -> None:
    await new_run(store, "b", "t", started_at=T0 + 2)
    await new_run(store, "a", "t", started_at=T0 + 1)
    await new_run(store, "c", "t", started_at=T0 + 3)
    await new_run(store, "x", "other")
    assert [r.run_id for r in await store.list_by_thread("t")] == ["a", "b", "c"]
    assert await store.list_by_thread("nobody") == []


@STORE_KIT.add
async def check_list_reclaimable_inclusive_cutoff(store: Store) -> None:
    await new_run(store, "at-cutoff")
    await store.update("at-cutoff", RunPatch(detached_since=T0 + 100))
    await new_run(store, "younger")
    await store.update("younger", RunPatch(detached_since=T0 + 100.5))
    await new_run(store, "attached")
    await new_run(store, "finished")
    await store.update(
        "finished", RunPatch(detached_since=T0, status=RunStatus.COMPLETED))
    await new_run(store, "paused")
    await store.update(
        "paused", RunPatch(detached_since=T0, status=RunStatus.INTERRUPTED))
    found = await store.list_reclaimable(now=T0 + 160, ttl=60)
    assert sorted(r.run_id for r in found) == ["at-cutoff"]
    found = await store.list_reclaimable(now=T0 + 200, ttl=0)
    assert sorted(r.run_id for r in found) == ["at-cutoff", "younger"]


@STORE_KIT.add
async def check_list_reclaimable_oldest_first_and_limit(store: Store) -> None:
    for name, since in [("b", 30), ("a", 10), ("tie-1", 20), ("tie-2", 20), ("young", 90)]:
        await new_run(store, name)
        await store.update(name, RunPatch(detached_since=T0 + since))
    await new_run(store, "attached")
    found = await store.list_reclaimable(now=T0 + 50, ttl=0)
    assert [r.run_id for r in found] == ["a", "tie-1", "tie-2", "b"]
    found = await store.list_reclaimable(now=T0 + 50, ttl=0, limit=2)
    assert [r.run_id for r in found] == ["a", "tie-1"]
    assert await store.list_reclaimable(now=T0 + 50, ttl=0, limit=0) == []
    found = await store.list_reclaimable(now=T0 + 100, ttl=0, limit=10)
    assert [r.run_id for r in found] == ["a", "tie-1", "tie-2", "b", "young"]
    with raises(StoreError, match="limit"):
        await store.list_reclaimable(now=T0, ttl=0, limit=-1)


@STORE_KIT.add
async def check_list_reclaimable_lapsed_lease_counts_from_its_end(store: Store) -> None:
    """A driver that died without detaching leaves a lease that lapses: from its end
    the run is as unattended as a detached one (inclusive cutoff); a live lease or a
    run never claimed is never listed."""
    await new_run(store, "lapsed")
    await store.acquire_claim("lapsed", "dead-driver", 10, now=T0)  # ends T0 + 10
    await new_run(store, "live")
    await store.acquire_claim("live", "driver", 100, now=T0)  # ends T0 + 100
    await new_run(store, "never-claimed")
    await new_run(store, "done")
    await store.acquire_claim("done", "driver", 10, now=T0)
    await store.update("done", RunPatch(status=RunStatus.COMPLETED))
    assert await store.list_reclaimable(now=T0 + 9.9, ttl=0) == []
    found = await store.list_reclaimable(now=T0 + 10, ttl=0)
    assert [r.run_id for r in found] == ["lapsed"]
    assert await store.list_reclaimable(now=T0 + 69.9, ttl=60) == []
    found = await store.list_reclaimable(now=T0 + 70, ttl=60)
    assert [r.run_id for r in found] == ["lapsed"]
    found = await store.list_reclaimable(now=T0 + 100, ttl=0)
    assert [r.run_id for r in found] == ["lapsed", "live"]


@STORE_KIT.add
async def check_list_reclaimable_released_claim_counts_from_the_release(store: Store) -> None:
    """A driver that released its claim and died before the next one took it (between
    ``start`` and ``drive``, or before stamping a detach) leaves a reapable run."""
    await new_run(store, "r")
    claim = await store.acquire_claim("r", "starter", 30, now=T0)
    await store.release_claim(claim)
    rec = await store.get("r")
    assert rec is not None and rec.claim_owner is None
    assert rec.claim_expires_at is not None and rec.claim_expires_at <= T0 + 30
    released = rec.claim_expires_at
    assert await store.list_reclaimable(now=released - 0.5, ttl=0) == []
    found = await store.list_reclaimable(now=released, ttl=0)
    assert [r.run_id for r in found] == ["r"]
    # a new driver takes it: not listed while its lease lives
    await store.acquire_claim("r", "successor", 30, now=released + 1)
    assert await store.list_reclaimable(now=released + 2, ttl=0) == []


@STORE_KIT.add
async def check_list_reclaimable_detached_since_wins_and_order_mixes_both(store: Store) -> None:
    """``detached_since`` decides when set (a server may drive a detached run under a
    live lease); runs of both kinds are listed oldest first together."""
    await new_run(store, "detached-held")
    await store.acquire_claim("detached-held", "server", 1000, now=T0)
    await store.update("detached-held", RunPatch(detached_since=T0 + 5))
    await new_run(store, "lapsed")
    await store.acquire_claim("lapsed", "dead", 10, now=T0)  # ends T0 + 10
    await new_run(store, "detached")
    await store.update("detached", RunPatch(detached_since=T0 + 20))
    found = await store.list_reclaimable(now=T0 + 30, ttl=0)
    assert [r.run_id for r in found] == ["detached-held", "lapsed", "detached"]
    found = await store.list_reclaimable(now=T0 + 30, ttl=0, limit=2)
    assert [r.run_id for r in found] == ["detached-held", "lapsed"]
    found = await store.list_reclaimable(now=T0 + 30, ttl=20)
    assert [r.run_id for r in found] == ["detached-held", "lapsed"]


@STORE_KIT.add
async def check_request_cancel_is_sticky_and_atomic(store: Store) -> None:
    assert await store.request_cancel("ghost") is None
    await new_run(store, "r")
    await store.update("r", RunPatch(detached_since=T0 + 1))
    got = await store.request_cancel("r")
    assert got is not None and got.cancel_requested is True
    assert got.detached_since == T0 + 1 and got.status is RunStatus.RUNNING
    await new_run(store, "done")
    await store.update("done", RunPatch(status=RunStatus.COMPLETED))
    unchanged = await store.request_cancel("done")
    assert unchanged is not None and unchanged.cancel_requested is None


@STORE_KIT.add
async def check_records_are_not_shared_with_callers(store: Store) -> None:
    usage = {"input_tokens": 1}
    await new_run(store, "r")
    await store.update("r", RunPatch(usage=usage))
    usage["input_tokens"] = 999
    got = await store.get("r")
    assert got is not None and got.usage == {"input_tokens": 1}


# ------------------------------------------------------------------ list runs
# ``list_runs``: newest first, filtered by status, limited.

@STORE_KIT.add
async def check_newest_first_with_status_filter_and_limit(store: Store) -> None:
    for i in range(5):
        await store.create(NewRun(run_id=f"r{i}", thread_id="t", started_at=T0 + i), now=T0 + i)
    await store.update("r3", RunPatch(status=RunStatus.COMPLETED))
    assert [r.run_id for r in await store.list_runs()] == ["r4", "r3", "r2", "r1", "r0"]
    assert [r.run_id for r in await store.list_runs(limit=2)] == ["r4", "r3"]
    done = await store.list_runs(status=RunStatus.COMPLETED)
    assert [r.run_id for r in done] == ["r3"]
    with raises(StoreError):
        await store.list_runs(limit=0)


# ------------------------------------------------------------------ claims
# Leases, epochs and refusals.

@STORE_KIT.add
async def check_claims_bump_the_epoch(store: Store) -> None:
    await new_run(store, "r")
    c1 = await store.acquire_claim("r", "a", 10, now=T0)
    assert c1.epoch == 1 and c1.expires_at == T0 + 10
    await store.release_claim(c1)
    rec = await store.get("r")
    assert rec is not None and rec.driver_epoch == 1 and rec.claim_owner is None
    c2 = await store.acquire_claim("r", "b", 10, now=T0 + 1)
    assert c2.epoch == 2
    rec = await store.get("r")
    assert rec is not None and (rec.claim_owner, rec.driver_epoch) == ("b", 2)


@STORE_KIT.add
async def check_refused_claim_changes_nothing(store: Store) -> None:
    """Every refusal reason, each on its own run: the refusal names it, nothing changes."""
    for reason in RefusalReason:
        run_id = f"r-{reason.name.lower()}"
        if reason is not RefusalReason.UNKNOWN:
            await new_run(store, run_id)
            await store.update(run_id, RunPatch(detached_since=T0 + 1))
        if reason is RefusalReason.TERMINAL:
            await store.update(run_id, RunPatch(status=RunStatus.FAILED))
        elif reason is RefusalReason.CANCELLED:
            await store.request_cancel(run_id)
        elif reason is RefusalReason.HELD:
            await store.acquire_claim(run_id, "holder", 30, now=T0)
        before = await store.get(run_id)
        with raises(ClaimRefused) as info:
            await store.acquire_claim(run_id, "me", 30, now=T0 + 10, clear_detached=True)
        assert info.value.reason is reason, (reason, info.value.reason)
        assert "driver claim not acquired" in str(info.value)
        assert await store.get(run_id) == before, reason


@STORE_KIT.add
async def check_cancelled_run_claimable_for_finalizing(store: Store) -> None:
    await new_run(store, "r")
    await store.request_cancel("r")
    claim = await store.acquire_claim("r", "reaper", 5, now=T0, allow_cancelled=True)
    assert claim.epoch == 1


@STORE_KIT.add
async def check_interrupted_is_claimable(store: Store) -> None:
    await new_run(store, "r")
    await store.update("r", RunPatch(status=RunStatus.INTERRUPTED))
    assert (await store.acquire_claim("r", "a", 5, now=T0)).epoch == 1


@STORE_KIT.add
async def check_expired_lease_can_be_taken_over(store: Store) -> None:
    await new_run(store, "r")
    await store.acquire_claim("r", "a", 10, now=T0)
    with raises(ClaimRefused):
        await store.acquire_claim("r", "b", 10, now=T0 + 9.9)
    taken = await store.acquire_claim("r", "b", 10, now=T0 + 10)  # expiry is inclusive
    assert taken.epoch == 2


@STORE_KIT.add
async def check_break_lease_only_of_the_named_owner(store: Store) -> None:
    await new_run(store, "r")
    await store.acquire_claim("r", "dead-driver", 30, now=T0)
    with raises(ClaimRefused) as info:
        await store.acquire_claim("r", "b", 10, now=T0 + 1, break_lease_of="someone-else")
    assert info.value.reason is RefusalReason.HELD
    taken = await store.acquire_claim("r", "b", 10, now=T0 + 1, break_lease_of="dead-driver")
    assert taken.epoch == 2
    # the broken owner is fenced: its appends no longer land
    with raises(ClaimLost):
        await store.append("r", [({"type": "CUSTOM"}, 0)], epoch=1)


@STORE_KIT.add
async def check_renew_and_loss(store: Store) -> None:
    await new_run(store, "r")
    a = await store.acquire_claim("r", "a", 10, now=T0)
    a = await store.renew_claim(a, 10, now=T0 + 8)
    assert a.expires_at == T0 + 18
    with raises(ClaimRefused):
        await store.acquire_claim("r", "b", 10, now=T0 + 15)
    b = await store.acquire_claim("r", "b", 10, now=T0 + 18)
    with raises(ClaimLost) as info:
        await store.renew_claim(a, 10, now=T0 + 18.5)
    assert (info.value.held_epoch, info.value.observed_epoch) == (1, 2)
    await store.release_claim(a)  # stale release must not drop b's lease
    rec = await store.get("r")
    assert rec is not None and rec.claim_owner == "b"
    await store.release_claim(b)
    with raises(ClaimLost):
        await store.renew_claim(b, 10)


@STORE_KIT.add
async def check_claim_can_clear_detached_since(store: Store) -> None:
    await new_run(store, "r")
    await store.update("r", RunPatch(detached_since=T0 + 1, sandbox_key="k"))
    c = await store.acquire_claim("r", "a", 5, now=T0 + 2)
    rec = await store.get("r")
    assert rec is not None and rec.detached_since == T0 + 1
    await store.release_claim(c)
    await store.acquire_claim("r", "b", 5, now=T0 + 3, clear_detached=True)
    rec = await store.get("r")
    assert rec is not None and rec.detached_since is None and rec.sandbox_key == "k"


# ------------------------------------------------------------------ event log
# Append with the epoch fence, read/tail, close, snapshot.

@STORE_KIT.add
async def check_offsets_gap_free_and_increasing(store: Store) -> None:
    epoch = await claimed_run(store)
    assert await store.append("run-1", [(event(1), 10)], epoch=epoch) == [1]
    assert await store.append("run-1", [(event(2), 20), (event(3), 30)], epoch=epoch) == [2, 3]
    assert await store.append("run-1", [], epoch=epoch) == []
    snap = await store.snapshot("run-1")
    assert [(e.offset, e.journal_offset, e.event["delta"]) for e in snap] == [
        (1, 10, "d1"), (2, 20, "d2"), (3, 30, "d3")]
    tail = await store.tail("run-1")
    assert (tail.last_offset, tail.last_journal_offset, tail.closed) == (3, 30, False)


@STORE_KIT.add
async def check_tail_keeps_the_highest_journal_offset(store: Store) -> None:
    """An event logged out of band at a stale journal offset (an approval request
    raced by a batch) must not send a successor back over lines already logged."""
    epoch = await claimed_run(store)
    await store.append("run-1", [(event(1), 10), (event(2), 40)], epoch=epoch)
    await store.append("run-1", [(event(3), 25)], epoch=epoch)
    tail = await store.tail("run-1")
    assert (tail.last_offset, tail.last_journal_offset) == (3, 40)
    assert [e.journal_offset for e in await store.snapshot("run-1")] == [10, 40, 25]


@STORE_KIT.add
async def check_events_round_trip_as_json(store: Store) -> None:
    epoch = await claimed_run(store)
    event = {"type": "CUSTOM", "name": "x", "value": {"a": [1, 2.5, None, True], "ü": "é"}}
    await store.append("run-1", [(event, 0)], epoch=epoch)
    assert (await store.snapshot("run-1"))[0].event == event


@STORE_KIT.add
async def check_stale_epoch_lands_nothing(store: Store) -> None:
    await new_run(store, "r")
    old = await store.acquire_claim("r", "a", 1, now=T0)
    await store.append("r", [(event(1), 1)], epoch=old.epoch)
    new = await store.acquire_claim("r", "b", 1, now=T0 + 2)
    with raises(ClaimLost) as info:
        await store.append("r", [(event(2), 2), (event(3), 3)], epoch=old.epoch)
    assert (info.value.held_epoch, info.value.observed_epoch) == (old.epoch, new.epoch)
    assert [e.offset for e in await store.snapshot("r")] == [1]
    assert await store.append("r", [(event(2), 2)], epoch=new.epoch) == [2]


@STORE_KIT.add
async def check_unclaimed_run_takes_no_appends(store: Store) -> None:
    await new_run(store, "r")
    with raises(ClaimLost):
        await store.append("r", [(event(1), 1)], epoch=0)
    assert await store.snapshot("r") == []


@STORE_KIT.add
async def check_unknown_run_and_closed_log(store: Store) -> None:
    with raises(UnknownRun):
        await store.append("ghost", [(event(1), 1)], epoch=1)
    epoch = await claimed_run(store)
    assert await store.close("run-1") is True
    with raises(LogClosed):
        await store.append("run-1", [(event(1), 1)], epoch=epoch)
    assert await store.snapshot("run-1") == []


@STORE_KIT.add
async def check_invalid_batch_lands_nothing(store: Store) -> None:
    """A batch with one bad event (NaN, not JSON, a negative or boolean journal offset, not
    an object) is refused whole."""
    bad_batches: list[Any] = [
        [(event(1), 1), ({"x": float("nan")}, 2)],
        [(event(1), 1), ({"x": object()}, 2)],
        [(event(1), 1), (event(2), -1)],
        [(event(1), 1), (event(2), True)],
        [(event(1), 1), (["not", "a", "dict"], 2)],
    ]
    epoch = await claimed_run(store)
    for bad in bad_batches:
        with raises(InvalidEvent):
            await store.append("run-1", bad, epoch=epoch)
        assert await store.snapshot("run-1") == [], bad


@STORE_KIT.add
async def check_read_from_offset_tails_until_closed(store: Store) -> None:
    epoch = await claimed_run(store)
    await store.append("run-1", [(event(1), 1), (event(2), 2)], epoch=epoch)
    got: list[int] = []
    with anyio.fail_after(DEADLINE):
        async with anyio.create_task_group() as tg:

            async def reader() -> None:
                async for e in store.read("run-1", after=1):
                    got.append(e.offset)

            tg.start_soon(reader)
            await wait_until_async(lambda: got == [2], "the reader to see offset 2", timeout=DEADLINE)
            await store.append("run-1", [(event(3), 3)], epoch=epoch)
            await wait_until_async(lambda: got == [2, 3], "the reader to see offset 3", timeout=DEADLINE)
            await store.append("run-1", [(event(4), 4), (event(5), 5)], epoch=epoch)
            await store.close("run-1")
    assert got == [2, 3, 4, 5]


@STORE_KIT.add
async def check_terminal_event_does_not_end_a_read(store: Store) -> None:
    epoch = await claimed_run(store)
    await store.append("run-1", [({"type": "RUN_FINISHED"}, 1)], epoch=epoch)
    got: list[str] = []
    with anyio.fail_after(DEADLINE):
        async with anyio.create_task_group() as tg:

            async def reader() -> None:
                async for e in store.read("run-1"):
                    got.append(e.event["type"])

            tg.start_soon(reader)
            await wait_until_async(lambda: len(got) == 1, "the reader to see the first event", timeout=DEADLINE)
            await store.append("run-1", [({"type": "RUN_STARTED"}, 2)], epoch=epoch)
            await wait_until_async(lambda: len(got) == 2, "the reader to see the second event", timeout=DEADLINE)
            await store.close("run-1")
    assert got == ["RUN_FINISHED", "RUN_STARTED"]


@STORE_KIT.add
async def check_read_of_closed_log_returns_everything_then_ends(store: Store) -> None:
    epoch = await claimed_run(store)
    await store.append("run-1", [(event(i), i) for i in range(1, 2501)], epoch=epoch)
    await store.close("run-1")
    with anyio.fail_after(DEADLINE):
        offsets = [e.offset async for e in store.read("run-1")]
    assert offsets == list(range(1, 2501))


@STORE_KIT.add
async def check_read_unknown_run_raises(store: Store) -> None:
    with raises(UnknownRun):
        async for _ in store.read("ghost"):
            pass
    with raises(UnknownRun):  # the server's event stream relies on this
        await store.tail("ghost")


@STORE_KIT.add
async def check_close_never_fenced(store: Store) -> None:
    await new_run(store, "r")
    old = await store.acquire_claim("r", "a", 1, now=T0)
    new = await store.acquire_claim("r", "b", 1, now=T0 + 2)
    # A superseded driver's close neither raises nor ends its successor's log.
    assert await store.close("r", epoch=old.epoch) is False
    assert (await store.tail("r")).closed is False
    assert await store.append("r", [(event(1), 1)], epoch=new.epoch) == [1]
    assert await store.close("r", epoch=new.epoch) is True
    assert await store.close("r", epoch=new.epoch) is True  # idempotent
    assert await store.close("r") is True
    assert (await store.tail("r")).closed is True
    assert await store.close("ghost") is False


@STORE_KIT.add
async def check_snapshot_never_waits_and_is_a_copy(store: Store) -> None:
    assert await store.snapshot("ghost") == []
    epoch = await claimed_run(store)
    with anyio.fail_after(DEADLINE):
        assert await store.snapshot("run-1") == []
    await store.append("run-1", [(event(1), 1)], epoch=epoch)
    snap = await store.snapshot("run-1")
    snap[0].event["delta"] = "mutated"
    assert (await store.snapshot("run-1"))[0].event["delta"] == "d1"


@STORE_KIT.add
async def check_many_readers_see_every_event(store: Store) -> None:
    epoch = await claimed_run(store)
    results: list[list[int]] = [[], [], []]
    with anyio.fail_after(DEADLINE):
        async with anyio.create_task_group() as tg:
            for sink in results:

                async def reader(sink: list[int] = sink) -> None:
                    async for e in store.read("run-1"):
                        sink.append(e.offset)

                tg.start_soon(reader)
            for i in range(1, 41):
                await store.append("run-1", [(event(i), i)], epoch=epoch)
                if i % 7 == 0:
                    await anyio.lowlevel.checkpoint()
            await store.close("run-1")
    assert results == [list(range(1, 41))] * 3


@STORE_KIT.add
async def check_logs_are_per_run(store: Store) -> None:
    e1 = await claimed_run(store, "a")
    e2 = await claimed_run(store, "b")
    await store.append("a", [(event(1), 1)], epoch=e1)
    await store.append("b", [(event(1), 1), (event(2), 2)], epoch=e2)
    await store.close("a")
    assert [e.offset for e in await store.snapshot("a")] == [1]
    assert [e.offset for e in await store.snapshot("b")] == [1, 2]
    assert (await store.tail("b")).closed is False


# ------------------------------------------------------------------ instance store
# Sandbox instance records.

@STORE_KIT.add
async def check_get_upsert_delete(store: Store) -> None:
    assert await store.get_instance("k") is None
    full = InstanceRecord("k", "bubblewrap", "sb-1", "t", T0, latest_snapshot_id="snap",
                          latest_run_id="r", expires_at=T0 + 60, meta={"a": 1})
    await store.upsert_instance(full)
    assert await store.get_instance("k") == full
    bare = InstanceRecord("k", "bubblewrap", "sb-2", "t", T0 + 1)
    await store.upsert_instance(bare)  # full replace: optional fields cleared
    got = await store.get_instance("k")
    assert got == bare
    assert got is not None and "latest_snapshot_id" not in got.to_dict()
    await store.delete_instance("k")
    assert await store.get_instance("k") is None
    await store.delete_instance("k")  # missing is a no-op


@STORE_KIT.add
async def check_list_expired_inclusive(store: Store) -> None:
    await store.upsert_instance(InstanceRecord("a", "p", "1", "t", T0, expires_at=T0 + 10))
    await store.upsert_instance(InstanceRecord("b", "p", "2", "t", T0, expires_at=T0 + 11))
    await store.upsert_instance(InstanceRecord("c", "p", "3", "t", T0))
    assert [r.key for r in await store.list_expired_instances(T0 + 10)] == ["a"]
    assert sorted(r.key for r in await store.list_expired_instances(T0 + 99)) == ["a", "b"]


# ------------------------------------------------------------------ named lock
# Lease locks for once-across-hosts work.

@STORE_KIT.add
async def check_exclusive_until_released_or_expired(store: Store) -> None:
    assert await store.try_lock("reaper", "a", 10, now=T0)
    assert not await store.try_lock("reaper", "b", 10, now=T0 + 5)
    assert await store.try_lock("reaper", "a", 10, now=T0 + 5)  # holder extends
    assert not await store.try_lock("reaper", "b", 10, now=T0 + 14)
    assert await store.try_lock("other", "b", 10, now=T0)  # names are independent
    assert not await store.unlock("reaper", "b")
    assert await store.unlock("reaper", "a")
    assert await store.try_lock("reaper", "b", 10, now=T0 + 14)
    assert await store.try_lock("reaper", "c", 10, now=T0 + 24)  # b's lease lapsed
    assert not await store.unlock("reaper", "b")


# ------------------------------------------------------------------ approvals
# Requests and answers shared by every host: the first answer wins. Keyed by run id; no run
# record is needed.

@STORE_KIT.add
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


@STORE_KIT.add
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


@STORE_KIT.add
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


@STORE_KIT.add
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


@STORE_KIT.add
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


@STORE_KIT.add
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


@STORE_KIT.add
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


# ------------------------------------------------------------------ shared secrets
# corral's own keys. That two store objects (hosts) on one database agree is a property of
# the backend's insert-if-absent; each backend's own tests race processes on one URL.

@STORE_KIT.add
async def check_shared_secret_is_stable_and_per_name(store: Store) -> None:
    first = await store.shared_secret("approvals")
    assert isinstance(first, bytes) and len(first) == 32
    assert await store.shared_secret("approvals") == first
    other = await store.shared_secret("other")
    assert len(other) == 32 and other != first
    assert await store.shared_secret("approvals") == first
    with raises(StoreError):
        await store.shared_secret("")


@STORE_KIT.add
async def check_shared_secret_first_callers_agree(store: Store) -> None:
    got: list[bytes] = []

    async def ask() -> None:
        got.append(await store.shared_secret("fresh"))

    with anyio.fail_after(DEADLINE):
        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(ask)
    assert len(got) == 10 and len(set(got)) == 1


# ------------------------------------------------------------------ deleting runs


@STORE_KIT.add
async def check_delete_run_removes_its_record_log_and_approvals(store: Store) -> None:
    epoch = await claimed_run(store, "gone")
    await store.append("gone", [(event(1), 1), (event(2), 2)], epoch=epoch)
    await store.add_approval(approval("a1", "gone"))
    await store.update("gone", RunPatch(status=RunStatus.COMPLETED, finished_at=T0 + 1))
    await store.close("gone")
    e2 = await claimed_run(store, "kept")  # a neighbour of the same thread: untouched
    await store.append("kept", [(event(1), 1)], epoch=e2)
    await store.add_approval(approval("a1", "kept"))
    assert await store.delete_run("gone") is True
    assert await store.get("gone") is None
    assert await store.snapshot("gone") == []
    with raises(UnknownRun):
        await store.tail("gone")
    with raises(UnknownRun):
        async for _ in store.read("gone"):
            pass
    assert await store.get_approval("gone", "a1") is None
    assert await store.list_pending_approvals("gone") == []
    assert [r.run_id for r in await store.list_by_thread("thread-1")] == ["kept"]
    assert [r.run_id for r in await store.list_runs()] == ["kept"]
    assert [e.offset for e in await store.snapshot("kept")] == [1]
    assert await store.get_approval("kept", "a1") is not None
    assert await store.delete_run("gone") is False  # once
    assert await store.delete_run("never") is False
    # the id may be used again: a new run, with a log of its own (nothing comes back)
    await new_run(store, "gone")
    claim = await store.acquire_claim("gone", "host-b", 30.0)
    assert await store.append("gone", [(event(9), 9)], epoch=claim.epoch) == [1]
    assert [e.event["delta"] for e in await store.snapshot("gone")] == ["d9"]
    assert await store.get_approval("gone", "a1") is None


@STORE_KIT.add
async def check_delete_run_refuses_a_run_that_has_not_ended(store: Store) -> None:
    epoch = await claimed_run(store, "live")
    await store.append("live", [(event(1), 1)], epoch=epoch)
    await new_run(store, "paused")
    await store.update("paused", RunPatch(status=RunStatus.INTERRUPTED))
    for run_id, status in (("live", "running"), ("paused", "interrupted")):
        before = await store.get(run_id)
        with raises(RunActive) as info:
            await store.delete_run(run_id)
        assert info.value.status == status
        assert await store.get(run_id) == before
    assert [e.offset for e in await store.snapshot("live")] == [1]
    for status in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.ABORTED):
        await new_run(store, f"ended-{status.value}")
        await store.update(f"ended-{status.value}", RunPatch(status=status))
        assert await store.delete_run(f"ended-{status.value}") is True


@STORE_KIT.add
async def check_delete_run_ends_a_tail_of_its_log(store: Store) -> None:
    # an ended run whose log was never closed (its driver died between the two writes)
    epoch = await claimed_run(store)
    await store.append("run-1", [(event(1), 1)], epoch=epoch)
    await store.update("run-1", RunPatch(status=RunStatus.FAILED))
    got: list[int] = []
    ended: list[BaseException] = []
    with anyio.fail_after(DEADLINE):
        async with anyio.create_task_group() as tg:

            async def reader() -> None:
                try:
                    async for e in store.read("run-1"):
                        got.append(e.offset)
                except UnknownRun as exc:
                    ended.append(exc)

            tg.start_soon(reader)
            await wait_until_async(lambda: got == [1], "the reader to see offset 1",
                                   timeout=DEADLINE)
            assert await store.delete_run("run-1") is True
    assert got == [1] and len(ended) == 1


def _head_checkpoint(cid: str, thread: str, at: float) -> Checkpoint:
    return Checkpoint(cid, thread, None, at, "/workspace",
                      (CheckpointEntry("d", "dir", 0o755),
                       CheckpointEntry("d/empty", "file", 0o644)), meta={"n": cid})


@STORE_KIT.add
async def check_thread_head_is_the_newest_run_and_checkpoint(store: Store) -> None:
    empty = await store.thread_head("t")
    assert empty.checkpoint is None and empty.last_run is None
    await new_run(store, "b", "t", started_at=T0 + 2)
    await new_run(store, "a", "t", started_at=T0 + 1)
    await new_run(store, "tie", "t", started_at=T0 + 2)  # same start: creation order
    await new_run(store, "other", "u", started_at=T0 + 9)
    for cid, thread, at in (("ckpt-2", "t", T0 + 2), ("ckpt-1", "t", T0 + 1),
                            ("ckpt-3", "t", T0 + 2), ("ckpt-9", "u", T0 + 9)):
        await store.put_checkpoint(_head_checkpoint(cid, thread, at))
    head = await store.thread_head("t")
    assert head.last_run is not None and head.last_run.run_id == "tie"
    assert head.last_run == (await store.list_by_thread("t"))[-1]
    assert head.checkpoint is not None and head.checkpoint.checkpoint_id == "ckpt-3"
    assert head.checkpoint.meta == {"n": "ckpt-3"}  # the whole manifest
    assert head.checkpoint.entries == _head_checkpoint("ckpt-3", "t", T0 + 2).entries
    assert (await store.list_checkpoints("t"))[-1].checkpoint_id == "ckpt-3"
    but = await store.thread_head("t", but="tie")
    assert but.last_run is not None and but.last_run.run_id == "b"
    assert but.checkpoint is not None and but.checkpoint.checkpoint_id == "ckpt-3"
    only = await store.thread_head("u", but="other")
    assert only.last_run is None
    assert only.checkpoint is not None and only.checkpoint.checkpoint_id == "ckpt-9"


async def check_store(make_store: Factory, *, only: Iterable[str] | None = None) -> KitReport:
    """Run the store kit against stores made by ``make_store`` (one fresh store per check);
    raise :class:`~corral.testing.KitFailed` naming every failed check, else return the
    report. ``only`` names the checks to run (all by default)."""
    return await STORE_KIT.verify(make_store, only=only)
