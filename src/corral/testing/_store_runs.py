"""Store kit, run records: create, resume, patch semantics, queries, ``list_runs``,
deleting an ended run (and refusing one that has not ended) and a thread's head in one read."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel

from corral.stores._protocols import (
    ClaimLost, NewRun, RunActive, RunExists, Store, StoreError, UnknownRun,
)
from corral.stores._checkpoints import Checkpoint, CheckpointEntry
from corral.stores._records import RunError, RunPatch, RunStatus
from corral.testing._kit import Kit, raises
from corral.testing._polling import wait_until_async
from corral.testing._store_fixtures import DEADLINE, T0, approval, claimed_run, event, new_run

__all__ = ["RUN_CHECKS"]

RUN_CHECKS: Kit[Store] = Kit("store")
"""This part's checks, in the order written (the store kit joins the parts)."""


# ------------------------------------------------------------------ run store contract
# Run records: create, resume, patch semantics, queries.

@RUN_CHECKS.add
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


@RUN_CHECKS.add
async def check_unknown_run_reads_none(store: Store) -> None:
    assert await store.get("nope") is None


@RUN_CHECKS.add
async def check_create_or_resume_never_overwrites(store: Store) -> None:
    first = await store.create_or_resume(NewRun("r", "t1", started_at=T0), now=T0)
    again = await store.create_or_resume(
        NewRun("r", "t2", started_at=T0 + 50, status=RunStatus.INTERRUPTED, harness="x"),
        now=T0 + 50,
    )
    assert again == first
    assert await store.get("r") == first


@RUN_CHECKS.add
async def check_create_refuses_existing_id(store: Store) -> None:
    first = await new_run(store, "r")
    with raises(RunExists):
        await store.create(NewRun("r", "other"), now=T0 + 5)
    assert await store.get("r") == first


@RUN_CHECKS.add
async def check_update_unknown_run_is_noop(store: Store) -> None:
    assert await store.update("ghost", RunPatch(status=RunStatus.FAILED)) is None
    assert await store.get("ghost") is None


@RUN_CHECKS.add
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


@RUN_CHECKS.add
async def check_empty_patch_leaves_fields_alone(store: Store) -> None:
    await new_run(store, "r")
    await store.update("r", RunPatch(detached_since=T0 + 1, sandbox_key="k"))
    await store.update("r", RunPatch(status=RunStatus.INTERRUPTED))
    got = await store.get("r")
    assert got is not None
    assert (got.status, got.detached_since, got.sandbox_key) == (
        RunStatus.INTERRUPTED, T0 + 1, "k")


@RUN_CHECKS.add
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


@RUN_CHECKS.add
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


@RUN_CHECKS.add
async def check_list_by_thread_oldest_first(store: Store) -> None:
    await new_run(store, "b", "t", started_at=T0 + 2)
    await new_run(store, "a", "t", started_at=T0 + 1)
    await new_run(store, "c", "t", started_at=T0 + 3)
    await new_run(store, "x", "other")
    assert [r.run_id for r in await store.list_by_thread("t")] == ["a", "b", "c"]
    assert await store.list_by_thread("nobody") == []


@RUN_CHECKS.add
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


@RUN_CHECKS.add
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


@RUN_CHECKS.add
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


@RUN_CHECKS.add
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


@RUN_CHECKS.add
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


@RUN_CHECKS.add
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


@RUN_CHECKS.add
async def check_records_are_not_shared_with_callers(store: Store) -> None:
    usage = {"input_tokens": 1}
    await new_run(store, "r")
    await store.update("r", RunPatch(usage=usage))
    usage["input_tokens"] = 999
    got = await store.get("r")
    assert got is not None and got.usage == {"input_tokens": 1}


# ------------------------------------------------------------------ list runs
# ``list_runs``: newest first, filtered by status, limited.

@RUN_CHECKS.add
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


# ------------------------------------------------------------------ deleting runs


@RUN_CHECKS.add
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


@RUN_CHECKS.add
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


@RUN_CHECKS.add
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


@RUN_CHECKS.add
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
