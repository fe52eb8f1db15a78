"""The per-run fan-out: every viewer gets exactly the events after its offset, in order,
whether it starts inside the window, behind it (reading the store until it catches up), or
ahead of the log; the store is tailed once however many viewers there are."""

from __future__ import annotations

from pathlib import Path

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.stores._protocols import LoggedEvent, NewRun, Store
from corral.server._run_fanout import FeedHub
from corral.server._sse import encode_event
from corral.stores import open_store
from corral.testing import wait_until_async

Plan = list[tuple[str, int]]
"""("append", batch size) or ("view", start offset) steps, in order."""


async def _exercise(store: Store, plan: Plan, window: int) -> None:
    await store.create(NewRun(run_id="r", thread_id="t"))
    claim = await store.acquire_claim("r", "writer", 60)
    written = 0
    results: list[tuple[int, list[bytes]]] = []
    async with anyio.create_task_group() as tg:
        hub = FeedHub(store, tg, encode_event, window=window)

        async def view(after: int, slot: list[bytes]) -> None:
            async for frames in hub.follow("r", after, idle=5):
                slot.extend(frames)

        for step, n in plan:
            if step == "append":
                events = [({"type": "CUSTOM", "name": "n", "value": written + i}, written + i)
                          for i in range(n)]
                await store.append("r", events, epoch=claim.epoch)
                written += n
            else:
                slot: list[bytes] = []
                results.append((n, slot))
                tg.start_soon(view, n, slot)
            await anyio.sleep(0)  # let viewers run between steps (and sometimes not)
        await store.close("r")
        await wait_until_async(lambda: not hub.feeds, "every feed to end")
    every = await store.snapshot("r")
    assert len(every) == written
    for after, got in results:
        expected = [encode_event(e) for e in every if e.offset > after]
        assert got == expected, (after, window)


plans = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 7)),
        st.tuples(st.just("view"), st.integers(0, 40)),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(plan=plans, window=st.integers(1, 6))
def test_every_viewer_gets_exactly_what_follows_its_offset(plan: Plan, window: int) -> None:
    async def main() -> None:
        store = await open_store("memory://")
        try:
            await _exercise(store, plan, window)
        finally:
            await store.aclose()

    anyio.run(main)


def test_two_hundred_viewers_share_one_tail(tmp_path: Path) -> None:
    async def main() -> None:
        store = await open_store(f"sqlite://{tmp_path / 'c.db'}")
        try:
            await store.create(NewRun(run_id="r", thread_id="t"))
            claim = await store.acquire_claim("r", "w", 60)
            tails: list[int] = []
            real_read = store.read

            def counting_read(run_id: str, after: int = 0):  # type: ignore[no-untyped-def]
                tails.append(after)
                return real_read(run_id, after)

            store.read = counting_read  # type: ignore[method-assign]
            got: list[list[bytes]] = [[] for _ in range(200)]
            async with anyio.create_task_group() as tg:
                hub = FeedHub(store, tg, encode_event)

                async def view(slot: list[bytes]) -> None:
                    async for frames in hub.follow("r", 0, idle=5):
                        slot.extend(frames)

                for slot in got:
                    tg.start_soon(view, slot)
                await wait_until_async(  # every viewer attached before the events come
                    lambda: "r" in hub.feeds and hub.feeds["r"].viewers >= len(got),
                    "every viewer to attach")
                for i in range(50):
                    await store.append("r", [({"type": "CUSTOM", "value": i}, i)],
                                       epoch=claim.epoch)
                await store.close("r")
            expected = [encode_event(LoggedEvent(i + 1, i, {"type": "CUSTOM", "value": i}))
                        for i in range(50)]
            assert all(slot == expected for slot in got)
            assert tails == [0]
        finally:
            await store.aclose()

    anyio.run(main)
