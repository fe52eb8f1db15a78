"""Store kit, the event log: append under the epoch fence, read and tail, close, snapshot."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel

from corral.stores._protocols import ClaimLost, InvalidEvent, LogClosed, Store, UnknownRun
from corral.testing._kit import Kit, raises
from corral.testing._polling import wait_until_async
from corral.testing._store_fixtures import DEADLINE, T0, claimed_run, event, new_run

__all__ = ["EVENT_CHECKS"]

EVENT_CHECKS: Kit[Store] = Kit("store")
"""This part's checks, in the order written (the store kit joins the parts)."""


# ------------------------------------------------------------------ event log
# Append with the epoch fence, read/tail, close, snapshot.

@EVENT_CHECKS.add
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


@EVENT_CHECKS.add
async def check_tail_keeps_the_highest_journal_offset(store: Store) -> None:
    """An event logged out of band at a stale journal offset (an approval request
    raced by a batch) must not send a successor back over lines already logged."""
    epoch = await claimed_run(store)
    await store.append("run-1", [(event(1), 10), (event(2), 40)], epoch=epoch)
    await store.append("run-1", [(event(3), 25)], epoch=epoch)
    tail = await store.tail("run-1")
    assert (tail.last_offset, tail.last_journal_offset) == (3, 40)
    assert [e.journal_offset for e in await store.snapshot("run-1")] == [10, 40, 25]


@EVENT_CHECKS.add
async def check_events_round_trip_as_json(store: Store) -> None:
    epoch = await claimed_run(store)
    event = {"type": "CUSTOM", "name": "x", "value": {"a": [1, 2.5, None, True], "ü": "é"}}
    await store.append("run-1", [(event, 0)], epoch=epoch)
    assert (await store.snapshot("run-1"))[0].event == event


@EVENT_CHECKS.add
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


@EVENT_CHECKS.add
async def check_unclaimed_run_takes_no_appends(store: Store) -> None:
    await new_run(store, "r")
    with raises(ClaimLost):
        await store.append("r", [(event(1), 1)], epoch=0)
    assert await store.snapshot("r") == []


@EVENT_CHECKS.add
async def check_unknown_run_and_closed_log(store: Store) -> None:
    with raises(UnknownRun):
        await store.append("ghost", [(event(1), 1)], epoch=1)
    epoch = await claimed_run(store)
    assert await store.close("run-1") is True
    with raises(LogClosed):
        await store.append("run-1", [(event(1), 1)], epoch=epoch)
    assert await store.snapshot("run-1") == []


@EVENT_CHECKS.add
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


@EVENT_CHECKS.add
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


@EVENT_CHECKS.add
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


@EVENT_CHECKS.add
async def check_read_of_closed_log_returns_everything_then_ends(store: Store) -> None:
    epoch = await claimed_run(store)
    await store.append("run-1", [(event(i), i) for i in range(1, 2501)], epoch=epoch)
    await store.close("run-1")
    with anyio.fail_after(DEADLINE):
        offsets = [e.offset async for e in store.read("run-1")]
    assert offsets == list(range(1, 2501))


@EVENT_CHECKS.add
async def check_read_unknown_run_raises(store: Store) -> None:
    with raises(UnknownRun):
        async for _ in store.read("ghost"):
            pass
    with raises(UnknownRun):  # the server's event stream relies on this
        await store.tail("ghost")


@EVENT_CHECKS.add
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


@EVENT_CHECKS.add
async def check_snapshot_never_waits_and_is_a_copy(store: Store) -> None:
    assert await store.snapshot("ghost") == []
    epoch = await claimed_run(store)
    with anyio.fail_after(DEADLINE):
        assert await store.snapshot("run-1") == []
    await store.append("run-1", [(event(1), 1)], epoch=epoch)
    snap = await store.snapshot("run-1")
    snap[0].event["delta"] = "mutated"
    assert (await store.snapshot("run-1"))[0].event["delta"] == "d1"


@EVENT_CHECKS.add
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


@EVENT_CHECKS.add
async def check_logs_are_per_run(store: Store) -> None:
    e1 = await claimed_run(store, "a")
    e2 = await claimed_run(store, "b")
    await store.append("a", [(event(1), 1)], epoch=e1)
    await store.append("b", [(event(1), 1), (event(2), 2)], epoch=e2)
    await store.close("a")
    assert [e.offset for e in await store.snapshot("a")] == [1]
    assert [e.offset for e in await store.snapshot("b")] == [1, 2]
    assert (await store.tail("b")).closed is False
