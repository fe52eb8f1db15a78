"""The server's run-keeping: who drives what, who watches what, and the periodic chores.

The server drives every run it starts, in a background task it owns, whether or not anyone
watches: a viewer leaving never stops a run. So ``detached_since`` means "nobody watches"
here, not "nobody drives":

- a run the server starts is stamped detached at once (no viewer yet);
- the first viewer of a run in this process clears the stamp; the last one leaving sets it
  (:meth:`Runner.detach`, which leaves terminal and cancelled runs alone);
- viewers may sit on several server processes, and one process's last viewer leaving
  stamps the run even though another process still has viewers; so every
  ``presence_interval`` each process clears the stamp again on the runs it has viewers of;
- a viewer arriving at a run whose driver is gone (another server process died, a
  ``corral run`` was killed) makes this process drive it: :meth:`Runner.drive` takes over at
  once from a dead driver on this machine, after lease expiry from one elsewhere. The same
  check runs every ``presence_interval`` for runs watched here, so a driver dying while
  someone watches is noticed too;
- a run this process drives that nobody watched for ``reap_ttl`` is cancelled (expired)
  by this process on its reaper interval; runs nobody drives are the store-wide reaper's.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Final

import anyio
from anyio.abc import TaskGroup

from corral._errors import CorralError
from corral._log import library_logger
from corral.runs._owner import driver_gone
from corral.stores._records import RunPatch, RunRecord
from corral.runs._runner import Runner, RunRequest
from corral.stores._protocols import LoggedEvent, Store
from corral.server._config import ServerConfig
from corral.server._run_fanout import FeedHub
from corral.stores import open_store
from corral.server._reap_loop import reaper_loop

log = library_logger("corral.server")

SHUTDOWN_GRACE: Final = 10.0
"""Seconds drives get to detach (between batches) when the server stops."""


class TooManyRuns(CorralError):
    """The server already drives as many runs as it is configured to."""


class RunService:
    """Runs as the HTTP layer sees them. Use inside :meth:`running`."""

    def __init__(
        self,
        config: ServerConfig,
        encode: Callable[[LoggedEvent], bytes],
        *,
        store: Store | None = None,
        runner: Runner | None = None,
    ) -> None:
        self.config = config
        self._encode = encode
        self._given_runner = runner
        self._given_store = runner.store if runner is not None else store
        self.driving: dict[str, anyio.Event] = {}
        """run id → the event that asks its drive to detach."""
        self.viewers: dict[str, int] = {}
        self.closing = anyio.Event()
        self._store: Store | None = None
        self._runner: Runner | None = None
        self._tg: TaskGroup | None = None
        self._hub: FeedHub | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def store(self) -> Store:
        assert self._store is not None, "RunService used outside running()"
        return self._store

    @property
    def runner(self) -> Runner:
        assert self._runner is not None, "RunService used outside running()"
        return self._runner

    @property
    def hub(self) -> FeedHub:
        assert self._hub is not None, "RunService used outside running()"
        return self._hub

    @asynccontextmanager
    async def running(self) -> AsyncIterator[RunService]:
        """Open the store, start the background chores; on exit detach every drive and
        close the store."""
        store = self._given_store or await open_store(self.config.store_url)
        try:
            self._store = store
            self._runner = self._given_runner or Runner(store, lease_ttl=self.config.lease_ttl)
            if store.url.startswith("memory:"):
                log.warning(
                    "store %s lives in this process only: runs do not survive a restart and "
                    "other server processes or hosts cannot share, take over or reap them; "
                    "use a sqlite:// store (or a shared database) for durable runs",
                    store.url,
                )
            elif store.url.startswith("sqlite:"):
                log.info(
                    "store %s: server processes on this machine share, take over and reap "
                    "runs; other hosts cannot (that needs a shared database store)",
                    store.url,
                )
            elif store.url.startswith(("postgresql:", "postgres:")):
                log.info(  # the URL as the store shows it: password masked
                    "store %s: server processes on every host using it share, take over and "
                    "reap runs (keep the hosts' clocks synchronized)",
                    store.url,
                )
            async with anyio.create_task_group() as tg:
                self._tg = tg
                self._hub = FeedHub(store, tg, self._encode)
                tg.start_soon(self._presence_loop)
                if self.config.reaper:

                    tg.start_soon(reaper_loop, self)
                try:
                    yield self
                finally:
                    self.begin_shutdown()
                    with anyio.CancelScope(shield=True):
                        await self._stop_drives()
                    tg.cancel_scope.cancel()
        finally:
            self._tg = None
            if self._given_store is None:
                with anyio.CancelScope(shield=True):
                    await store.aclose()

    def begin_shutdown(self) -> None:
        """Make every event stream end now (the server is stopping)."""
        if not self.closing.is_set():
            self.closing.set()
            if self._hub is not None:
                self._hub.wake_all()

    async def _stop_drives(self) -> None:
        for stop in self.driving.values():
            stop.set()
        with anyio.move_on_after(SHUTDOWN_GRACE):
            while self.driving:
                await anyio.sleep(0.05)
        if self.driving:
            log.warning("%d drive(s) did not detach within %.0f s; their leases will lapse",
                        len(self.driving), SHUTDOWN_GRACE)

    # ------------------------------------------------------------------ runs

    async def start_run(self, request: RunRequest) -> RunRecord:
        """Start a run and drive it in the background. Nobody watches yet, so the run is
        stamped detached until a viewer arrives."""
        if len(self.driving) >= self.config.max_active_runs:
            raise TooManyRuns(
                f"this server already drives {len(self.driving)} runs (the limit is "
                f"{self.config.max_active_runs}); wait for some to finish or cancel them"
            )
        record = await self.runner.start(request)
        if not record.terminal:
            stamped = await self.store.update(
                record.run_id, RunPatch(detached_since=time.time())
            )
            record = stamped or record
            self.ensure_driving(record.run_id)
        return record

    def ensure_driving(self, run_id: str) -> None:
        """Drive ``run_id`` in a background task unless this process already does."""
        if run_id in self.driving or self._tg is None or self.closing.is_set():
            return
        stop = anyio.Event()
        self.driving[run_id] = stop
        self._tg.start_soon(self._drive, run_id, stop)

    async def _drive(self, run_id: str, stop: anyio.Event) -> None:
        try:
            result = await self.runner.drive(run_id, stop=stop, clear_detached=False)
            log.info("run %s: %s", run_id,
                     "detached" if result.detached else result.record.status.value)
        except Exception as exc:  # noqa: BLE001 - one run's failure must not stop the server
            log.error("driving run %s failed: %s", run_id, exc, exc_info=exc)
        finally:
            self.driving.pop(run_id, None)

    async def cancel(self, run_id: str) -> RunRecord:
        """Cancel from this process, whoever drives the run."""
        return await self.runner.cancel(run_id)

    # ------------------------------------------------------------------ viewers

    async def viewer_arrived(self, run_id: str) -> None:
        count = self.viewers.get(run_id, 0) + 1
        self.viewers[run_id] = count
        if count == 1:
            try:
                await self._assert_presence(run_id)
            except Exception as exc:  # noqa: BLE001 - the presence loop retries every second
                log.warning("noting a viewer of run %s failed: %s", run_id, exc)

    async def viewer_left(self, run_id: str) -> None:
        count = self.viewers.get(run_id, 0) - 1
        if count > 0:
            self.viewers[run_id] = count
            return
        self.viewers.pop(run_id, None)
        try:
            await self.runner.detach(run_id)
        except Exception as exc:  # noqa: BLE001 - the next presence pass or the TTL copes
            log.warning("marking run %s unwatched failed: %s", run_id, exc)

    async def _assert_presence(self, run_id: str) -> None:
        """Someone here watches ``run_id``: clear its detached stamp, and drive it if its
        driver is gone."""
        record = await self.store.get(run_id)
        if record is None or record.terminal:
            return
        if record.detached_since is not None and run_id in self.viewers:
            await self.store.update(run_id, RunPatch(detached_since=None))
        if run_id not in self.driving and driver_gone(record):
            log.info("run %s: its driver is gone; taking it over", run_id)
            self.ensure_driving(run_id)

    async def _presence_loop(self) -> None:
        while True:
            await anyio.sleep(self.config.presence_interval)
            for run_id in list(self.viewers):
                try:
                    await self._assert_presence(run_id)
                except Exception as exc:  # noqa: BLE001 - retried next pass
                    log.warning("presence check of run %s failed: %s", run_id, exc)

    # ------------------------------------------------------------------ expiry

    async def expire_unwatched(self, ttl: float, now: float | None = None) -> list[str]:
        """Cancel the runs this process drives that nobody watched for ``ttl`` seconds.

        Only runs whose claim this process holds: a run it merely waits to take over is
        its holder's to expire. Returns the run ids cancelled.

        The decision is read just before the cancel; a viewer arriving on another server
        process in the milliseconds between is too late (the same as arriving after).
        """
        cutoff = (time.time() if now is None else now) - ttl
        expired: list[str] = []
        for run_id in list(self.driving):
            if self.viewers.get(run_id):
                continue
            record = await self.store.get(run_id)
            if (
                self.viewers.get(run_id)  # arrived while we read
                or record is None
                or record.terminal
                or record.detached_since is None
                or record.detached_since > cutoff
                or record.claim_owner != self.runner.owner
            ):
                continue
            log.info("run %s: nobody watched it for %.0f s; cancelling it", run_id, ttl)
            try:
                await self.runner.cancel(run_id)
            except Exception as exc:  # noqa: BLE001 - retried next interval
                log.error("expiring run %s failed: %s", run_id, exc)
                continue
            expired.append(run_id)
        return expired
