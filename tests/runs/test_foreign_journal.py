"""A run whose journal is on another machine (a second host sharing the store): this host
says so and touches nothing, instead of taking "no journal here" for "never started" and
ending a live run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from corral.journal._exit_probe import JournalUnreachable, machine_id
from corral.runs._runner import Runner
from corral.stores._protocols import NewRun, Store
from corral.stores._records import RunPatch, RunStatus

NONCE = "0123456789abcdef0123456789abcdef"
OTHER_MACHINE = "f" * 32

pytestmark = pytest.mark.anyio


async def _run_written_by(store: Store, tmp_path: Path, host: str) -> str:
    """A running run whose journal directory (on ``host``) does not exist here."""
    run_id = f"run-{host[:4]}"
    await store.create(NewRun(
        run_id=run_id, thread_id="t", harness="command", spec={"version": 1},
        journal={"dir": str(tmp_path / "on-that-host" / "journals"), "nonce": NONCE,
                 "host": host}))
    return run_id


async def test_driving_a_run_whose_journal_is_elsewhere_says_so_and_claims_nothing(
        store: Store, tmp_path: Path) -> None:
    runner = Runner(store, journals_dir=tmp_path / "journals")
    run_id = await _run_written_by(store, tmp_path, OTHER_MACHINE)
    with pytest.raises(JournalUnreachable, match="on another host.*attach to, cancel or reap"):
        await runner.drive(run_id)
    record = await store.get(run_id)
    assert record is not None
    assert (record.status, record.driver_epoch) == (RunStatus.RUNNING, 0)
    assert await store.snapshot(run_id) == []


async def test_the_same_record_written_here_is_ended_as_never_started(
        store: Store, tmp_path: Path) -> None:
    """The control: on its own machine the missing journal does mean "never started"."""
    runner = Runner(store, journals_dir=tmp_path / "journals")
    run_id = await _run_written_by(store, tmp_path, machine_id())
    result = await runner.drive(run_id)
    assert result.record.terminal and result.record.driver_epoch == 1


async def test_the_reaper_leaves_a_run_whose_journal_is_elsewhere_and_says_why(
        store: Store, tmp_path: Path) -> None:
    runner = Runner(store, journals_dir=tmp_path / "journals")
    run_id = await _run_written_by(store, tmp_path, OTHER_MACHINE)
    await store.update(run_id, RunPatch(detached_since=time.time() - 7200))
    result, _ = await runner.reap(ttl=3600)
    (entry,) = result.runs
    assert entry.outcome.value == "unknown"
    assert entry.error is not None and "on another host" in entry.error
    record = await store.get(run_id)
    assert record is not None
    assert (record.status, record.driver_epoch) == (RunStatus.RUNNING, 0)
