"""Run-log pipe kit: :func:`corral.runs.pipe_to_run_log` and :func:`corral.runs.hold_claim`
over a store, as plain checks.

The pipe's status table over your store: exactly one terminal status and one close on every
path (completed, failed, aborted, cancelled, a store that refuses the terminal write), and a
driver whose claim is lost (a successor took over) lands nothing and writes no status.
``hold_claim`` renews the lease, releases it, and cancels its body when the lease is lost.

    from corral.testing import check_pipe

    await check_pipe(make_store)   # one fresh store per check; raises KitFailed

The checks use anyio and run on asyncio or trio.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

import anyio

from corral.runs import PipeResult, ProducerExit, hold_claim, pipe_to_run_log
from corral.stores._protocols import ClaimLost, ClaimRefused, Store, StoreError
from corral.stores._records import RunError, RunPatch, RunRecord, RunStatus
from corral.testing._polling import wait_until_async
from corral.testing._kit import Factory, Kit, KitReport, raises
from corral.testing._store_fixtures import DEADLINE, T0, claimed_run, event, new_run

__all__ = [
    "PIPE_KIT",
    "check_pipe",
    "check_abort_before_start",
    "check_abort_between_events_then_finishes_on_its_own",
    "check_abort_then_producer_ends_stream_is_aborted",
    "check_abort_then_producer_yields_again_drops_the_event",
    "check_abort_while_producer_waits",
    "check_aborted_producer_that_raises_is_failed",
    "check_cancelled_from_outside_records_aborted_and_closes",
    "check_cancelled_from_outside_with_detach_on_cancel_leaves_the_run_open",
    "check_completed",
    "check_hold_claim_body_error_propagates_and_releases",
    "check_hold_claim_cancels_body_on_loss",
    "check_hold_claim_refused_runs_no_body",
    "check_hold_claim_renews_and_releases",
    "check_logged_end_records_the_error_without_appending",
    "check_loser_cannot_overwrite_successors_terminal_status",
    "check_lost_claim_lands_nothing_and_writes_no_status",
    "check_nonzero_exit_fails_and_records_exit_code",
    "check_pipe_under_hold_claim_lost_lease",
    "check_producer_raises",
    "check_run_error_event_fails_and_stops_pulling",
    "check_terminal_write_never_stored_leaves_the_log_open",
    "check_terminal_write_refused_once_is_retried_then_closed",
    "check_zero_exit_completes",
]


PIPE_KIT: Kit[Store] = Kit("pipe")
"""Every pipe and hold_claim check; the subject is the store the factory makes."""


@PIPE_KIT.add
async def check_hold_claim_renews_and_releases(store: Store) -> None:
    await new_run(store, "r")
    with anyio.fail_after(DEADLINE):
        async with hold_claim(store, "r", "a", ttl=0.6, renew_every=0.05) as held:
            assert held.epoch == 1
            first_expiry = held.claim.expires_at
            await wait_until_async(lambda: held.claim.expires_at != first_expiry,
                                   "hold_claim to renew the lease", interval=0.02)
            rec = await store.get("r")
            assert rec is not None and rec.claim_expires_at == held.claim.expires_at
    rec = await store.get("r")
    assert rec is not None and rec.claim_owner is None and rec.driver_epoch == 1


@PIPE_KIT.add
async def check_hold_claim_cancels_body_on_loss(store: Store) -> None:
    await new_run(store, "r")
    reached_end = False
    with anyio.fail_after(DEADLINE):
        with raises(ClaimLost):
            async with hold_claim(store, "r", "a", ttl=0.3, renew_every=0.05) as held:
                # A successor takes over once the lease would have lapsed.
                await store.acquire_claim(
                    "r", "b", 30, now=held.claim.expires_at + 1)
                await anyio.sleep_forever()
                reached_end = True
    assert not reached_end
    rec = await store.get("r")
    assert rec is not None and rec.claim_owner == "b"  # the loser released nothing


@PIPE_KIT.add
async def check_hold_claim_refused_runs_no_body(store: Store) -> None:
    ran = False
    with raises(ClaimRefused):
        async with hold_claim(store, "ghost", "a", ttl=5):
            ran = True
    assert not ran


@PIPE_KIT.add
async def check_hold_claim_body_error_propagates_and_releases(store: Store) -> None:
    await new_run(store, "r")
    with raises(KeyError):
        async with hold_claim(store, "r", "a", ttl=5):
            raise KeyError("body failed")
    rec = await store.get("r")
    assert rec is not None and rec.claim_owner is None


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


async def _events(items: list[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item


def _types(snapshot: list[Any]) -> list[str]:
    return [e.event["type"] for e in snapshot]


# ------------------------------------------------------------------ pipe to run log
# The status table: exactly one terminal status and one close on every path.

async def _pipe(store: Store, events: Any, **kw: Any) -> tuple[PipeResult, _Counting]:
    epoch = kw.pop("epoch", None)
    if epoch is None:
        epoch = await claimed_run(store)
    counting = _Counting(store)
    with anyio.fail_after(DEADLINE):
        result = await pipe_to_run_log(counting, "run-1", events, epoch=epoch, **kw)
    assert counting.closes == 1
    assert (await store.tail("run-1")).closed is not result.claim_lost
    return result, counting


@PIPE_KIT.add
async def check_completed(store: Store) -> None:
    items = [({"type": "RUN_STARTED"}, 5), (event(1), 9), ({"type": "RUN_FINISHED"}, 12)]
    result, _ = await _pipe(store, _events(items))
    assert result.status is RunStatus.COMPLETED and result.record is not None
    assert result.record.status is RunStatus.COMPLETED
    assert result.record.finished_at is not None
    snap = await store.snapshot("run-1")
    assert _types(snap) == ["RUN_STARTED", "TEXT_MESSAGE_CONTENT", "RUN_FINISHED"]
    assert [e.journal_offset for e in snap] == [5, 9, 12]


@PIPE_KIT.add
async def check_run_error_event_fails_and_stops_pulling(store: Store) -> None:
    closed = anyio.Event()

    async def producer() -> AsyncIterator[Any]:
        try:
            yield (event(1), 1)
            yield ({"type": "RUN_ERROR", "message": "model said no", "code": "E42"}, 2)
            yield (event(3), 3)
        finally:
            closed.set()

    result, _ = await _pipe(store, producer())
    assert result.status is RunStatus.FAILED
    assert result.record is not None and result.record.error == RunError("model said no", "E42")
    assert _types(await store.snapshot("run-1")) == ["TEXT_MESSAGE_CONTENT", "RUN_ERROR"]
    assert closed.is_set()  # the producer was closed, not left for the GC


@PIPE_KIT.add
async def check_producer_raises(store: Store) -> None:
    async def producer() -> AsyncIterator[Any]:
        yield (event(1), 7)
        raise RuntimeError("journal vanished")

    result, _ = await _pipe(store, producer())
    assert result.status is RunStatus.FAILED
    assert result.record is not None and result.record.error is not None
    assert "journal vanished" in result.record.error.message
    snap = await store.snapshot("run-1")
    assert _types(snap) == ["TEXT_MESSAGE_CONTENT", "RUN_ERROR"]
    assert snap[-1].journal_offset == 7


@PIPE_KIT.add
async def check_abort_before_start(store: Store) -> None:
    abort = anyio.Event()
    abort.set()
    pulled = False

    async def producer() -> AsyncIterator[Any]:
        nonlocal pulled
        pulled = True
        yield (event(1), 1)

    result, _ = await _pipe(store, producer(), abort=abort)
    assert result.status is RunStatus.ABORTED and not pulled
    assert result.record is not None and result.record.status is RunStatus.ABORTED
    assert _types(await store.snapshot("run-1")) == ["RUN_ERROR"]


@PIPE_KIT.add
async def check_abort_then_producer_ends_stream_is_aborted(store: Store) -> None:
    abort = anyio.Event()

    async def producer() -> AsyncIterator[Any]:
        yield (event(1), 1)
        abort.set()  # signal-aware producers end their stream when aborted
        return

    result, _ = await _pipe(store, producer(), abort=abort)
    assert result.status is RunStatus.ABORTED
    assert result.record is not None and result.record.status is RunStatus.ABORTED


@PIPE_KIT.add
async def check_abort_between_events_then_finishes_on_its_own(store: Store) -> None:
    abort = anyio.Event()

    async def producer() -> AsyncIterator[Any]:
        yield (event(1), 1)
        yield (event(2), 2)
        abort.set()
        yield ProducerExit(exit_code=0)

    result, _ = await _pipe(store, producer(), abort=abort)
    assert result.status is RunStatus.ABORTED
    assert _types(await store.snapshot("run-1"))[:2] == ["TEXT_MESSAGE_CONTENT"] * 2


@PIPE_KIT.add
async def check_abort_then_producer_yields_again_drops_the_event(store: Store) -> None:
    abort = anyio.Event()

    async def producer() -> AsyncIterator[Any]:
        yield (event(1), 1)
        abort.set()
        yield (event(2), 2)

    result, _ = await _pipe(store, producer(), abort=abort)
    assert result.status is RunStatus.ABORTED
    deltas = [e.event.get("delta") for e in await store.snapshot("run-1")]
    assert "d2" not in deltas and deltas[0] == "d1"


@PIPE_KIT.add
async def check_abort_while_producer_waits(store: Store) -> None:
    abort = anyio.Event()

    async def producer() -> AsyncIterator[Any]:
        yield (event(1), 1)
        await anyio.sleep_forever()
        yield (event(2), 2)

    async def fire() -> None:
        await anyio.sleep(0.05)
        abort.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(fire)
        result, _ = await _pipe(store, producer(), abort=abort)
    assert result.status is RunStatus.ABORTED


@PIPE_KIT.add
async def check_aborted_producer_that_raises_is_failed(store: Store) -> None:
    abort = anyio.Event()

    async def producer() -> AsyncIterator[Any]:
        yield (event(1), 1)
        abort.set()
        raise ConnectionError("torn down")

    result, _ = await _pipe(store, producer(), abort=abort)
    assert result.status is RunStatus.FAILED


@PIPE_KIT.add
async def check_nonzero_exit_fails_and_records_exit_code(store: Store) -> None:
    items = [(event(1), 1), ProducerExit(exit_code=3), (event(2), 2)]
    result, _ = await _pipe(store, _events(items))
    assert result.status is RunStatus.FAILED
    assert result.record is not None and result.record.exit_code == 3
    assert result.record.error is not None and result.record.error.code == "exit_code"
    assert _types(await store.snapshot("run-1")) == ["TEXT_MESSAGE_CONTENT", "RUN_ERROR"]


@PIPE_KIT.add
async def check_terminal_write_refused_once_is_retried_then_closed(store: Store) -> None:
    """A transient store error on the terminal write: retried, stored, and only then
    the log closed."""
    epoch = await claimed_run(store)
    flaky = _FlakyTerminal(store, failures=1)
    items = [(event(1), 1), ({"type": "RUN_FINISHED"}, 2), ProducerExit(exit_code=0)]
    with anyio.fail_after(DEADLINE):
        result = await pipe_to_run_log(flaky, "run-1", _events(items), epoch=epoch)
    assert result.status is RunStatus.COMPLETED and result.record_error is None
    assert result.record is not None and result.record.status is RunStatus.COMPLETED
    assert flaky.calls == ["refused", "stored", "close"]


@PIPE_KIT.add
async def check_terminal_write_never_stored_leaves_the_log_open(store: Store) -> None:
    """A store that keeps refusing: no close (a closed log under a running record could
    never be finished); ``record_error`` says why; a successor ends the run with the
    end already logged, appending nothing."""
    epoch = await claimed_run(store)
    flaky = _FlakyTerminal(store, failures=100)
    items = [(event(1), 1), ({"type": "RUN_FINISHED"}, 2), ProducerExit(exit_code=0)]
    with anyio.fail_after(DEADLINE):
        result = await pipe_to_run_log(flaky, "run-1", _events(items), epoch=epoch)
    assert result.record_error is not None and "terminal status" in result.record_error
    assert "close" not in flaky.calls
    assert result.record is not None and result.record.status is RunStatus.RUNNING
    assert not (await store.tail("run-1")).closed
    successor = await store.acquire_claim("run-1", "successor", 30, break_lease_of="host-a")
    result, _ = await _pipe(
        store, _events([ProducerExit(exit_code=0, logged=True)]), epoch=successor.epoch)
    assert result.status is RunStatus.COMPLETED and result.appended == 0
    assert _types(await store.snapshot("run-1")) == ["TEXT_MESSAGE_CONTENT", "RUN_FINISHED"]


@PIPE_KIT.add
async def check_logged_end_records_the_error_without_appending(store: Store) -> None:
    epoch = await claimed_run(store)
    await store.append("run-1", [({"type": "RUN_ERROR", "message": "boom"}, 3)], epoch=epoch)
    await store.close("run-1", epoch=epoch)  # as an older driver left it
    end = ProducerExit(exit_code=2, error=RunError("boom"), logged=True)
    result, _ = await _pipe(store, _events([end]), epoch=epoch)
    assert result.status is RunStatus.FAILED and result.appended == 0
    assert result.record is not None and result.record.error == RunError("boom")
    assert result.record.exit_code == 2
    assert _types(await store.snapshot("run-1")) == ["RUN_ERROR"]


@PIPE_KIT.add
async def check_zero_exit_completes(store: Store) -> None:
    items = [(event(1), 1), ({"type": "RUN_FINISHED"}, 2), ProducerExit(exit_code=0)]
    result, _ = await _pipe(store, _events(items))
    assert result.status is RunStatus.COMPLETED
    assert result.record is not None and result.record.exit_code == 0


@PIPE_KIT.add
async def check_lost_claim_lands_nothing_and_writes_no_status(store: Store) -> None:
    await new_run(store, "run-1")
    old = await store.acquire_claim("run-1", "a", 1, now=T0)

    async def producer() -> AsyncIterator[Any]:
        yield (event(1), 1)
        # A successor takes over (the old lease lapsed).
        await store.acquire_claim("run-1", "b", 60, now=T0 + 5)
        yield (event(2), 2)
        yield (event(3), 3)

    result, _ = await _pipe(store, producer(), epoch=old.epoch)
    assert result.claim_lost
    assert result.record is not None and result.record.status is RunStatus.RUNNING
    assert result.record.finished_at is None and result.record.driver_epoch == 2
    assert [e.event.get("delta") for e in await store.snapshot("run-1")] == ["d1"]
    assert (await store.tail("run-1")).closed is False  # successor's log stays open
    # And the successor can finish the run normally.
    final = await pipe_to_run_log(store, "run-1", _events([(event(2), 2)]), epoch=2)
    assert final.status is RunStatus.COMPLETED and not final.claim_lost


@PIPE_KIT.add
async def check_loser_cannot_overwrite_successors_terminal_status(store: Store) -> None:
    await new_run(store, "run-1")
    old = await store.acquire_claim("run-1", "a", 1, now=T0)

    async def producer() -> AsyncIterator[Any]:
        new = await store.acquire_claim("run-1", "b", 60, now=T0 + 5)
        await store.update("run-1", RunPatch(status=RunStatus.COMPLETED, finished_at=T0 + 6),
                           expect_epoch=new.epoch)
        raise RuntimeError("predecessor crashed")
        yield  # pragma: no cover

    result, _ = await _pipe(store, producer(), epoch=old.epoch)
    assert result.claim_lost
    rec = await store.get("run-1")
    assert rec is not None and rec.status is RunStatus.COMPLETED and rec.error is None
    assert await store.snapshot("run-1") == []


async def _cancelled_after_one_event(store: Store, **options: Any) -> tuple[_Counting, bool]:
    """Pipe into a claimed ``run-1`` (with ``options``) from a producer that yields one
    event and then waits, and cancel the pipe's task from outside while it waits. Returns
    the store as the pipe saw it and whether the pipe returned (it must not: the
    cancellation propagates)."""
    epoch = await claimed_run(store)
    counting = _Counting(store)
    started = anyio.Event()
    returned = False

    async def producer() -> AsyncIterator[Any]:
        yield (event(1), 1)
        started.set()
        await anyio.sleep_forever()
        yield (event(2), 2)

    async def drive() -> None:
        nonlocal returned
        await pipe_to_run_log(counting, "run-1", producer(), epoch=epoch, **options)
        returned = True

    with anyio.fail_after(DEADLINE):
        async with anyio.create_task_group() as tg:
            tg.start_soon(drive)
            await started.wait()
            tg.cancel_scope.cancel()
    return counting, returned


@PIPE_KIT.add
async def check_cancelled_from_outside_records_aborted_and_closes(store: Store) -> None:
    counting, returned = await _cancelled_after_one_event(store)
    assert not returned
    assert counting.closes == 1
    rec = await store.get("run-1")
    assert rec is not None and rec.status is RunStatus.ABORTED
    assert (await store.tail("run-1")).closed


@PIPE_KIT.add
async def check_cancelled_from_outside_with_detach_on_cancel_leaves_the_run_open(
        store: Store) -> None:
    """A Runner's driver whose task is cancelled (``detach_on_cancel``): what was appended
    stays, no status, no close; the cancellation still propagates."""
    counting, returned = await _cancelled_after_one_event(store, detach_on_cancel=True)
    assert not returned
    assert counting.closes == 0
    rec = await store.get("run-1")
    assert rec is not None and rec.status is RunStatus.RUNNING and rec.error is None
    assert not (await store.tail("run-1")).closed
    assert _types(await store.snapshot("run-1")) == ["TEXT_MESSAGE_CONTENT"]


@PIPE_KIT.add
async def check_pipe_under_hold_claim_lost_lease(store: Store) -> None:
    """A successor takes the run while a pipe runs under ``hold_claim``. Whichever notices
    first, the renewer (``ClaimLost`` out of ``hold_claim``, the pipe cancelled) or the
    pipe's own fenced append (``claim_lost``), the outcome is the same: one close, no
    terminal status, the successor's log left open, nothing more lands."""
    await new_run(store, "run-1")
    counting = _Counting(store)

    async def producer() -> AsyncIterator[Any]:
        i = 0
        while True:
            i += 1
            yield (event(i), i)
            await anyio.sleep(0.01)

    result: PipeResult | None = None
    renewer_noticed = False
    with anyio.fail_after(DEADLINE):
        try:
            async with hold_claim(store, "run-1", "a", ttl=0.3, renew_every=0.05) as held:

                async def successor() -> None:
                    await anyio.sleep(0.1)
                    await store.acquire_claim("run-1", "b", 60, now=held.claim.expires_at + 1)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(successor)
                    result = await pipe_to_run_log(counting, "run-1", producer(),
                                                   epoch=held.epoch)
        except ClaimLost:
            renewer_noticed = True
    assert renewer_noticed or (result is not None and result.claim_lost), result
    assert counting.closes == 1
    rec = await store.get("run-1")
    assert rec is not None and rec.status is RunStatus.RUNNING and rec.driver_epoch == 2
    assert (await store.tail("run-1")).closed is False
    before = len(await store.snapshot("run-1"))
    await anyio.sleep(0.05)
    assert len(await store.snapshot("run-1")) == before  # nothing more lands


async def check_pipe(make_store: Factory, *, only: Iterable[str] | None = None) -> KitReport:
    """Run the pipe kit over stores made by ``make_store`` (one fresh store per check);
    raise :class:`~corral.testing.KitFailed` naming every failed check, else return the
    report."""
    return await PIPE_KIT.verify(make_store, only=only)
