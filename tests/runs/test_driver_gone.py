"""A driver that goes away leaves its run detached, at library level (issue #26, defect 2).

The README's pattern drives a run in one task (``tg.start_soon(runner.drive, …)``) beside
the application's events loop (``async for … in runner.events(…)``). An exception in that
loop cancels ``drive``; so does a web handler whose client disconnects, or a process
shutting down. None of these is a decision to end the run: the run must go on, detached
(attachable, reapable), with nothing lost. Ending it is an explicit ``runner.cancel``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from corral.runs._runner import Runner, RunRequest
from corral.sandbox._definition import Sandbox
from corral.sandbox._lifecycle import Lifecycle
from corral.stores import open_store
from corral.stores._protocols import Store
from corral.stores._records import RunStatus

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("need_bwrap_runs")]

LINES = 40
TICKER = f"i=0; while [ $i -lt {LINES} ]; do echo tick $i; i=$((i+1)); sleep 0.02; done"


class ViewerBroke(Exception):
    """The application's events loop failed (a bug, a closed socket, …)."""


@pytest.fixture
async def sqlite(tmp_path: Path) -> AsyncIterator[Store]:
    store = await open_store(f"sqlite://{tmp_path / 'corral.db'}")
    try:
        yield store
    finally:
        await store.aclose()


def _request() -> RunRequest:
    return RunRequest(command=["sh", "-c", TICKER],
                      sandbox=Sandbox(provider="bubblewrap", lifecycle=Lifecycle(reuse="none")))


def _ticks(events: list[dict[str, object]]) -> str:
    return "".join(str(e.get("delta", "")) for e in events
                   if e["type"] == "TEXT_MESSAGE_CONTENT")


async def test_an_exception_in_the_events_loop_detaches_the_run(
        sqlite: Store, corral_home: Path) -> None:
    runner = Runner(sqlite, lease_ttl=3)
    record = await runner.start(_request())
    run_id = record.run_id
    broke = False
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.drive, run_id)  # the README's pattern
            async for logged in runner.events(run_id):
                if "tick 1" in str(logged.event.get("delta", "")):
                    raise ViewerBroke("the application's loop failed")
    except* ViewerBroke:
        broke = True
    assert broke
    left = await sqlite.get(run_id)
    assert left is not None
    # Before the fix: aborted, its log closed with RUN_ERROR, its sandbox left behind.
    assert left.status is RunStatus.RUNNING, (left.status, left.error)
    assert left.detached_since is not None and not left.cancel_requested
    assert not (await sqlite.tail(run_id)).closed
    # released at once: the next driver need not wait for a lease to lapse
    assert not left.lease_live(time.time())
    # reapable: listed as unattended
    listed = await sqlite.list_reclaimable(time.time(), 0.0, limit=100)
    assert run_id in [r.run_id for r in listed]

    # attachable: any driver continues it from where its log stopped, nothing lost
    again = Runner(sqlite, lease_ttl=3)
    with anyio.fail_after(60):
        final = (await again.drive(run_id)).record
    assert final.status is RunStatus.COMPLETED, final.error
    events = [dict(e.event) for e in await sqlite.snapshot(run_id)]
    assert _ticks(events) == "".join(f"tick {i}\n" for i in range(LINES))
    assert [e["type"] for e in events].count("RUN_STARTED") == 1
    assert events[-1]["type"] == "RUN_FINISHED"
    # nothing leaked: the run's end destroyed its sandbox (reuse="none")
    assert await sqlite.get_instance(record.sandbox_key or "") is None


async def test_a_cancel_scope_around_drive_detaches_and_cancel_still_ends_the_run(
        sqlite: Store, corral_home: Path) -> None:
    """A web handler whose client disconnects: its scope is cancelled mid-drive."""
    runner = Runner(sqlite, lease_ttl=3)
    run_id = (await runner.start(_request())).run_id
    with anyio.move_on_after(0.3):
        await runner.drive(run_id)
    left = await sqlite.get(run_id)
    assert left is not None and left.status is RunStatus.RUNNING, left
    assert left.detached_since is not None
    # ending it stays an explicit cancel
    with anyio.fail_after(60):
        cancelled = await runner.cancel(run_id)
    assert cancelled.status is RunStatus.ABORTED and cancelled.cancel_requested
    assert (await sqlite.tail(run_id)).closed
