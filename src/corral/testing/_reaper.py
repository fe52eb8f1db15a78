"""Reaper kit: :func:`corral.runs.reap_detached_runs` and :func:`corral.runs.reclaim_sandbox`
over a store, as plain checks.

    from corral.testing import check_reaper

    await check_reaper(make_store)   # one fresh store and world per check; raises KitFailed

The runs are real: each agent is a real process started by the journal supervisor, writing
a real journal in a host-private directory; the reaper probes that journal with
:func:`corral.runs.probe_run_exit` and drives it with the ``command`` harness's translator
(``journal_drive``). Sandboxes are host directories managed by :class:`DirSandboxes`, a
minimal provider whose ``destroy`` stops the agents whose journals live in the sandbox and
deletes the directory (``break_destroy`` makes it fail, standing in for a provider outage).
Every sweep also holds a run that must be left alone, so a sweep that does nothing cannot
pass. Each check's subject is a :class:`ReaperWorld` over a fresh store and a temporary
directory (:mod:`corral.testing._reaper_world`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

import anyio
import anyio.to_thread

from corral.runs import (
    ProbeResult,
    ReapOutcome,
    ReapResult,
    ReclaimOutcome,
    SandboxReclaimFailedError,
    probe_run_exit,
    reap_detached_runs,
    reclaim_sandbox,
    sandbox_reclaimer,
)
from corral.runs._pipe import LogBatch, Produced
from corral.runs._reap_runner import journal_drive, journal_stop
from corral.sandbox._contracts import SandboxRef
from corral.stores._protocols import InstanceRecord, NewRun
from corral.stores._records import RunPatch, RunRecord, RunStatus
from corral.testing._kit import Factory, Kit, KitReport, raises
from corral.testing._reaper_world import (
    LONG,
    QUIET,
    ReaperWorld,
    agent_alive,
    assert_counts,
    assert_untouched,
    entry,
    reaper_world,
)


__all__ = [
    "REAPER_KIT",
    "check_reaper",
    "journal_drive",
    "journal_stop",
    "check_a_live_lease_without_detach_is_never_touched",
    "check_batch_cap_takes_the_oldest_first",
    "check_budget_exceeded_on_finalization_is_an_anomaly",
    "check_budget_is_armed_after_the_quiet_window",
    "check_cancel_recorded_by_a_dead_host_is_still_finalized",
    "check_takeovers_past_the_limit_end_the_run_instead_of_driving_it",
    "check_a_takeover_after_progress_counts_from_one",
    "check_destroy_failed_deletes_the_record_and_reclaimer_raises",
    "check_destroy_failing_is_reclaim_failed_with_transcript_saved",
    "check_destroy_that_hangs_is_bounded_by_its_own_timeout",
    "check_destroyed",
    "check_driver_that_died_without_detaching_is_finalized_after_its_lease",
    "check_expired_finished_agent_completes",
    "check_expired_live_agent_is_stopped_aborted_and_reclaimed",
    "check_failed_agent_is_finalized_with_its_exit_code",
    "check_failed_is_reported_and_the_sweep_goes_on",
    "check_finalized_agent_finished_while_nobody_watched",
    "check_finalized_resumes_after_what_the_dead_host_logged",
    "check_live_driver_elsewhere_is_not_claimed_and_nothing_changes",
    "check_look_alike_sentinels_stay_producing",
    "check_no_sandbox_key_and_not_found",
    "check_nothing_to_do_and_listing_failure_give_full_zero_results",
    "check_producing_agent_is_left_byte_for_byte_alone",
    "check_provider_mismatch_touches_nothing",
    "check_reaper",
    "check_two_reapers_at_once_drive_each_run_at_most_once",
    "check_unknown_touches_nothing_and_says_why",
    "check_viewer_back_between_listing_and_claim_is_not_claimed",
]

# ------------------------------------------------------------------ the suites


REAPER_KIT: Kit[ReaperWorld] = Kit("reaper", subject=reaper_world)
"""Every reaper and reclaim check; the subject is a :class:`ReaperWorld`."""


# ------------------------------------------------------------------ reap outcomes
# Each outcome, in a sweep that also holds a run that must be left alone.

@REAPER_KIT.add
async def check_finalized_agent_finished_while_nobody_watched(reaper_world: ReaperWorld) -> None:
    w = reaper_world
    done = await w.start("printf 'hello\\n'; printf 'world\\n'; printf 'bye'",
                         wait_exit=True)
    busy = await w.start(f"echo working; {LONG}", wait_output="working")
    busy_before = await w.freeze(busy)
    result = await w.sweep()
    assert_counts(result, finalized=1, producing=1)
    assert result.considered == 2 and result.probed == 2
    e = entry(result, done.run_id)
    assert (e.outcome, e.status, e.exit_code) == (
        ReapOutcome.FINALIZED, RunStatus.COMPLETED, 0)
    record = await w.record(done.run_id)
    assert record.status is RunStatus.COMPLETED and record.exit_code == 0
    assert record.detached_since is not None  # the reaper never clears it
    assert await w.text(done.run_id) == "hello\nworld\nbye"
    log = await w.store.snapshot(done.run_id)
    assert [x.offset for x in log] == list(range(1, len(log) + 1))
    assert log[0].event["type"] == "RUN_STARTED"
    assert log[-1].event["type"] == "RUN_FINISHED"
    assert (await w.store.tail(done.run_id)).closed
    assert done.sandbox_id is not None and not w.sandboxes.exists(done.sandbox_id)
    assert await w.store.get_instance(f"key-{done.run_id}") is None
    await assert_untouched(w, busy, busy_before)


@REAPER_KIT.add
async def check_driver_that_died_without_detaching_is_finalized_after_its_lease(
    reaper_world: ReaperWorld
) -> None:
    """No detach at all: the lapsed lease is what makes the run reapable."""
    w = reaper_world
    done = await w.start("echo out", wait_exit=True, detached_ago=None, logged_lines=0)
    busy = await w.start(f"echo working; {LONG}", wait_output="working", detached_ago=None)
    busy_before = await w.freeze(busy)
    result = await w.sweep()
    assert_counts(result, finalized=1, producing=1)
    record = await w.record(done.run_id)
    assert (record.status, record.exit_code) == (RunStatus.COMPLETED, 0)
    assert record.detached_since is None
    assert await w.text(done.run_id) == "out\n"
    assert done.sandbox_id is not None and not w.sandboxes.exists(done.sandbox_id)
    await assert_untouched(w, busy, busy_before)


@REAPER_KIT.add
async def check_a_live_lease_without_detach_is_never_touched(reaper_world: ReaperWorld) -> None:
    """A driver renewing its lease owns the run: not even listed, even with ttl 0."""
    w = reaper_world
    done = await w.start("echo out", wait_exit=True, detached_ago=None)
    await w.store.acquire_claim(done.run_id, "live-driver", 600)
    before = await w.freeze(done)
    busy = await w.start(f"echo working; {LONG}", wait_output="working")
    result = await w.sweep(ttl=0.0, budget=1.0)
    # the detached run is expired (the sweep acts), the held one is not even considered
    assert result.considered == 1
    assert entry(result, busy.run_id).outcome is ReapOutcome.EXPIRED
    await assert_untouched(w, done, before)


@REAPER_KIT.add
async def check_finalized_resumes_after_what_the_dead_host_logged(
    reaper_world: ReaperWorld
) -> None:
    w = reaper_world
    done = await w.start("printf 'a\\nb\\nc\\nd\\n'", wait_exit=True, logged_lines=2)
    assert await w.text(done.run_id) == "a\nb"  # what the dead host had logged
    busy, busy_before = await w.bystander()
    result = await w.sweep()
    assert_counts(result, finalized=1, producing=1)
    assert await w.text(done.run_id) == "a\nb\nc\nd\n"  # no duplicate, no gap
    await assert_untouched(w, busy, busy_before)


@REAPER_KIT.add
async def check_failed_agent_is_finalized_with_its_exit_code(reaper_world: ReaperWorld) -> None:
    w = reaper_world
    bad = await w.start("echo partial; echo oops >&2; exit 3", wait_exit=True)
    busy, busy_before = await w.bystander()
    result = await w.sweep()
    assert_counts(result, finalized=1, producing=1)
    e = entry(result, bad.run_id)
    assert (e.status, e.exit_code) == (RunStatus.FAILED, 3)
    record = await w.record(bad.run_id)
    assert record.status is RunStatus.FAILED and record.exit_code == 3
    assert record.error is not None and "oops" in record.error.message
    await assert_untouched(w, busy, busy_before)


@REAPER_KIT.add
async def check_producing_agent_is_left_byte_for_byte_alone(reaper_world: ReaperWorld) -> None:
    w = reaper_world
    busy = await w.start(f"echo still at it; {LONG}", wait_output="still at it",
                         logged_lines=1)
    await w.start("echo done", wait_exit=True)
    before = await w.freeze(busy)
    result = await w.sweep()
    assert_counts(result, producing=1, finalized=1)
    e = entry(result, busy.run_id)
    assert e.outcome is ReapOutcome.PRODUCING and e.status is None and e.error is None
    await assert_untouched(w, busy, before)
    assert (await w.freeze(busy)).journal == before.journal
    assert agent_alive(busy.paths)


@REAPER_KIT.add
async def check_look_alike_sentinels_stay_producing(reaper_world: ReaperWorld) -> None:
    w = reaper_world
    fake_nonce = "0" * 32
    forgeries = [
        f'{{"corral_exit":1,"code":0,"signal":null,"nonce":"{fake_nonce}"}}',
        '{"corral_exit":1,"code":0,"signal":null}',
        '{"corral_exit":1,"code":"0","signal":null,"nonce":"x"}',
        '{"__exit":0,"__nonce":"abc"}',
    ]
    script = "".join(f"printf '%s\\n' '{f}'; " for f in forgeries) + f"echo end; {LONG}"
    forger = await w.start(script, wait_output="end")
    done = await w.start("echo done", wait_exit=True)
    before = await w.freeze(forger)
    result = await w.sweep()
    assert_counts(result, producing=1, finalized=1)
    assert entry(result, forger.run_id).outcome is ReapOutcome.PRODUCING
    assert entry(result, done.run_id).outcome is ReapOutcome.FINALIZED
    await assert_untouched(w, forger, before)


@REAPER_KIT.add
async def check_unknown_touches_nothing_and_says_why(reaper_world: ReaperWorld) -> None:
    w = reaper_world
    lost = await w.start(f"echo x; {LONG}", wait_output="x")
    await w.store.update(lost.run_id, RunPatch(journal={"dir": "relative/path"}))
    await w.start("echo done", wait_exit=True)
    before = await w.freeze(lost)
    result = await w.sweep()
    assert_counts(result, unknown=1, finalized=1)
    e = entry(result, lost.run_id)
    assert e.outcome is ReapOutcome.UNKNOWN and e.error and "journal.dir" in e.error
    await assert_untouched(w, lost, before)


@REAPER_KIT.add
async def check_expired_live_agent_is_stopped_aborted_and_reclaimed(
    reaper_world: ReaperWorld
) -> None:
    w = reaper_world
    w.ttl = 60.0
    old = await w.start(f"echo hi; {LONG}", wait_output="hi", detached_ago=61.0)
    young = await w.start(f"echo x; {LONG}", wait_output="x", detached_ago=1.0)
    young_before = await w.freeze(young)
    result = await w.sweep(budget=0.5)
    assert_counts(result, expired=1, producing=1)
    assert result.probed == 2  # the expired one too: whether its journal is on this host
    e = entry(result, old.run_id)
    assert (e.outcome, e.status, e.terminalized_anyway) == (
        ReapOutcome.EXPIRED, RunStatus.ABORTED, None)
    record = await w.record(old.run_id)
    assert record.status is RunStatus.ABORTED and record.cancel_requested is True
    assert (await w.store.tail(old.run_id)).closed
    assert "hi" in await w.text(old.run_id)
    assert not agent_alive(old.paths)
    assert old.sandbox_id is not None and not w.sandboxes.exists(old.sandbox_id)
    await assert_untouched(w, young, young_before)


@REAPER_KIT.add
async def check_expired_finished_agent_completes(reaper_world: ReaperWorld) -> None:
    w = reaper_world
    w.ttl = 60.0
    old = await w.start("echo over", wait_exit=True, detached_ago=60.0)  # inclusive
    young = await w.start(f"echo x; {LONG}", wait_output="x", detached_ago=59.0)
    young_before = await w.freeze(young)
    # Pin the cutoff exactly on the expired run's detach time.
    record = await w.record(old.run_id)
    assert record.detached_since is not None
    result = await w.sweep(now=record.detached_since + 60.0, budget=5.0)
    assert_counts(result, expired=1, producing=1)
    assert entry(result, old.run_id).status is RunStatus.COMPLETED
    assert await w.text(old.run_id) == "over\n"
    assert (await w.record(old.run_id)).cancel_requested is True
    await assert_untouched(w, young, young_before)


@REAPER_KIT.add
async def check_viewer_back_between_listing_and_claim_is_not_claimed(
    reaper_world: ReaperWorld
) -> None:
    w = reaper_world
    w.ttl = 60.0
    old = await w.start(f"echo hi; {LONG}", wait_output="hi", detached_ago=120.0)
    young = await w.start(f"echo x; {LONG}", wait_output="x")
    young_before = await w.freeze(young)
    store = w.store

    class ViewerComesBack:
        """The store, but a viewer attaches (claims, clearing detached_since, and
        leaves again) just before the reaper's claim lands."""

        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        async def acquire_claim(self, run_id: str, owner: str, ttl: float,
                                **kw: Any) -> Any:
            if run_id == old.run_id:
                viewer = await store.acquire_claim(run_id, "viewer", 30.0,
                                                   clear_detached=True)
                await store.release_claim(viewer)
            return await store.acquire_claim(run_id, owner, ttl, **kw)

    result = await reap_detached_runs(
        ViewerComesBack(),
        probe=probe_run_exit, drive=journal_drive(store), ttl=60.0, quiet=QUIET,
        budget=2.0, reclaim=sandbox_reclaimer(w.sandboxes, store),
    )
    assert_counts(result, not_claimed=1, producing=1)
    e = entry(result, old.run_id)
    assert e.outcome is ReapOutcome.NOT_CLAIMED and e.error and "viewer" in e.error
    record = await w.record(old.run_id)
    assert record.cancel_requested is None  # no cancel from a stale read
    assert record.status is RunStatus.RUNNING and record.detached_since is None
    assert not (await store.tail(old.run_id)).closed
    assert agent_alive(old.paths)
    assert old.sandbox_id is not None and w.sandboxes.exists(old.sandbox_id)
    await assert_untouched(w, young, young_before)


@REAPER_KIT.add
async def check_live_driver_elsewhere_is_not_claimed_and_nothing_changes(
    reaper_world: ReaperWorld
) -> None:
    w = reaper_world
    w.ttl = 60.0
    held = await w.start("echo done", wait_exit=True, detached_ago=120.0)
    await w.store.acquire_claim(held.run_id, "live-host", 60.0)
    before = await w.freeze(held)
    young = await w.start(f"echo x; {LONG}", wait_output="x")
    young_before = await w.freeze(young)
    result = await w.sweep()
    assert_counts(result, not_claimed=1, producing=1)
    assert "held" in (entry(result, held.run_id).error or "")
    await assert_untouched(w, held, before)
    await assert_untouched(w, young, young_before)


@REAPER_KIT.add
async def check_budget_exceeded_on_finalization_is_an_anomaly(reaper_world: ReaperWorld) -> None:
    w = reaper_world
    done = await w.start("echo done", wait_exit=True)
    busy, busy_before = await w.bystander()
    real = journal_drive(w.store)

    def wedged(record: RunRecord, epoch: int, abort: anyio.Event) -> AsyncIterator[Produced]:
        async def gen() -> AsyncIterator[Produced]:
            yield LogBatch([{"type": "TEXT_MESSAGE_CONTENT", "messageId": "m",
                             "delta": "replaying"}], 0)
            await anyio.sleep_forever()  # a replay that wedged
        return gen() if record.run_id == done.run_id else aiter(real(record, epoch, abort))

    result = await w.sweep(drive=wedged, budget=0.3)
    assert_counts(result, budget_exceeded=1, producing=1)
    e = entry(result, done.run_id)
    assert e.terminalized_anyway is True and e.status is RunStatus.ABORTED
    assert e.exit_code == 0  # what the probe read
    assert (await w.store.tail(done.run_id)).closed
    assert done.sandbox_id is not None and not w.sandboxes.exists(done.sandbox_id)
    await assert_untouched(w, busy, busy_before)


@REAPER_KIT.add
async def check_budget_is_armed_after_the_quiet_window(reaper_world: ReaperWorld) -> None:
    w = reaper_world
    done = await w.start("echo patience", wait_exit=True)
    busy, busy_before = await w.bystander()
    # The quiet window alone outlasts the budget: a budget started before it would
    # record this finished agent as aborted.
    result = await w.sweep(quiet=0.6, budget=0.5)
    assert_counts(result, finalized=1, producing=1)
    assert entry(result, done.run_id).status is RunStatus.COMPLETED
    assert await w.text(done.run_id) == "patience\n"
    await assert_untouched(w, busy, busy_before)


@REAPER_KIT.add
async def check_destroy_failing_is_reclaim_failed_with_transcript_saved(
    reaper_world: ReaperWorld
) -> None:
    w = reaper_world
    done = await w.start("echo saved", wait_exit=True)
    assert done.sandbox_id is not None
    w.sandboxes.break_destroy(done.sandbox_id, "provider API unreachable")
    busy, busy_before = await w.bystander()
    result = await w.sweep()
    assert_counts(result, reclaim_failed=1, producing=1)
    e = entry(result, done.run_id)
    assert (e.status, e.exit_code) == (RunStatus.COMPLETED, 0)
    assert e.error and "provider API unreachable" in e.error and done.run_id in e.error
    assert await w.text(done.run_id) == "saved\n"
    assert w.sandboxes.exists(done.sandbox_id)  # still up: that is the point
    assert await w.store.get_instance(f"key-{done.run_id}") is None
    await assert_untouched(w, busy, busy_before)


@REAPER_KIT.add
async def check_failed_is_reported_and_the_sweep_goes_on(reaper_world: ReaperWorld) -> None:
    w = reaper_world
    first = await w.start("echo a", wait_exit=True, detached_ago=30.0)
    second = await w.start("echo b", wait_exit=True, detached_ago=20.0)
    busy = await w.start(f"echo x; {LONG}", wait_output="x", detached_ago=10.0)
    busy_before = await w.freeze(busy)
    first_before = await w.freeze(first)

    async def probe(record: RunRecord) -> ProbeResult:
        if record.run_id == first.run_id:
            raise OSError("the probe's disk went away")
        return await probe_run_exit(record)

    result = await w.sweep(probe=probe)
    assert_counts(result, failed=1, finalized=1, producing=1)
    assert [x.run_id for x in result.runs] == [first.run_id, second.run_id, busy.run_id]
    assert "disk went away" in (entry(result, first.run_id).error or "")
    await assert_untouched(w, first, first_before)
    await assert_untouched(w, busy, busy_before)


# ------------------------------------------------------------------ reap sweep
# The sweep as a whole: listing, batch cap, order, totality, concurrency.

@REAPER_KIT.add
async def check_batch_cap_takes_the_oldest_first(reaper_world: ReaperWorld) -> None:
    w = reaper_world
    runs = [await w.start("echo x", wait_exit=True, detached_ago=age) for age in (5, 30, 20)]
    result = await w.sweep(max_runs=2)
    assert result.considered == 2
    assert [e.run_id for e in result.runs] == [runs[1].run_id, runs[2].run_id]
    assert_counts(result, finalized=2)
    left = await w.record(runs[0].run_id)
    assert left.status is RunStatus.RUNNING and left.driver_epoch == 1
    again = await w.sweep(max_runs=2)
    assert [e.run_id for e in again.runs] == [runs[0].run_id]


@REAPER_KIT.add
async def check_nothing_to_do_and_listing_failure_give_full_zero_results(
    reaper_world: ReaperWorld
) -> None:
    w = reaper_world
    empty = await w.sweep()
    assert (empty.considered, empty.probed, empty.runs) == (0, 0, [])
    assert_counts(empty)
    store = w.store

    class Broken:
        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        async def list_reclaimable(self, *a: Any, **k: Any) -> list[RunRecord]:
            raise OSError("database is locked")

    await w.start("echo x", wait_exit=True)
    broken = await reap_detached_runs(
        Broken(),
        probe=probe_run_exit, drive=journal_drive(store), ttl=1.0, quiet=QUIET)
    assert broken.considered == 0
    assert_counts(broken)
    d = broken.to_dict()
    assert set(d) == {"considered", "probed", "outcomes", "runs"}
    assert set(d["outcomes"]) == {o.value for o in ReapOutcome}


@REAPER_KIT.add
async def check_two_reapers_at_once_drive_each_run_at_most_once(reaper_world: ReaperWorld) -> None:
    w = reaper_world
    done = [await w.start(f"echo run{i}", wait_exit=True) for i in range(4)]
    busy, busy_before = await w.bystander()
    driven: list[str] = []
    real = journal_drive(w.store)

    def counting(record: RunRecord, epoch: int, abort: anyio.Event) -> AsyncIterator[Produced]:
        driven.append(record.run_id)
        return aiter(real(record, epoch, abort))

    results: list[ReapResult] = []

    async def one(owner: str) -> None:
        results.append(await w.sweep(drive=counting, owner=owner, quiet=0.05))

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, "reaper-a")
        tg.start_soon(one, "reaper-b")
    assert sorted(driven) == sorted(r.run_id for r in done)
    finalized = sum(r.outcomes[ReapOutcome.FINALIZED] for r in results)
    assert finalized == 4
    for r in done:
        assert (await w.record(r.run_id)).status is RunStatus.COMPLETED
        assert await w.text(r.run_id) == f"run{done.index(r)}\n"
    await assert_untouched(w, busy, busy_before)


@REAPER_KIT.add
async def check_cancel_recorded_by_a_dead_host_is_still_finalized(
    reaper_world: ReaperWorld
) -> None:
    w = reaper_world
    done = await w.start("echo fin", wait_exit=True)
    await w.store.request_cancel(done.run_id)
    busy, busy_before = await w.bystander()
    result = await w.sweep()
    assert_counts(result, finalized=1, producing=1)
    assert (await w.record(done.run_id)).status is RunStatus.COMPLETED
    await assert_untouched(w, busy, busy_before)


# ------------------------------------------------------------------ reclaim
# ``reclaim_sandbox`` and ``sandbox_reclaimer``: every outcome and its ordering.

@REAPER_KIT.add
async def check_takeovers_past_the_limit_end_the_run_instead_of_driving_it(
    reaper_world: ReaperWorld
) -> None:
    """The reaper's claim on a run whose driver never let go is a takeover, counted as a
    Runner's driver counts it: two drivers already died at this log offset, so a third
    takeover over a limit of 2 ends the run ``failed`` without replaying its journal."""
    w = reaper_world
    done = await w.start("echo never-replayed", wait_exit=True, detached_ago=None)
    at = (await w.store.tail(done.run_id)).last_offset
    await w.store.update(done.run_id, RunPatch(takeovers={"count": 2, "offset": at}))
    busy, busy_before = await w.bystander()
    result = await w.sweep(max_takeovers=2)
    e = entry(result, done.run_id)
    assert (e.outcome, e.status) == (ReapOutcome.FINALIZED, RunStatus.FAILED), e
    record = await w.record(done.run_id)
    assert record.error is not None and record.error.code == "takeover_limit", record.error
    assert "2 drivers in a row took it over and died" in record.error.message
    assert record.takeovers == {"count": 3, "offset": at}
    assert "never-replayed" not in await w.text(done.run_id)
    log = await w.store.snapshot(done.run_id)
    assert log[-1].event["type"] == "RUN_ERROR" and (await w.store.tail(done.run_id)).closed
    assert done.sandbox_id is not None and not w.sandboxes.exists(done.sandbox_id)
    await assert_untouched(w, busy, busy_before)


@REAPER_KIT.add
async def check_a_takeover_after_progress_counts_from_one(reaper_world: ReaperWorld) -> None:
    """Drivers that died at an earlier log offset do not count: the run made progress
    since, so the reaper's takeover is the first at this offset and it drives the run."""
    w = reaper_world
    done = await w.start("echo replayed", wait_exit=True, detached_ago=None)
    at = (await w.store.tail(done.run_id)).last_offset
    await w.store.update(done.run_id, RunPatch(takeovers={"count": 2, "offset": at - 1}))
    seen: list[Any] = []
    plain = journal_drive(w.store)

    async def drive(record: RunRecord, epoch: int, abort: anyio.Event
                    ) -> AsyncIterator[Produced]:
        seen.append((await w.record(record.run_id)).takeovers)  # under the reaper's claim
        async for item in plain(record, epoch, abort):
            yield item

    result = await w.sweep(max_takeovers=2, drive=drive)
    assert entry(result, done.run_id).status is RunStatus.COMPLETED
    assert seen == [{"count": 1, "offset": at}]
    assert await w.text(done.run_id) == "replayed\n"


async def _bound(w: ReaperWorld, provider: str | None = None) -> tuple[RunRecord, str]:
    sandbox_id, _ = await w.sandboxes.create()
    await w.store.create(NewRun("r-bound", "t", sandbox_key="k1"))
    await w.store.upsert_instance(
        InstanceRecord("k1", provider or w.sandboxes.name, sandbox_id, "t", time.time()))
    return await w.record("r-bound"), sandbox_id


@REAPER_KIT.add
async def check_destroyed(reaper_world: ReaperWorld) -> None:
    w = reaper_world
    record, sandbox_id = await _bound(w)
    out = await reclaim_sandbox(record, provider=w.sandboxes, instances=w.store)
    assert out is ReclaimOutcome.DESTROYED
    assert not w.sandboxes.exists(sandbox_id)
    assert await w.store.get_instance("k1") is None


@REAPER_KIT.add
async def check_no_sandbox_key_and_not_found(reaper_world: ReaperWorld) -> None:
    w = reaper_world
    await w.store.create(NewRun("bare", "t"))
    await w.store.create(NewRun("dangling", "t", sandbox_key="nowhere"))
    _, sandbox_id = await _bound(w)
    reclaim = sandbox_reclaimer(w.sandboxes, w.store)
    assert await reclaim(await w.record("bare")) is ReclaimOutcome.NO_SANDBOX_KEY
    assert await reclaim(await w.record("dangling")) is ReclaimOutcome.NOT_FOUND
    assert w.sandboxes.destroyed == [] and w.sandboxes.exists(sandbox_id)
    assert await w.store.get_instance("k1") is not None


@REAPER_KIT.add
async def check_provider_mismatch_touches_nothing(reaper_world: ReaperWorld) -> None:
    w = reaper_world
    record, sandbox_id = await _bound(w, provider="docker")
    before = await w.store.get_instance("k1")
    out = await reclaim_sandbox(record, provider=w.sandboxes, instances=w.store)
    assert out is ReclaimOutcome.PROVIDER_MISMATCH
    assert await w.store.get_instance("k1") == before
    assert w.sandboxes.exists(sandbox_id) and w.sandboxes.destroyed == []


@REAPER_KIT.add
async def check_destroy_failed_deletes_the_record_and_reclaimer_raises(
    reaper_world: ReaperWorld
) -> None:
    w = reaper_world
    record, sandbox_id = await _bound(w)
    w.sandboxes.break_destroy(sandbox_id, "quota service down")
    out = await reclaim_sandbox(record, provider=w.sandboxes, instances=w.store)
    assert out is ReclaimOutcome.DESTROY_FAILED
    assert await w.store.get_instance("k1") is None
    assert w.sandboxes.exists(sandbox_id)
    await w.store.upsert_instance(
        InstanceRecord("k1", w.sandboxes.name, sandbox_id, "t", time.time()))
    with raises(SandboxReclaimFailedError) as caught:
        await sandbox_reclaimer(w.sandboxes, w.store)(record)
    assert caught.value.run_id == "r-bound" and caught.value.sandbox_key == "k1"
    assert "quota service down" in str(caught.value)


@REAPER_KIT.add
async def check_destroy_that_hangs_is_bounded_by_its_own_timeout(reaper_world: ReaperWorld) -> None:
    w = reaper_world
    record, _ = await _bound(w)

    class Hanging:
        name = w.sandboxes.name

        async def destroy(self, ref: SandboxRef) -> None:
            await anyio.sleep_forever()

    started = time.monotonic()
    out = await reclaim_sandbox(record, provider=Hanging(), instances=w.store,
                                destroy_timeout=0.2)
    assert out is ReclaimOutcome.DESTROY_FAILED
    assert time.monotonic() - started < 5
    assert await w.store.get_instance("k1") is None


async def check_reaper(make_store: Factory, *, only: Iterable[str] | None = None) -> KitReport:
    """Run the reaper kit over stores made by ``make_store`` (one fresh store and
    :class:`ReaperWorld` per check); raise :class:`~corral.testing.KitFailed` naming every
    failed check, else return the report. Starts real supervised processes (POSIX)."""
    return await REAPER_KIT.verify(make_store, only=only)
