"""The reaper kit's world: a store, real agents under the journal supervisor, and host
directories as sandboxes (:class:`DirSandboxes`), with the reaper and reclaimer wired over
them (:class:`ReaperWorld`) and what its checks assert with.

Each agent is a real process started by the journal supervisor, writing a real journal in a
host-private directory. :class:`DirSandboxes` is a minimal provider whose ``destroy`` stops
the agents whose journals live in the sandbox and deletes the directory (``break_destroy``
makes it fail, standing in for a provider outage). Every sweep also holds a run that must be
left alone (:meth:`ReaperWorld.bystander`), so a sweep that does nothing cannot pass.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from corral.harness._base import RunContext, translate_run
from corral.harness._command import CommandHarness
from corral.harness._events import event_to_dict
from corral.journal._layout import JournalPaths, read_status
from corral.journal._sentinel import new_nonce
from corral.journal._supervisor import (
    AgentSpec,
    is_ours,
    kill_supervised,
    launch_supervised_async,
)
from corral.runs import (
    ReapEntry,
    ReapOutcome,
    ReapResult,
    probe_run_exit,
    reap_detached_runs,
    sandbox_reclaimer,
)
from corral.runs._reap_runner import journal_drive, journal_stop
from corral.sandbox._contracts import SandboxRef
from corral.stores._protocols import InstanceRecord, LoggedEvent, NewRun, Store
from corral.stores._records import RunPatch, RunRecord
from corral.testing._polling import wait_until_async
from corral.testing._kit import Factory, opened

__all__ = [
    "BASE_ENV",
    "LONG",
    "QUIET",
    "DirSandboxes",
    "Frozen",
    "ReaperWorld",
    "Started",
    "agent_alive",
    "assert_counts",
    "assert_untouched",
    "entry",
    "reaper_world",
]

QUIET = 0.02
"""Quiescence window for tests: short, the store fences appends anyway."""

BASE_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"}
LONG = "sleep 600"


# ------------------------------------------------------------------ collaborators

class DirSandboxes:
    """Sandboxes as host directories (``<root>/<id>/private`` holds the journals).

    ``destroy`` stops every supervised agent whose journal lives in the sandbox, then
    deletes the directory; idempotent. ``break_destroy(id)`` makes it raise for that id.
    """

    def __init__(self, root: Path, name: str = "testkit-dirs") -> None:
        self.root = root
        self._name = name
        self._ids = itertools.count(1)
        self.broken: dict[str, str] = {}
        self.destroyed: list[str] = []

    @property
    def name(self) -> str:
        return self._name

    async def create(self) -> tuple[str, Path]:
        sandbox_id = f"sb-{next(self._ids)}"
        private = self.root / sandbox_id / "private"
        private.mkdir(parents=True, mode=0o700)
        return sandbox_id, private

    def exists(self, sandbox_id: str) -> bool:
        return (self.root / sandbox_id).exists()

    def break_destroy(self, sandbox_id: str, message: str = "the provider API is down") -> None:
        self.broken[sandbox_id] = message

    async def destroy(self, ref: SandboxRef | str) -> None:
        sandbox_id = ref.id if isinstance(ref, SandboxRef) else ref
        if sandbox_id in self.broken:
            raise RuntimeError(self.broken[sandbox_id])
        directory = self.root / sandbox_id
        await anyio.to_thread.run_sync(_stop_all, directory / "private")
        await anyio.to_thread.run_sync(lambda: shutil.rmtree(directory, ignore_errors=True))
        self.destroyed.append(sandbox_id)


def _stop_all(private: Path) -> None:
    if not private.is_dir():
        return
    for status in private.glob("*.status.json"):
        token = status.name[: -len(".status.json")]
        kill_supervised(JournalPaths(private, token), grace=2.0, include_supervisor=True)


# ------------------------------------------------------------------ the world

@dataclass
class Started:
    """A run as the reaper will find it."""

    run_id: str
    paths: JournalPaths
    sandbox_id: str | None


@dataclass
class Frozen:
    """Everything the reaper must not touch, captured at one instant."""

    record: dict[str, Any]
    log: list[LoggedEvent]
    closed: bool
    journal: bytes
    instance: InstanceRecord | None
    sandbox: bool


@dataclass
class ReaperWorld:
    """A store, sandboxes, and helpers to start runs the way a Runner leaves them."""

    store: Store
    sandboxes: DirSandboxes
    ttl: float = 3600.0
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    launched: list[JournalPaths] = field(default_factory=list)

    async def start(
        self,
        script: str,
        *,
        detached_ago: float | None = 1.0,
        run_id: str | None = None,
        sandbox: bool = True,
        logged_lines: int = 0,
        wait_exit: bool = False,
        wait_output: str | None = None,
    ) -> Started:
        """Start ``sh -c script`` under a supervisor; record the run as a dead host left it:
        the start batch (and the first ``logged_lines`` lines) in the log under an expired
        lease, ``detached_since = now - detached_ago`` (``None``: the host died without
        detaching, only its lapsed lease says nobody drives the run)."""
        run_id = run_id or f"run-{next(self._ids)}-{os.getpid()}-{time.monotonic_ns()}"
        sandbox_id: str | None = None
        if sandbox:
            sandbox_id, private = await self.sandboxes.create()
        else:
            private = self.sandboxes.root / f"nosandbox-{run_id}"
            private.mkdir(parents=True, mode=0o700)
        paths = JournalPaths.for_run(private, run_id)
        nonce = new_nonce()
        key = f"key-{run_id}" if sandbox_id else None
        await self.store.create(
            NewRun(
                run_id,
                f"thread-{run_id}",
                harness="command",
                spec={"argv": ["sh", "-c", script]},
                sandbox_key=key,
                journal={"dir": str(private), "nonce": nonce},
            )
        )
        if sandbox_id is not None and key is not None:
            await self.store.upsert_instance(
                InstanceRecord(key, self.sandboxes.name, sandbox_id, f"thread-{run_id}",
                               time.time())
            )
        self.launched.append(paths)
        await launch_supervised_async(AgentSpec(["sh", "-c", script], BASE_ENV), paths, nonce)
        if wait_exit:
            await wait_until_async(lambda: _exited(paths), f"agent of {run_id} to exit", timeout=20.0)
        if wait_output is not None:
            needle = wait_output.encode()
            await wait_until_async(lambda: needle in _read(paths.journal), f"output of {run_id}", timeout=20.0)
        # The original driver: held a claim and logged the start (and maybe some lines)…
        claim = await self.store.acquire_claim(run_id, "host-that-died", 0.05)
        record = await self.store.get(run_id)
        assert record is not None
        ctx = RunContext(run_id, record.thread_id)
        count = -1
        async for batch in translate_run(CommandHarness(), ctx, paths, nonce=nonce,
                                         follow=False):
            if batch.exit is not None or count >= logged_lines:
                break
            await self.store.append(
                run_id, [(event_to_dict(e), batch.journal_offset) for e in batch.events],
                epoch=claim.epoch,
            )
            count += 1
        # …then the viewer left and the host died (its lease lapses on its own).
        if detached_ago is not None:
            await self.store.update(run_id, RunPatch(detached_since=time.time() - detached_ago))
        await wait_until_async(lambda: time.time() > claim.expires_at, "the dead host's lease to lapse", timeout=20.0)
        return Started(run_id, paths, sandbox_id)

    async def bystander(self) -> tuple[Started, Frozen]:
        """A detached run that is still producing, and its state now: every sweep must
        leave it exactly so (an empty sweep cannot pass a test that holds one)."""
        busy = await self.start(f"echo x; {LONG}", wait_output="x")
        return busy, await self.freeze(busy)

    async def freeze(self, started: Started) -> Frozen:
        record = await self.store.get(started.run_id)
        assert record is not None
        key = record.sandbox_key
        return Frozen(
            record=record.to_dict(),
            log=await self.store.snapshot(started.run_id),
            closed=(await self.store.tail(started.run_id)).closed,
            journal=_read(started.paths.journal),
            instance=await self.store.get_instance(key) if key else None,
            sandbox=started.sandbox_id is not None and self.sandboxes.exists(started.sandbox_id),
        )

    async def sweep(self, **options: Any) -> ReapResult:
        kwargs: dict[str, Any] = {
            "probe": probe_run_exit,
            "drive": journal_drive(self.store),
            "ttl": self.ttl,
            "quiet": QUIET,
            "budget": 10.0,
            "reclaim": sandbox_reclaimer(self.sandboxes, self.store, destroy_timeout=10.0),
            "stop": journal_stop,
        }
        kwargs.update(options)
        return await reap_detached_runs(self.store, **kwargs)

    async def record(self, run_id: str) -> RunRecord:
        got = await self.store.get(run_id)
        assert got is not None
        return got

    async def text(self, run_id: str) -> str:
        """The assistant text the run's log holds (its deltas, concatenated)."""
        return "".join(
            e.event.get("delta", "") for e in await self.store.snapshot(run_id)
            if e.event.get("type") == "TEXT_MESSAGE_CONTENT"
        )

    def cleanup(self) -> None:
        for paths in self.launched:
            kill_supervised(paths, grace=1.0, include_supervisor=True)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def _exited(paths: JournalPaths) -> bool:
    st = read_status(paths.status)
    return st is not None and st.state == "exited"


def agent_alive(paths: JournalPaths) -> bool:
    """Whether the agent process of a supervised run is still running."""
    st = read_status(paths.status)
    if st is None:
        return False
    return st.state == "running" and is_ours(st.agent_pid, st.agent_start)


@asynccontextmanager
async def reaper_world(make_store: Factory) -> AsyncIterator[ReaperWorld]:
    """A :class:`ReaperWorld` over a fresh store from ``make_store`` and a temporary
    directory; kills every agent afterwards."""
    with tempfile.TemporaryDirectory(prefix="corral-reaper-") as tmp:
        async with opened(make_store) as store:
            world = ReaperWorld(store, DirSandboxes(Path(tmp) / "sandboxes"))
            try:
                yield world
            finally:
                await anyio.to_thread.run_sync(world.cleanup)


def entry(result: ReapResult, run_id: str) -> ReapEntry:
    found = [e for e in result.runs if e.run_id == run_id]
    assert len(found) == 1, f"expected one entry for {run_id}, got {result.runs}"
    return found[0]


def assert_counts(result: ReapResult, **expected: int) -> None:
    """Every outcome key is present; the named ones have these counts, the rest zero."""
    assert set(result.outcomes) == set(ReapOutcome)
    want = {o: expected.get(o.name.lower(), 0) for o in ReapOutcome}
    assert result.outcomes == want, result.runs


async def assert_untouched(world: ReaperWorld, started: Started, before: Frozen) -> None:
    after = await world.freeze(started)
    assert after.record == before.record  # epoch, detached_since, cancel, status, updated_at
    assert after.log == before.log
    assert after.closed is before.closed is False
    assert after.instance == before.instance
    assert after.sandbox == before.sandbox
