"""Store conformance suite.

Every backend (memory, SQLite, and third-party ones) must pass these classes. To run them
against your backend, import the classes into a test module and provide an async ``store``
fixture that yields a fresh, empty store implementing :class:`corral.stores._protocols.Store`::

    from corral.testing._stores import *  # noqa: F403

    @pytest.fixture
    async def store():
        s = await open_my_store()
        yield s
        await s.aclose()

The tests use anyio's pytest plugin (``@pytest.mark.anyio``) on the asyncio backend; your
module may override the ``anyio_backend`` fixture.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from corral.runs._claims import hold_claim
from corral.runs._pipe import PipeResult, ProducerExit, pipe_to_run_log
from corral.stores._records import RunError, RunPatch, RunRecord, RunStatus
from corral.stores._protocols import (
    ClaimLost,
    ClaimRefused,
    InstanceRecord,
    InvalidEvent,
    LogClosed,
    NewRun,
    RefusalReason,
    RunExists,
    Store,
    StoreError,
    UnknownRun,
)

__all__ = [
    "TestClaims",
    "TestListRuns",
    "TestEventLog",
    "TestInstanceStore",
    "TestNamedLock",
    "TestPipeToRunLog",
    "TestRunStoreContract",
]

T0 = 1_700_000_000.0
DEADLINE = 10.0


async def _run(store: Store, run_id: str = "run-1", thread_id: str = "thread-1",
               started_at: float = T0, **extra: Any) -> RunRecord:
    return await store.create(NewRun(run_id, thread_id, started_at=started_at, **extra), now=T0)


async def _claimed(store: Store, run_id: str = "run-1", owner: str = "host-a") -> int:
    """Create a run and claim it; returns the epoch."""
    await _run(store, run_id)
    claim = await store.acquire_claim(run_id, owner, 30.0)
    return claim.epoch


def _ev(i: int, **more: Any) -> dict[str, Any]:
    return {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": f"d{i}", **more}


@pytest.mark.anyio
class TestRunStoreContract:
    """Run records: create, resume, patch semantics, queries."""

    async def test_create_and_get_round_trip(self, store: Store) -> None:
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

    async def test_unknown_run_reads_none(self, store: Store) -> None:
        assert await store.get("nope") is None

    async def test_create_or_resume_never_overwrites(self, store: Store) -> None:
        first = await store.create_or_resume(NewRun("r", "t1", started_at=T0), now=T0)
        again = await store.create_or_resume(
            NewRun("r", "t2", started_at=T0 + 50, status=RunStatus.INTERRUPTED, harness="x"),
            now=T0 + 50,
        )
        assert again == first
        assert await store.get("r") == first

    async def test_create_refuses_existing_id(self, store: Store) -> None:
        first = await _run(store, "r")
        with pytest.raises(RunExists):
            await store.create(NewRun("r", "other"), now=T0 + 5)
        assert await store.get("r") == first

    async def test_update_unknown_run_is_noop(self, store: Store) -> None:
        assert await store.update("ghost", RunPatch(status=RunStatus.FAILED)) is None
        assert await store.get("ghost") is None

    async def test_patch_sets_and_clears_each_field_distinctly(self, store: Store) -> None:
        await _run(store, "r")
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

    async def test_empty_patch_leaves_fields_alone(self, store: Store) -> None:
        await _run(store, "r")
        await store.update("r", RunPatch(detached_since=T0 + 1, sandbox_key="k"))
        await store.update("r", RunPatch(status=RunStatus.INTERRUPTED))
        got = await store.get("r")
        assert got is not None
        assert (got.status, got.detached_since, got.sandbox_key) == (
            RunStatus.INTERRUPTED, T0 + 1, "k")

    async def test_fenced_update_refuses_stale_epoch(self, store: Store) -> None:
        await _run(store, "r")
        first = await store.acquire_claim("r", "a", 1.0, now=T0)
        second = await store.acquire_claim("r", "b", 1.0, now=T0 + 5)  # a's lease expired
        before = await store.get("r")
        with pytest.raises(ClaimLost) as info:
            await store.update(
                "r", RunPatch(status=RunStatus.COMPLETED, finished_at=T0 + 6),
                expect_epoch=first.epoch,
            )
        assert info.value.observed_epoch == second.epoch
        assert await store.get("r") == before
        done = await store.update(
            "r", RunPatch(status=RunStatus.COMPLETED), expect_epoch=second.epoch)
        assert done is not None and done.status is RunStatus.COMPLETED

    async def test_find_active_run(self, store: Store) -> None:
        assert await store.find_active_run("t") is None
        await _run(store, "old", "t", started_at=T0)
        await _run(store, "new", "t", started_at=T0 + 10)
        await _run(store, "paused", "t", started_at=T0 + 20)
        await store.update("paused", RunPatch(status=RunStatus.INTERRUPTED))
        await _run(store, "done", "t", started_at=T0 + 30)
        await store.update("done", RunPatch(status=RunStatus.COMPLETED))
        await _run(store, "elsewhere", "u", started_at=T0 + 40)
        active = await store.find_active_run("t")
        assert active is not None and active.run_id == "new"
        await store.update("new", RunPatch(status=RunStatus.ABORTED))
        active = await store.find_active_run("t")
        assert active is not None and active.run_id == "old"

    async def test_list_by_thread_oldest_first(self, store: Store) -> None:
        await _run(store, "b", "t", started_at=T0 + 2)
        await _run(store, "a", "t", started_at=T0 + 1)
        await _run(store, "c", "t", started_at=T0 + 3)
        await _run(store, "x", "other")
        assert [r.run_id for r in await store.list_by_thread("t")] == ["a", "b", "c"]
        assert await store.list_by_thread("nobody") == []

    async def test_list_reclaimable_inclusive_cutoff(self, store: Store) -> None:
        await _run(store, "at-cutoff")
        await store.update("at-cutoff", RunPatch(detached_since=T0 + 100))
        await _run(store, "younger")
        await store.update("younger", RunPatch(detached_since=T0 + 100.5))
        await _run(store, "attached")
        await _run(store, "finished")
        await store.update(
            "finished", RunPatch(detached_since=T0, status=RunStatus.COMPLETED))
        await _run(store, "paused")
        await store.update(
            "paused", RunPatch(detached_since=T0, status=RunStatus.INTERRUPTED))
        found = await store.list_reclaimable(now=T0 + 160, ttl=60)
        assert sorted(r.run_id for r in found) == ["at-cutoff"]
        found = await store.list_reclaimable(now=T0 + 200, ttl=0)
        assert sorted(r.run_id for r in found) == ["at-cutoff", "younger"]

    async def test_list_reclaimable_oldest_first_and_limit(self, store: Store) -> None:
        for name, since in [("b", 30), ("a", 10), ("tie-1", 20), ("tie-2", 20), ("young", 90)]:
            await _run(store, name)
            await store.update(name, RunPatch(detached_since=T0 + since))
        await _run(store, "attached")
        found = await store.list_reclaimable(now=T0 + 50, ttl=0)
        assert [r.run_id for r in found] == ["a", "tie-1", "tie-2", "b"]
        found = await store.list_reclaimable(now=T0 + 50, ttl=0, limit=2)
        assert [r.run_id for r in found] == ["a", "tie-1"]
        assert await store.list_reclaimable(now=T0 + 50, ttl=0, limit=0) == []
        found = await store.list_reclaimable(now=T0 + 100, ttl=0, limit=10)
        assert [r.run_id for r in found] == ["a", "tie-1", "tie-2", "b", "young"]
        with pytest.raises(StoreError, match="limit"):
            await store.list_reclaimable(now=T0, ttl=0, limit=-1)

    async def test_list_reclaimable_lapsed_lease_counts_from_its_end(self, store: Store) -> None:
        """A driver that died without detaching leaves a lease that lapses: from its end
        the run is as unattended as a detached one (inclusive cutoff); a live lease or a
        run never claimed is never listed."""
        await _run(store, "lapsed")
        await store.acquire_claim("lapsed", "dead-driver", 10, now=T0)  # ends T0 + 10
        await _run(store, "live")
        await store.acquire_claim("live", "driver", 100, now=T0)  # ends T0 + 100
        await _run(store, "never-claimed")
        await _run(store, "done")
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

    async def test_list_reclaimable_released_claim_counts_from_the_release(
        self, store: Store
    ) -> None:
        """A driver that released its claim and died before the next one took it (between
        ``start`` and ``drive``, or before stamping a detach) leaves a reapable run."""
        await _run(store, "r")
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

    async def test_list_reclaimable_detached_since_wins_and_order_mixes_both(
        self, store: Store
    ) -> None:
        """``detached_since`` decides when set (a server may drive a detached run under a
        live lease); runs of both kinds are listed oldest first together."""
        await _run(store, "detached-held")
        await store.acquire_claim("detached-held", "server", 1000, now=T0)
        await store.update("detached-held", RunPatch(detached_since=T0 + 5))
        await _run(store, "lapsed")
        await store.acquire_claim("lapsed", "dead", 10, now=T0)  # ends T0 + 10
        await _run(store, "detached")
        await store.update("detached", RunPatch(detached_since=T0 + 20))
        found = await store.list_reclaimable(now=T0 + 30, ttl=0)
        assert [r.run_id for r in found] == ["detached-held", "lapsed", "detached"]
        found = await store.list_reclaimable(now=T0 + 30, ttl=0, limit=2)
        assert [r.run_id for r in found] == ["detached-held", "lapsed"]
        found = await store.list_reclaimable(now=T0 + 30, ttl=20)
        assert [r.run_id for r in found] == ["detached-held", "lapsed"]

    async def test_request_cancel_is_sticky_and_atomic(self, store: Store) -> None:
        assert await store.request_cancel("ghost") is None
        await _run(store, "r")
        await store.update("r", RunPatch(detached_since=T0 + 1))
        got = await store.request_cancel("r")
        assert got is not None and got.cancel_requested is True
        assert got.detached_since == T0 + 1 and got.status is RunStatus.RUNNING
        await _run(store, "done")
        await store.update("done", RunPatch(status=RunStatus.COMPLETED))
        unchanged = await store.request_cancel("done")
        assert unchanged is not None and unchanged.cancel_requested is None

    async def test_records_are_not_shared_with_callers(self, store: Store) -> None:
        usage = {"input_tokens": 1}
        await _run(store, "r")
        await store.update("r", RunPatch(usage=usage))
        usage["input_tokens"] = 999
        got = await store.get("r")
        assert got is not None and got.usage == {"input_tokens": 1}


@pytest.mark.anyio
class TestListRuns:
    """``list_runs``: newest first, filtered by status, limited."""

    async def test_newest_first_with_status_filter_and_limit(self, store: Store) -> None:
        for i in range(5):
            await store.create(NewRun(run_id=f"r{i}", thread_id="t", started_at=T0 + i), now=T0 + i)
        await store.update("r3", RunPatch(status=RunStatus.COMPLETED))
        assert [r.run_id for r in await store.list_runs()] == ["r4", "r3", "r2", "r1", "r0"]
        assert [r.run_id for r in await store.list_runs(limit=2)] == ["r4", "r3"]
        done = await store.list_runs(status=RunStatus.COMPLETED)
        assert [r.run_id for r in done] == ["r3"]
        with pytest.raises(StoreError):
            await store.list_runs(limit=0)


@pytest.mark.anyio
class TestClaims:
    """Leases, epochs and refusals."""

    async def test_claims_bump_the_epoch(self, store: Store) -> None:
        await _run(store, "r")
        c1 = await store.acquire_claim("r", "a", 10, now=T0)
        assert c1.epoch == 1 and c1.expires_at == T0 + 10
        await store.release_claim(c1)
        rec = await store.get("r")
        assert rec is not None and rec.driver_epoch == 1 and rec.claim_owner is None
        c2 = await store.acquire_claim("r", "b", 10, now=T0 + 1)
        assert c2.epoch == 2
        rec = await store.get("r")
        assert rec is not None and (rec.claim_owner, rec.driver_epoch) == ("b", 2)

    @pytest.mark.parametrize("reason", list(RefusalReason))
    async def test_refused_claim_changes_nothing(self, store: Store, reason: RefusalReason) -> None:
        if reason is not RefusalReason.UNKNOWN:
            await _run(store, "r")
            await store.update("r", RunPatch(detached_since=T0 + 1))
        if reason is RefusalReason.TERMINAL:
            await store.update("r", RunPatch(status=RunStatus.FAILED))
        elif reason is RefusalReason.CANCELLED:
            await store.request_cancel("r")
        elif reason is RefusalReason.HELD:
            await store.acquire_claim("r", "holder", 30, now=T0)
        before = await store.get("r")
        with pytest.raises(ClaimRefused) as info:
            await store.acquire_claim("r", "me", 30, now=T0 + 10, clear_detached=True)
        assert info.value.reason is reason
        assert "driver claim not acquired" in str(info.value)
        assert await store.get("r") == before

    async def test_cancelled_run_claimable_for_finalizing(self, store: Store) -> None:
        await _run(store, "r")
        await store.request_cancel("r")
        claim = await store.acquire_claim("r", "reaper", 5, now=T0, allow_cancelled=True)
        assert claim.epoch == 1

    async def test_interrupted_is_claimable(self, store: Store) -> None:
        await _run(store, "r")
        await store.update("r", RunPatch(status=RunStatus.INTERRUPTED))
        assert (await store.acquire_claim("r", "a", 5, now=T0)).epoch == 1

    async def test_expired_lease_can_be_taken_over(self, store: Store) -> None:
        await _run(store, "r")
        await store.acquire_claim("r", "a", 10, now=T0)
        with pytest.raises(ClaimRefused):
            await store.acquire_claim("r", "b", 10, now=T0 + 9.9)
        taken = await store.acquire_claim("r", "b", 10, now=T0 + 10)  # expiry is inclusive
        assert taken.epoch == 2

    async def test_break_lease_only_of_the_named_owner(self, store: Store) -> None:
        await _run(store, "r")
        await store.acquire_claim("r", "dead-driver", 30, now=T0)
        with pytest.raises(ClaimRefused) as info:
            await store.acquire_claim("r", "b", 10, now=T0 + 1, break_lease_of="someone-else")
        assert info.value.reason is RefusalReason.HELD
        taken = await store.acquire_claim("r", "b", 10, now=T0 + 1, break_lease_of="dead-driver")
        assert taken.epoch == 2
        # the broken owner is fenced: its appends no longer land
        with pytest.raises(ClaimLost):
            await store.append("r", [({"type": "CUSTOM"}, 0)], epoch=1)

    async def test_renew_and_loss(self, store: Store) -> None:
        await _run(store, "r")
        a = await store.acquire_claim("r", "a", 10, now=T0)
        a = await store.renew_claim(a, 10, now=T0 + 8)
        assert a.expires_at == T0 + 18
        with pytest.raises(ClaimRefused):
            await store.acquire_claim("r", "b", 10, now=T0 + 15)
        b = await store.acquire_claim("r", "b", 10, now=T0 + 18)
        with pytest.raises(ClaimLost) as info:
            await store.renew_claim(a, 10, now=T0 + 18.5)
        assert (info.value.held_epoch, info.value.observed_epoch) == (1, 2)
        await store.release_claim(a)  # stale release must not drop b's lease
        rec = await store.get("r")
        assert rec is not None and rec.claim_owner == "b"
        await store.release_claim(b)
        with pytest.raises(ClaimLost):
            await store.renew_claim(b, 10)

    async def test_claim_can_clear_detached_since(self, store: Store) -> None:
        await _run(store, "r")
        await store.update("r", RunPatch(detached_since=T0 + 1, sandbox_key="k"))
        c = await store.acquire_claim("r", "a", 5, now=T0 + 2)
        rec = await store.get("r")
        assert rec is not None and rec.detached_since == T0 + 1
        await store.release_claim(c)
        await store.acquire_claim("r", "b", 5, now=T0 + 3, clear_detached=True)
        rec = await store.get("r")
        assert rec is not None and rec.detached_since is None and rec.sandbox_key == "k"

    async def test_hold_claim_renews_and_releases(self, store: Store) -> None:
        await _run(store, "r")
        with anyio.fail_after(DEADLINE):
            async with hold_claim(store, "r", "a", ttl=0.6, renew_every=0.05) as held:
                assert held.epoch == 1
                first_expiry = held.claim.expires_at
                while held.claim.expires_at == first_expiry:
                    await anyio.sleep(0.02)
                rec = await store.get("r")
                assert rec is not None and rec.claim_expires_at == held.claim.expires_at
        rec = await store.get("r")
        assert rec is not None and rec.claim_owner is None and rec.driver_epoch == 1

    async def test_hold_claim_cancels_body_on_loss(self, store: Store) -> None:
        await _run(store, "r")
        reached_end = False
        with anyio.fail_after(DEADLINE):
            with pytest.raises(ClaimLost):
                async with hold_claim(store, "r", "a", ttl=0.3, renew_every=0.05) as held:
                    # A successor takes over once the lease would have lapsed.
                    await store.acquire_claim(
                        "r", "b", 30, now=held.claim.expires_at + 1)
                    await anyio.sleep_forever()
                    reached_end = True
        assert not reached_end
        rec = await store.get("r")
        assert rec is not None and rec.claim_owner == "b"  # the loser released nothing

    async def test_hold_claim_refused_runs_no_body(self, store: Store) -> None:
        ran = False
        with pytest.raises(ClaimRefused):
            async with hold_claim(store, "ghost", "a", ttl=5):
                ran = True
        assert not ran

    async def test_hold_claim_body_error_propagates_and_releases(self, store: Store) -> None:
        await _run(store, "r")
        with pytest.raises(KeyError):
            async with hold_claim(store, "r", "a", ttl=5):
                raise KeyError("body failed")
        rec = await store.get("r")
        assert rec is not None and rec.claim_owner is None


@pytest.mark.anyio
class TestEventLog:
    """Append with the epoch fence, read/tail, close, snapshot."""

    async def test_offsets_gap_free_and_increasing(self, store: Store) -> None:
        epoch = await _claimed(store)
        assert await store.append("run-1", [(_ev(1), 10)], epoch=epoch) == [1]
        assert await store.append("run-1", [(_ev(2), 20), (_ev(3), 30)], epoch=epoch) == [2, 3]
        assert await store.append("run-1", [], epoch=epoch) == []
        snap = await store.snapshot("run-1")
        assert [(e.offset, e.journal_offset, e.event["delta"]) for e in snap] == [
            (1, 10, "d1"), (2, 20, "d2"), (3, 30, "d3")]
        tail = await store.tail("run-1")
        assert (tail.last_offset, tail.last_journal_offset, tail.closed) == (3, 30, False)

    async def test_tail_keeps_the_highest_journal_offset(self, store: Store) -> None:
        """An event logged out of band at a stale journal offset (an approval request
        raced by a batch) must not send a successor back over lines already logged."""
        epoch = await _claimed(store)
        await store.append("run-1", [(_ev(1), 10), (_ev(2), 40)], epoch=epoch)
        await store.append("run-1", [(_ev(3), 25)], epoch=epoch)
        tail = await store.tail("run-1")
        assert (tail.last_offset, tail.last_journal_offset) == (3, 40)
        assert [e.journal_offset for e in await store.snapshot("run-1")] == [10, 40, 25]

    async def test_events_round_trip_as_json(self, store: Store) -> None:
        epoch = await _claimed(store)
        event = {"type": "CUSTOM", "name": "x", "value": {"a": [1, 2.5, None, True], "ü": "é"}}
        await store.append("run-1", [(event, 0)], epoch=epoch)
        assert (await store.snapshot("run-1"))[0].event == event

    async def test_stale_epoch_lands_nothing(self, store: Store) -> None:
        await _run(store, "r")
        old = await store.acquire_claim("r", "a", 1, now=T0)
        await store.append("r", [(_ev(1), 1)], epoch=old.epoch)
        new = await store.acquire_claim("r", "b", 1, now=T0 + 2)
        with pytest.raises(ClaimLost) as info:
            await store.append("r", [(_ev(2), 2), (_ev(3), 3)], epoch=old.epoch)
        assert (info.value.held_epoch, info.value.observed_epoch) == (old.epoch, new.epoch)
        assert [e.offset for e in await store.snapshot("r")] == [1]
        assert await store.append("r", [(_ev(2), 2)], epoch=new.epoch) == [2]

    async def test_unclaimed_run_takes_no_appends(self, store: Store) -> None:
        await _run(store, "r")
        with pytest.raises(ClaimLost):
            await store.append("r", [(_ev(1), 1)], epoch=0)
        assert await store.snapshot("r") == []

    async def test_unknown_run_and_closed_log(self, store: Store) -> None:
        with pytest.raises(UnknownRun):
            await store.append("ghost", [(_ev(1), 1)], epoch=1)
        epoch = await _claimed(store)
        assert await store.close("run-1") is True
        with pytest.raises(LogClosed):
            await store.append("run-1", [(_ev(1), 1)], epoch=epoch)
        assert await store.snapshot("run-1") == []

    @pytest.mark.parametrize(
        "bad",
        [
            [(_ev(1), 1), ({"x": float("nan")}, 2)],
            [(_ev(1), 1), ({"x": object()}, 2)],
            [(_ev(1), 1), (_ev(2), -1)],
            [(_ev(1), 1), (_ev(2), True)],
            [(_ev(1), 1), (["not", "a", "dict"], 2)],
        ],
    )
    async def test_invalid_batch_lands_nothing(self, store: Store, bad: Any) -> None:
        epoch = await _claimed(store)
        with pytest.raises(InvalidEvent):
            await store.append("run-1", bad, epoch=epoch)
        assert await store.snapshot("run-1") == []

    async def test_read_from_offset_tails_until_closed(self, store: Store) -> None:
        epoch = await _claimed(store)
        await store.append("run-1", [(_ev(1), 1), (_ev(2), 2)], epoch=epoch)
        got: list[int] = []
        with anyio.fail_after(DEADLINE):
            async with anyio.create_task_group() as tg:

                async def reader() -> None:
                    async for e in store.read("run-1", after=1):
                        got.append(e.offset)

                tg.start_soon(reader)
                await _until(lambda: got == [2])
                await store.append("run-1", [(_ev(3), 3)], epoch=epoch)
                await _until(lambda: got == [2, 3])
                await store.append("run-1", [(_ev(4), 4), (_ev(5), 5)], epoch=epoch)
                await store.close("run-1")
        assert got == [2, 3, 4, 5]

    async def test_terminal_event_does_not_end_a_read(self, store: Store) -> None:
        epoch = await _claimed(store)
        await store.append("run-1", [({"type": "RUN_FINISHED"}, 1)], epoch=epoch)
        got: list[str] = []
        with anyio.fail_after(DEADLINE):
            async with anyio.create_task_group() as tg:

                async def reader() -> None:
                    async for e in store.read("run-1"):
                        got.append(e.event["type"])

                tg.start_soon(reader)
                await _until(lambda: len(got) == 1)
                await store.append("run-1", [({"type": "RUN_STARTED"}, 2)], epoch=epoch)
                await _until(lambda: len(got) == 2)
                await store.close("run-1")
        assert got == ["RUN_FINISHED", "RUN_STARTED"]

    async def test_read_of_closed_log_returns_everything_then_ends(self, store: Store) -> None:
        epoch = await _claimed(store)
        await store.append("run-1", [(_ev(i), i) for i in range(1, 2501)], epoch=epoch)
        await store.close("run-1")
        with anyio.fail_after(DEADLINE):
            offsets = [e.offset async for e in store.read("run-1")]
        assert offsets == list(range(1, 2501))

    async def test_read_unknown_run_raises(self, store: Store) -> None:
        with pytest.raises(UnknownRun):
            async for _ in store.read("ghost"):
                pass
        with pytest.raises(UnknownRun):  # the server's event stream relies on this
            await store.tail("ghost")

    async def test_close_never_fenced(self, store: Store) -> None:
        await _run(store, "r")
        old = await store.acquire_claim("r", "a", 1, now=T0)
        new = await store.acquire_claim("r", "b", 1, now=T0 + 2)
        # A superseded driver's close neither raises nor ends its successor's log.
        assert await store.close("r", epoch=old.epoch) is False
        assert (await store.tail("r")).closed is False
        assert await store.append("r", [(_ev(1), 1)], epoch=new.epoch) == [1]
        assert await store.close("r", epoch=new.epoch) is True
        assert await store.close("r", epoch=new.epoch) is True  # idempotent
        assert await store.close("r") is True
        assert (await store.tail("r")).closed is True
        assert await store.close("ghost") is False

    async def test_snapshot_never_waits_and_is_a_copy(self, store: Store) -> None:
        assert await store.snapshot("ghost") == []
        epoch = await _claimed(store)
        with anyio.fail_after(DEADLINE):
            assert await store.snapshot("run-1") == []
        await store.append("run-1", [(_ev(1), 1)], epoch=epoch)
        snap = await store.snapshot("run-1")
        snap[0].event["delta"] = "mutated"
        assert (await store.snapshot("run-1"))[0].event["delta"] == "d1"

    async def test_many_readers_see_every_event(self, store: Store) -> None:
        epoch = await _claimed(store)
        results: list[list[int]] = [[], [], []]
        with anyio.fail_after(DEADLINE):
            async with anyio.create_task_group() as tg:
                for sink in results:

                    async def reader(sink: list[int] = sink) -> None:
                        async for e in store.read("run-1"):
                            sink.append(e.offset)

                    tg.start_soon(reader)
                for i in range(1, 41):
                    await store.append("run-1", [(_ev(i), i)], epoch=epoch)
                    if i % 7 == 0:
                        await anyio.lowlevel.checkpoint()
                await store.close("run-1")
        assert results == [list(range(1, 41))] * 3

    async def test_logs_are_per_run(self, store: Store) -> None:
        e1 = await _claimed(store, "a")
        e2 = await _claimed(store, "b")
        await store.append("a", [(_ev(1), 1)], epoch=e1)
        await store.append("b", [(_ev(1), 1), (_ev(2), 2)], epoch=e2)
        await store.close("a")
        assert [e.offset for e in await store.snapshot("a")] == [1]
        assert [e.offset for e in await store.snapshot("b")] == [1, 2]
        assert (await store.tail("b")).closed is False


@pytest.mark.anyio
class TestInstanceStore:
    """Sandbox instance records."""

    async def test_get_upsert_delete(self, store: Store) -> None:
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

    async def test_list_expired_inclusive(self, store: Store) -> None:
        await store.upsert_instance(InstanceRecord("a", "p", "1", "t", T0, expires_at=T0 + 10))
        await store.upsert_instance(InstanceRecord("b", "p", "2", "t", T0, expires_at=T0 + 11))
        await store.upsert_instance(InstanceRecord("c", "p", "3", "t", T0))
        assert [r.key for r in await store.list_expired_instances(T0 + 10)] == ["a"]
        assert sorted(r.key for r in await store.list_expired_instances(T0 + 99)) == ["a", "b"]


@pytest.mark.anyio
class TestNamedLock:
    """Lease locks for once-across-hosts work."""

    async def test_exclusive_until_released_or_expired(self, store: Store) -> None:
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


class _Counting:
    """Delegates to a store and counts ``close`` calls."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.closes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def close(self, run_id: str, *, epoch: int | None = None) -> bool:
        self.closes += 1
        return await self.inner.close(run_id, epoch=epoch)


class _FlakyTerminal:
    """Delegates to a store; its terminal status writes fail ``failures`` times first (as a
    refused transaction: nothing written). ``calls`` records refused/stored/close."""

    def __init__(self, inner: Store, failures: int) -> None:
        self.inner = inner
        self.failures = failures
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def update(self, run_id: str, patch: RunPatch, **kw: Any) -> RunRecord | None:
        if not patch.is_terminal:
            return await self.inner.update(run_id, patch, **kw)
        if self.failures > 0:
            self.failures -= 1
            self.calls.append("refused")
            raise StoreError("database is locked")
        self.calls.append("stored")
        return await self.inner.update(run_id, patch, **kw)

    async def close(self, run_id: str, *, epoch: int | None = None) -> bool:
        self.calls.append("close")
        return await self.inner.close(run_id, epoch=epoch)


async def _until(cond: Any, timeout: float = DEADLINE) -> None:
    with anyio.fail_after(timeout):
        while not cond():
            await anyio.sleep(0.005)


async def _events(items: list[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item


def _types(snapshot: list[Any]) -> list[str]:
    return [e.event["type"] for e in snapshot]


@pytest.mark.anyio
class TestPipeToRunLog:
    """The status table: exactly one terminal status and one close on every path."""

    async def _pipe(self, store: Store, events: Any, **kw: Any) -> tuple[PipeResult, _Counting]:
        epoch = kw.pop("epoch", None)
        if epoch is None:
            epoch = await _claimed(store)
        counting = _Counting(store)
        with anyio.fail_after(DEADLINE):
            result = await pipe_to_run_log(counting, "run-1", events, epoch=epoch, **kw)
        assert counting.closes == 1
        assert (await store.tail("run-1")).closed is not result.claim_lost
        return result, counting

    async def test_completed(self, store: Store) -> None:
        items = [({"type": "RUN_STARTED"}, 5), (_ev(1), 9), ({"type": "RUN_FINISHED"}, 12)]
        result, _ = await self._pipe(store, _events(items))
        assert result.status is RunStatus.COMPLETED and result.record is not None
        assert result.record.status is RunStatus.COMPLETED
        assert result.record.finished_at is not None
        snap = await store.snapshot("run-1")
        assert _types(snap) == ["RUN_STARTED", "TEXT_MESSAGE_CONTENT", "RUN_FINISHED"]
        assert [e.journal_offset for e in snap] == [5, 9, 12]

    async def test_run_error_event_fails_and_stops_pulling(self, store: Store) -> None:
        closed = anyio.Event()

        async def producer() -> AsyncIterator[Any]:
            try:
                yield (_ev(1), 1)
                yield ({"type": "RUN_ERROR", "message": "model said no", "code": "E42"}, 2)
                yield (_ev(3), 3)
            finally:
                closed.set()

        result, _ = await self._pipe(store, producer())
        assert result.status is RunStatus.FAILED
        assert result.record is not None and result.record.error == RunError("model said no", "E42")
        assert _types(await store.snapshot("run-1")) == ["TEXT_MESSAGE_CONTENT", "RUN_ERROR"]
        assert closed.is_set()  # the producer was closed, not left for the GC

    async def test_producer_raises(self, store: Store) -> None:
        async def producer() -> AsyncIterator[Any]:
            yield (_ev(1), 7)
            raise RuntimeError("journal vanished")

        result, _ = await self._pipe(store, producer())
        assert result.status is RunStatus.FAILED
        assert result.record is not None and result.record.error is not None
        assert "journal vanished" in result.record.error.message
        snap = await store.snapshot("run-1")
        assert _types(snap) == ["TEXT_MESSAGE_CONTENT", "RUN_ERROR"]
        assert snap[-1].journal_offset == 7

    async def test_abort_before_start(self, store: Store) -> None:
        abort = anyio.Event()
        abort.set()
        pulled = False

        async def producer() -> AsyncIterator[Any]:
            nonlocal pulled
            pulled = True
            yield (_ev(1), 1)

        result, _ = await self._pipe(store, producer(), abort=abort)
        assert result.status is RunStatus.ABORTED and not pulled
        assert result.record is not None and result.record.status is RunStatus.ABORTED
        assert _types(await store.snapshot("run-1")) == ["RUN_ERROR"]

    async def test_abort_then_producer_ends_stream_is_aborted(self, store: Store) -> None:
        abort = anyio.Event()

        async def producer() -> AsyncIterator[Any]:
            yield (_ev(1), 1)
            abort.set()  # signal-aware producers end their stream when aborted
            return

        result, _ = await self._pipe(store, producer(), abort=abort)
        assert result.status is RunStatus.ABORTED
        assert result.record is not None and result.record.status is RunStatus.ABORTED

    async def test_abort_between_events_then_finishes_on_its_own(self, store: Store) -> None:
        abort = anyio.Event()

        async def producer() -> AsyncIterator[Any]:
            yield (_ev(1), 1)
            yield (_ev(2), 2)
            abort.set()
            yield ProducerExit(exit_code=0)

        result, _ = await self._pipe(store, producer(), abort=abort)
        assert result.status is RunStatus.ABORTED
        assert _types(await store.snapshot("run-1"))[:2] == ["TEXT_MESSAGE_CONTENT"] * 2

    async def test_abort_then_producer_yields_again_drops_the_event(self, store: Store) -> None:
        abort = anyio.Event()

        async def producer() -> AsyncIterator[Any]:
            yield (_ev(1), 1)
            abort.set()
            yield (_ev(2), 2)

        result, _ = await self._pipe(store, producer(), abort=abort)
        assert result.status is RunStatus.ABORTED
        deltas = [e.event.get("delta") for e in await store.snapshot("run-1")]
        assert "d2" not in deltas and deltas[0] == "d1"

    async def test_abort_while_producer_waits(self, store: Store) -> None:
        abort = anyio.Event()

        async def producer() -> AsyncIterator[Any]:
            yield (_ev(1), 1)
            await anyio.sleep_forever()
            yield (_ev(2), 2)

        async def fire() -> None:
            await anyio.sleep(0.05)
            abort.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(fire)
            result, _ = await self._pipe(store, producer(), abort=abort)
        assert result.status is RunStatus.ABORTED

    async def test_aborted_producer_that_raises_is_failed(self, store: Store) -> None:
        abort = anyio.Event()

        async def producer() -> AsyncIterator[Any]:
            yield (_ev(1), 1)
            abort.set()
            raise ConnectionError("torn down")

        result, _ = await self._pipe(store, producer(), abort=abort)
        assert result.status is RunStatus.FAILED

    async def test_nonzero_exit_fails_and_records_exit_code(self, store: Store) -> None:
        items = [(_ev(1), 1), ProducerExit(exit_code=3), (_ev(2), 2)]
        result, _ = await self._pipe(store, _events(items))
        assert result.status is RunStatus.FAILED
        assert result.record is not None and result.record.exit_code == 3
        assert result.record.error is not None and result.record.error.code == "exit_code"
        assert _types(await store.snapshot("run-1")) == ["TEXT_MESSAGE_CONTENT", "RUN_ERROR"]

    async def test_terminal_write_refused_once_is_retried_then_closed(
        self, store: Store
    ) -> None:
        """A transient store error on the terminal write: retried, stored, and only then
        the log closed."""
        epoch = await _claimed(store)
        flaky = _FlakyTerminal(store, failures=1)
        items = [(_ev(1), 1), ({"type": "RUN_FINISHED"}, 2), ProducerExit(exit_code=0)]
        with anyio.fail_after(DEADLINE):
            result = await pipe_to_run_log(flaky, "run-1", _events(items), epoch=epoch)
        assert result.status is RunStatus.COMPLETED and result.record_error is None
        assert result.record is not None and result.record.status is RunStatus.COMPLETED
        assert flaky.calls == ["refused", "stored", "close"]

    async def test_terminal_write_never_stored_leaves_the_log_open(self, store: Store) -> None:
        """A store that keeps refusing: no close (a closed log under a running record could
        never be finished); ``record_error`` says why; a successor ends the run with the
        end already logged, appending nothing."""
        epoch = await _claimed(store)
        flaky = _FlakyTerminal(store, failures=100)
        items = [(_ev(1), 1), ({"type": "RUN_FINISHED"}, 2), ProducerExit(exit_code=0)]
        with anyio.fail_after(DEADLINE):
            result = await pipe_to_run_log(flaky, "run-1", _events(items), epoch=epoch)
        assert result.record_error is not None and "terminal status" in result.record_error
        assert "close" not in flaky.calls
        assert result.record is not None and result.record.status is RunStatus.RUNNING
        assert not (await store.tail("run-1")).closed
        successor = await store.acquire_claim("run-1", "successor", 30, break_lease_of="host-a")
        result, _ = await self._pipe(
            store, _events([ProducerExit(exit_code=0, logged=True)]), epoch=successor.epoch)
        assert result.status is RunStatus.COMPLETED and result.appended == 0
        assert _types(await store.snapshot("run-1")) == ["TEXT_MESSAGE_CONTENT", "RUN_FINISHED"]

    async def test_logged_end_records_the_error_without_appending(self, store: Store) -> None:
        epoch = await _claimed(store)
        await store.append("run-1", [({"type": "RUN_ERROR", "message": "boom"}, 3)], epoch=epoch)
        await store.close("run-1", epoch=epoch)  # as an older driver left it
        end = ProducerExit(exit_code=2, error=RunError("boom"), logged=True)
        result, _ = await self._pipe(store, _events([end]), epoch=epoch)
        assert result.status is RunStatus.FAILED and result.appended == 0
        assert result.record is not None and result.record.error == RunError("boom")
        assert result.record.exit_code == 2
        assert _types(await store.snapshot("run-1")) == ["RUN_ERROR"]

    async def test_zero_exit_completes(self, store: Store) -> None:
        items = [(_ev(1), 1), ({"type": "RUN_FINISHED"}, 2), ProducerExit(exit_code=0)]
        result, _ = await self._pipe(store, _events(items))
        assert result.status is RunStatus.COMPLETED
        assert result.record is not None and result.record.exit_code == 0

    async def test_lost_claim_lands_nothing_and_writes_no_status(self, store: Store) -> None:
        await _run(store, "run-1")
        old = await store.acquire_claim("run-1", "a", 1, now=T0)

        async def producer() -> AsyncIterator[Any]:
            yield (_ev(1), 1)
            # A successor takes over (the old lease lapsed).
            await store.acquire_claim("run-1", "b", 60, now=T0 + 5)
            yield (_ev(2), 2)
            yield (_ev(3), 3)

        result, _ = await self._pipe(store, producer(), epoch=old.epoch)
        assert result.claim_lost
        assert result.record is not None and result.record.status is RunStatus.RUNNING
        assert result.record.finished_at is None and result.record.driver_epoch == 2
        assert [e.event.get("delta") for e in await store.snapshot("run-1")] == ["d1"]
        assert (await store.tail("run-1")).closed is False  # successor's log stays open
        # And the successor can finish the run normally.
        final = await pipe_to_run_log(store, "run-1", _events([(_ev(2), 2)]), epoch=2)
        assert final.status is RunStatus.COMPLETED and not final.claim_lost

    async def test_loser_cannot_overwrite_successors_terminal_status(self, store: Store) -> None:
        await _run(store, "run-1")
        old = await store.acquire_claim("run-1", "a", 1, now=T0)

        async def producer() -> AsyncIterator[Any]:
            new = await store.acquire_claim("run-1", "b", 60, now=T0 + 5)
            await store.update("run-1", RunPatch(status=RunStatus.COMPLETED, finished_at=T0 + 6),
                               expect_epoch=new.epoch)
            raise RuntimeError("predecessor crashed")
            yield  # pragma: no cover

        result, _ = await self._pipe(store, producer(), epoch=old.epoch)
        assert result.claim_lost
        rec = await store.get("run-1")
        assert rec is not None and rec.status is RunStatus.COMPLETED and rec.error is None
        assert await store.snapshot("run-1") == []

    async def test_cancelled_from_outside_records_aborted_and_closes(self, store: Store) -> None:
        epoch = await _claimed(store)
        counting = _Counting(store)
        started = anyio.Event()

        async def producer() -> AsyncIterator[Any]:
            yield (_ev(1), 1)
            started.set()
            await anyio.sleep_forever()
            yield (_ev(2), 2)

        with anyio.fail_after(DEADLINE):
            async with anyio.create_task_group() as tg:

                async def drive() -> None:
                    await pipe_to_run_log(counting, "run-1", producer(), epoch=epoch)

                tg.start_soon(drive)
                await started.wait()
                tg.cancel_scope.cancel()
        assert counting.closes == 1
        rec = await store.get("run-1")
        assert rec is not None and rec.status is RunStatus.ABORTED
        assert (await store.tail("run-1")).closed

    async def test_pipe_under_hold_claim_lost_lease(self, store: Store) -> None:
        await _run(store, "run-1")
        counting = _Counting(store)

        async def producer() -> AsyncIterator[Any]:
            i = 0
            while True:
                i += 1
                yield (_ev(i), i)
                await anyio.sleep(0.01)

        with anyio.fail_after(DEADLINE), pytest.raises(ClaimLost):
            async with hold_claim(store, "run-1", "a", ttl=0.3, renew_every=0.05) as held:

                async def successor() -> None:
                    await anyio.sleep(0.1)
                    await store.acquire_claim("run-1", "b", 60, now=held.claim.expires_at + 1)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(successor)
                    await pipe_to_run_log(counting, "run-1", producer(), epoch=held.epoch)
        assert counting.closes == 1
        rec = await store.get("run-1")
        assert rec is not None and rec.status is RunStatus.RUNNING and rec.driver_epoch == 2
        assert (await store.tail("run-1")).closed is False
        before = len(await store.snapshot("run-1"))
        await anyio.sleep(0.05)
        assert len(await store.snapshot("run-1")) == before  # nothing more lands

