"""Attacks on the reaper (security issue, defects 6 and 7).

6. A run whose driver died without detaching (SIGKILL of ``corral run``) must become
   reapable once its lease lapses: before the agent started (nothing to finalize: the run
   fails with a clear error, its sandbox is reclaimed) and after (finalized from the
   journal).
7. A transient failure of the terminal status write during a sweep must not report
   ``not-claimed``, leak the sandbox, or close the log of a run still ``running``; and a
   later driver that finds the end already logged finishes the run with that end.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from corral.harness._base import RunContext, translate_run
from corral.harness._command import CommandHarness
from corral.harness._events import event_to_dict
from corral.journal._layout import JournalPaths, read_status
from corral.stores._records import RunPatch, RunStatus
from corral.runs._reap_sweep import ReapOutcome
from corral.stores._protocols import Store
from corral.stores._sqlite import SQLiteStore
from corral.testing._reaper_world import DirSandboxes, ReaperWorld, entry
from tests.corral_cli import CliHome
from tests.helpers import wait_until

# ------------------------------------------------------------------ 6: the real CLI


class Cli(CliHome):
    """Adds the instance store and the sandboxes' host directories."""

    def instance(self, key: str) -> dict[str, Any] | None:
        row = self._one("SELECT doc FROM instances WHERE key = ?", key)
        return None if row is None else dict(json.loads(row[0]))

    def instances(self) -> list[dict[str, Any]]:
        with sqlite3.connect(self.db) as conn:
            rows = conn.execute("SELECT doc FROM instances").fetchall()
        return [json.loads(r[0]) for r in rows]

    def sandbox_dir(self, sandbox_id: str) -> Path:
        return self.home / "sandboxes" / "bubblewrap" / sandbox_id

    def workspace_of(self, sandbox_id: str) -> Path | None:
        """The host directory behind the sandbox's /workspace, once its state exists."""
        try:
            state = json.loads((self.sandbox_dir(sandbox_id) / "state.json").read_text())
        except (OSError, ValueError):
            return None
        files = state.get("files_dir") or str(self.sandbox_dir(sandbox_id))
        return Path(files) / "root" / "workspace"



@pytest.fixture
def cli(corral_cmd: list[str], cli_env: dict[str, str], corral_home: Path,
        need_bwrap_runs: None) -> Cli:
    cli_env["CORRAL_LEASE_TTL"] = "1"  # the lease lapses a second after the driver died
    return Cli(corral_cmd, cli_env, corral_home)


def _big_workspace(root: Path, files: int = 400, size: int = 256 * 1024) -> Path:
    """A workspace whose copy into the sandbox takes long enough to be caught at it."""
    root.mkdir()
    chunk = os.urandom(size)
    for i in range(files):
        (root / f"f{i:04d}.bin").write_bytes(chunk)
    return root


def _lease_lapsed(cli: Cli, run_id: str) -> bool:
    record = cli.raw(run_id)
    assert record is not None
    expires = record.get("claim_expires_at")
    return expires is not None and expires < time.time()


def _exited(paths: JournalPaths) -> bool:
    status = read_status(paths.status)
    return status is not None and status.state == "exited"


def _sigkill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def _killed_during_the_copy(cli: Cli, tmp_path: Path, run_id: str) -> dict[str, Any]:
    """Start ``corral run`` on a big workspace and SIGKILL it while the copy is under way;
    return the instance record of the sandbox being filled."""
    workspace = _big_workspace(tmp_path / "ws")
    proc = cli.popen("run", "--run-id", run_id, "--workspace", str(workspace), "--",
                     "sh", "-c", "echo agent-ran", quiet=True)
    copying: dict[str, Any] = {}

    def caught_copying() -> bool:
        # The bootstrapping instance record is written right after the sandbox is made,
        # before the copy; a first workspace file on the host means tar is unpacking.
        for inst in cli.instances() if cli.raw(run_id) is not None else []:
            ws = cli.workspace_of(inst["provider_sandbox_id"])
            if ws is not None and ws.is_dir() and any(ws.glob("f*.bin")):
                copying.update(inst)
                return True
        return False

    try:
        wait_until(caught_copying, "the workspace copy to be under way", timeout=60)
    finally:
        _sigkill(proc)
    return copying


def test_starter_killed_during_the_workspace_copy_is_failed_and_reclaimed(
    cli: Cli, tmp_path: Path
) -> None:
    run_id = "killed-in-copy"
    copying = _killed_during_the_copy(cli, tmp_path, run_id)
    paths = cli.journal(run_id)
    record = cli.raw(run_id)
    assert record is not None and record["status"] == "running"
    assert "detached_since" not in record  # nobody detached: the driver just died
    assert not paths.journal.exists() and read_status(paths.status) is None  # no agent yet
    sandbox_id = copying["provider_sandbox_id"]
    assert cli.sandbox_dir(sandbox_id).exists()

    wait_until(lambda: _lease_lapsed(cli, run_id), "the dead starter's lease to lapse", timeout=30)
    out = cli.run("reap", "--ttl", "0", "--json")
    result = json.loads(out.stdout)
    runs = {r["run_id"]: r for r in result["runs"]}
    assert run_id in runs, result  # before the fix: never listed, the run stays running
    assert runs[run_id]["outcome"] == "expired", runs[run_id]
    assert runs[run_id]["status"] == "failed"
    record = cli.raw(run_id)
    assert record is not None and record["status"] == "failed"
    assert "died before the agent started" in record["error"]["message"]
    assert cli.closed(run_id)
    assert cli.log(run_id)[-1]["type"] == "RUN_ERROR"
    assert not cli.sandbox_dir(sandbox_id).exists()  # reclaimed
    assert cli.instance(copying["key"]) is None
    assert out.returncode == 0, out.stderr


def test_starter_killed_before_the_agent_started_is_finalized_without_waiting_the_ttl(
    cli: Cli, tmp_path: Path
) -> None:
    """The same death, swept with the default TTL: the starter provably died on this
    machine and no agent was ever launched, so there is nothing to wait for."""
    run_id = "killed-in-copy-2"
    _killed_during_the_copy(cli, tmp_path, run_id)
    assert not cli.journal(run_id).journal.exists()
    wait_until(lambda: _lease_lapsed(cli, run_id), "the dead starter's lease to lapse", timeout=30)
    result = json.loads(cli.run("reap", "--json").stdout)
    runs = {r["run_id"]: r for r in result["runs"]}
    assert runs.get(run_id, {}).get("outcome") == "finalized", result
    assert runs[run_id]["status"] == "failed"
    record = cli.raw(run_id)
    assert record is not None and record["status"] == "failed"
    assert not cli.instances()


def test_driver_killed_after_the_agent_started_is_finalized_from_the_journal(
    cli: Cli, tmp_path: Path
) -> None:
    run_id = "killed-while-driving"
    proc = cli.popen("run", "--run-id", run_id, "--", "sh", "-c",
                     "echo first; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo last",
                     quiet=True)
    paths = cli.journal(run_id)
    wait_until(lambda: paths.journal.exists() and b"first" in paths.journal.read_bytes(),
               "the agent's first line", timeout=60)
    wait_until(lambda: any(e.get("delta") == "first" for e in cli.log(run_id)),
               "the driver to log the first line", timeout=30)
    _sigkill(proc)  # no detach: the driver just dies
    record = cli.raw(run_id)
    assert record is not None and "detached_since" not in record
    ref = record["sandbox_ref"]
    ws = cli.workspace_of(ref["id"])
    assert ws is not None
    (ws.parent / "tmp" / "go").touch()  # let the agent finish on its own
    wait_until(lambda: _exited(paths), "the agent to exit", timeout=30)
    wait_until(lambda: _lease_lapsed(cli, run_id), "the dead driver's lease to lapse", timeout=30)

    out = cli.run("reap", "--ttl", "1h", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    runs = {r["run_id"]: r for r in result["runs"]}
    assert runs.get(run_id) == {"run_id": run_id, "outcome": "finalized",
                                "status": "completed", "exit_code": 0}, result
    record = cli.raw(run_id)
    assert record is not None and record["status"] == "completed"
    assert record["exit_code"] == 0
    text = "".join(e.get("delta", "") for e in cli.log(run_id)
                   if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "first\nlast\n"
    assert cli.closed(run_id)
    assert not cli.sandbox_dir(ref["id"]).exists()


# ------------------------------------------------------------------ 7: faults in the store


class TransientError(Exception):
    """What a database blip looks like to the caller (e.g. ``database is locked``)."""


class FlakyTerminalWrites:
    """A real store whose terminal-status update fails ``failures`` times (raising before
    anything is written, as a refused transaction does). Records the order of terminal
    writes and closes."""

    def __init__(self, inner: Store, failures: int = 1) -> None:
        self.inner = inner
        self.failures = failures
        self.calls: list[tuple[str, str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def update(self, run_id: str, patch: RunPatch, **kw: Any) -> Any:
        if patch.is_terminal:
            if self.failures > 0:
                self.failures -= 1
                self.calls.append(("terminal-write-failed", run_id))
                raise TransientError("database is locked")
            got = await self.inner.update(run_id, patch, **kw)
            self.calls.append(("terminal-write", run_id))
            return got
        return await self.inner.update(run_id, patch, **kw)

    async def close(self, run_id: str, *, epoch: int | None = None) -> bool:
        self.calls.append(("close", run_id))
        return await self.inner.close(run_id, epoch=epoch)


@pytest.fixture
async def sqlite_world(tmp_path: Path) -> AsyncIterator[ReaperWorld]:
    store = SQLiteStore(tmp_path / "corral.db")
    world = ReaperWorld(store, DirSandboxes(tmp_path / "sandboxes"))
    try:
        yield world
    finally:
        world.cleanup()
        await store.aclose()


def _closes_before_terminal(calls: list[tuple[str, str]], run_id: str) -> bool:
    mine = [c for c, r in calls if r == run_id]
    if "close" not in mine:
        return False
    written = "terminal-write" in mine and mine.index("terminal-write") < mine.index("close")
    return not written


@pytest.mark.anyio
async def test_a_transient_terminal_write_failure_is_retried_and_the_run_reclaimed(
    sqlite_world: ReaperWorld,
) -> None:
    w = sqlite_world
    done = await w.start("echo finished", wait_exit=True)
    flaky = FlakyTerminalWrites(w.store, failures=1)
    w.store = flaky
    result = await w.sweep()
    e = entry(result, done.run_id)
    assert e.outcome in (ReapOutcome.FINALIZED, ReapOutcome.FAILED), e  # not not-claimed
    record = await w.record(done.run_id)
    assert record.status is RunStatus.COMPLETED and record.exit_code == 0
    assert not _closes_before_terminal(flaky.calls, done.run_id), flaky.calls
    assert done.sandbox_id is not None and not w.sandboxes.exists(done.sandbox_id)
    assert (await flaky.inner.tail(done.run_id)).closed

    second = await w.sweep()
    assert all(x.run_id != done.run_id for x in second.runs)
    assert (await w.record(done.run_id)).status is RunStatus.COMPLETED


@pytest.mark.anyio
async def test_a_terminal_write_that_keeps_failing_leaves_the_run_whole_for_the_next_sweep(
    sqlite_world: ReaperWorld,
) -> None:
    w = sqlite_world
    done = await w.start("echo finished", wait_exit=True)
    real = w.store
    flaky = FlakyTerminalWrites(real, failures=1000)
    w.store = flaky
    e = entry(await w.sweep(), done.run_id)
    assert e.outcome is ReapOutcome.FAILED, e  # not not-claimed: nobody else owns it
    assert e.error and "terminal status" in e.error
    assert (await w.record(done.run_id)).status is RunStatus.RUNNING
    # The log stays open while the record says running: a successor can still end it.
    assert not (await real.tail(done.run_id)).closed
    assert "close" not in [c for c, r in flaky.calls if r == done.run_id]

    w.store = real  # the database is back
    e = entry(await w.sweep(), done.run_id)
    assert e.outcome is ReapOutcome.FINALIZED, e
    record = await w.record(done.run_id)
    assert record.status is RunStatus.COMPLETED and record.exit_code == 0
    log = [x.event["type"] for x in await real.snapshot(done.run_id)]
    assert log.count("RUN_FINISHED") == 1 and "RUN_ERROR" not in log
    assert done.sandbox_id is not None and not w.sandboxes.exists(done.sandbox_id)


async def _log_through_the_exit(store: Store, run_id: str, paths: JournalPaths,
                                nonce: str, epoch: int) -> None:
    async for batch in translate_run(CommandHarness(), RunContext(run_id, f"thread-{run_id}"),
                                     paths, nonce=nonce, follow=False):
        events: list[Mapping[str, Any]] = [event_to_dict(e) for e in batch.events]
        await store.append(run_id, [(e, batch.journal_offset) for e in events], epoch=epoch)


@pytest.mark.anyio
@pytest.mark.parametrize("closed", [True, False])
async def test_a_later_driver_ends_a_run_whose_end_is_already_logged_with_that_end(
    sqlite_world: ReaperWorld, closed: bool
) -> None:
    """What the old sweep left behind: the exit batch logged (and the log closed), the
    terminal write lost, the record ``running``. The next sweep must record what the
    journal proved (completed, exit 0), not fail the run over the closed log."""
    w = sqlite_world
    done = await w.start("echo finished", wait_exit=True)
    record = await w.record(done.run_id)
    nonce = str((record.journal or {})["nonce"])
    claim = await w.store.acquire_claim(done.run_id, "old-reaper", 0.05)
    await _log_through_the_exit(w.store, done.run_id, done.paths, nonce, claim.epoch)
    if closed:
        await w.store.close(done.run_id, epoch=claim.epoch)
    time.sleep(0.06)  # the old reaper's lease lapses
    e = entry(await w.sweep(), done.run_id)
    assert e.outcome is ReapOutcome.FINALIZED, e
    record = await w.record(done.run_id)
    assert (record.status, record.exit_code, record.error) == (RunStatus.COMPLETED, 0, None)
    log = [x.event["type"] for x in await w.store.snapshot(done.run_id)]
    assert log.count("RUN_FINISHED") == 1 and "RUN_ERROR" not in log
    assert (await w.store.tail(done.run_id)).closed
