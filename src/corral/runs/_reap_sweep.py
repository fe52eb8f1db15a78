"""The reaper: finish or expire runs whose viewers left, and reclaim their sandboxes.

The rule everything here follows: **never drive a run to learn whether it finished.**
Driving goes through :func:`~corral.runs._pipe.pipe_to_run_log`, which always ends in a
terminal status and a closed log. Driving a run whose agent is still working would end every
attached viewer's stream, record a transcript that is not finished, and drop the run out of
``list_reclaimable`` for good (so its sandbox would never be reclaimed). Whether the agent
finished is learned out of band, by probing the end of its journal
(:func:`corral.runs._run_probe.probe_run_exit`); a run is driven only when the probe saw its exit,
or when its detach TTL has run out (then the outcome is terminal either way). A run whose
journal is on another host (a second host sharing the store) is never touched, expired or
not: only that host can tell whether its agent finished, or stop it.

"Detached" here means unattended (:attr:`RunRecord.unattended_since`): a viewer left
(``detached_since``), or the run's driver died without detaching, at any moment, and its
lease lapsed (its end is the moment the TTL counts from). A run under a live lease that is
not detached is never listed, so never touched.

The reaper never clears ``detached_since``: it selects on it, and clearing it would restart
the TTL on every sweep. Only a viewer attaching clears it (inside its claim).

The library function has no timer. ``corral reap`` runs one sweep; ``corral serve`` runs
sweeps on an interval under a store-wide lock.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import anyio

from corral._log import library_logger
from corral._telemetry import span
from corral.journal._exit_probe import ProbeResult
from corral.runs._claims import hold_claim
from corral.runs._owner import new_owner_id, owner_is_dead
from corral.runs._pipe import PipeResult, PipeStore, Produced, pipe_to_run_log
from corral.runs._quiesce import DEFAULT_QUIET, await_log_quiet
from corral.runs._reap_limits import DEFAULT_BUDGET, DEFAULT_MAX_RUNS
from corral.runs._takeovers import DEFAULT_MAX_TAKEOVERS, TakeoverLimit, count_takeover, raising
from corral.stores._records import RunRecord, RunStatus
from corral.stores._protocols import ClaimLost, ClaimRefused, ClaimStore

__all__ = [
    "DEFAULT_BUDGET",
    "DEFAULT_LEASE_TTL",
    "DEFAULT_MAX_RUNS",
    "Drive",
    "ProbeResult",
    "ReapEntry",
    "ReapOutcome",
    "ReapResult",
    "ReapStore",
    "reap_detached_runs",
]

log = library_logger("corral.runs._reap_sweep")

DEFAULT_LEASE_TTL: Final = 30.0
"""Seconds of the reaper's claim lease (renewed in the background while it drives)."""


class ReapOutcome(enum.StrEnum):
    """What one sweep did to one run."""

    FINALIZED = "finalized"
    """The agent had exited; the run was driven to a terminal status and its sandbox
    reclaimed."""
    EXPIRED = "expired"
    """Detached for at least the TTL; a cancel was recorded and the run driven to a terminal
    status (``completed`` if the agent had finished, ``aborted`` if the budget stopped it)."""
    PRODUCING = "producing"
    """No exit in the journal yet: nothing was touched."""
    UNKNOWN = "unknown"
    """The probe could not tell: nothing was touched; ``error`` says why."""
    BUDGET_EXCEEDED = "budget-exceeded"
    """Anomaly on the finalization path: the drive of an exited agent outran the budget.
    The run is terminal anyway (``terminalized_anyway``)."""
    NOT_CLAIMED = "not-claimed"
    """Someone else owns the run (a viewer came back, another reaper, a live host), or the
    run ended in other hands; or the claim was lost while driving."""
    RECLAIM_FAILED = "reclaim-failed"
    """The run is terminal and its transcript saved, but reclaiming its sandbox failed; a
    later sweep will not retry (the run left the listing). ``error`` says why."""
    FAILED = "failed"
    """Something else went wrong; logged, and the sweep went on. Also a drive whose
    terminal status the store would not take (after retries): the run is left ``running``
    with its log open and its sandbox in place, for the next sweep to finish."""


Probe = Callable[[RunRecord], Awaitable[ProbeResult]]
"""``probe(record)``: look at the journal's tail without driving the run."""

Drive = Callable[[RunRecord, int, anyio.Event], AsyncIterable[Produced]]
"""``drive(record, epoch, abort)``: the events that finish the run from where its log
stopped (what :func:`pipe_to_run_log` consumes). Called only under the claim and after the
log is quiet; it must stop producing once ``abort`` is set."""

Reclaim = Callable[[RunRecord], Awaitable[object]]
"""``reclaim(record)``: tear down the run's sandbox; raising means it was not torn down."""

Stop = Callable[[RunRecord], Awaitable[object]]
"""``stop(record)``: make sure the agent of an expired run is not running any more."""


class ReapStore(PipeStore, ClaimStore, Protocol):
    """What the reaper needs from a store: records, claims and the event log."""


@dataclass(frozen=True, slots=True)
class ReapEntry:
    """One run's line in a sweep's result."""

    run_id: str
    outcome: ReapOutcome
    status: RunStatus | None = None
    """The run's status after the sweep, when it was driven."""
    exit_code: int | None = None
    """The agent's exit code, when the probe or the drive learned it."""
    terminalized_anyway: bool | None = None
    """Set only when the drive outran its budget on the finalization path (the
    ``budget-exceeded`` anomaly, which a failed reclaim may have overwritten in
    ``outcome``): whether the run reached a terminal status nonetheless."""
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form; unknown fields are left out."""
        out: dict[str, Any] = {"run_id": self.run_id, "outcome": self.outcome.value}
        if self.status is not None:
            out["status"] = self.status.value
        if self.exit_code is not None:
            out["exit_code"] = self.exit_code
        if self.terminalized_anyway is not None:
            out["terminalized_anyway"] = self.terminalized_anyway
        if self.error is not None:
            out["error"] = self.error
        return out


def _zero_outcomes() -> dict[ReapOutcome, int]:
    return dict.fromkeys(ReapOutcome, 0)


@dataclass(slots=True)
class ReapResult:
    """A sweep's summary: runs taken on, probes made, a count per outcome (every outcome is
    a key) and one entry per run, in the order they were handled."""

    considered: int = 0
    probed: int = 0
    outcomes: dict[ReapOutcome, int] = field(default_factory=_zero_outcomes)
    runs: list[ReapEntry] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The ``corral reap --json`` object."""
        return {
            "considered": self.considered,
            "probed": self.probed,
            "outcomes": {o.value: n for o, n in self.outcomes.items()},
            "runs": [e.to_dict() for e in self.runs],
        }


class _NotClaimed(Exception):
    """The run turned out to be someone else's after the claim was taken."""


async def _lazy(
    drive: Drive, record: RunRecord, epoch: int, abort: anyio.Event
) -> AsyncIterator[Produced]:
    """``drive``'s events, started at the first pull, so that even a ``drive`` that fails
    when called ends inside the pipe (a ``failed`` run with a closed log) and the inner
    iterator is closed with the outer one."""
    inner = aiter(drive(record, epoch, abort))
    try:
        async for item in inner:
            yield item
    finally:
        aclose = getattr(inner, "aclose", None)
        if aclose is not None:
            await aclose()


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _still_expired(listed: RunRecord, current: RunRecord, epoch: int, cutoff: float) -> bool:
    """Whether the expiry decided from the listing still holds, judged from ``current``
    (read under our claim, taken at ``epoch``).

    Detached: ``detached_since`` is still set and old enough (the attach path clears it
    inside its own claim; a viewer that came and left again re-stamped it). Unattended
    through a lapsed lease: our claim replaced that lease, so the listing's verdict holds
    only if nobody claimed the run in between (our epoch is the listed one plus one) and
    nobody detached it since.
    """
    if current.detached_since is not None:
        return current.detached_since <= cutoff
    return listed.detached_since is None and epoch == listed.driver_epoch + 1


@dataclass(slots=True)
class _Sweep:
    store: ReapStore
    probe: Probe
    drive: Drive
    reclaim: Reclaim | None
    stop: Stop | None
    cutoff: float
    budget: float
    quiet: float
    owner: str
    lease_ttl: float
    logger: logging.Logger
    max_takeovers: int | None = DEFAULT_MAX_TAKEOVERS
    probed: int = 0

    async def reap_one(self, record: RunRecord) -> ReapEntry:
        run_id = record.run_id
        try:
            return await self._reap_one(record)
        except (ClaimRefused, ClaimLost, _NotClaimed) as exc:
            self.logger.debug("reap: not driving run %s: %s", run_id, exc)
            return ReapEntry(run_id, ReapOutcome.NOT_CLAIMED, error=_describe(exc))
        except Exception as exc:  # one bad run must not end the sweep
            self.logger.error("reap: sweeping run %s failed: %s", run_id, exc, exc_info=exc)
            return ReapEntry(run_id, ReapOutcome.FAILED, error=_describe(exc))

    async def _reap_one(self, record: RunRecord) -> ReapEntry:
        run_id = record.run_id
        since = record.unattended_since
        expired = since is not None and since <= self.cutoff
        exit_code: int | None = None
        self.probed += 1
        probe = await self.probe(record)
        if probe.state == "elsewhere":
            # Another host keeps this run's journal: only it can tell whether the agent
            # finished, or stop it; expiring from here would leave the agent running.
            self.logger.warning("reap: leaving run %s: %s", run_id, probe.error)
            return ReapEntry(run_id, ReapOutcome.UNKNOWN, error=probe.error)
        if not expired:
            if probe.state == "producing":
                return ReapEntry(run_id, ReapOutcome.PRODUCING)
            if probe.state in ("not-started", "gone"):
                self.logger.info("reap: run %s: %s", run_id, probe.error)
            elif probe.state != "finished":
                self.logger.warning("reap: cannot tell whether run %s finished: %s",
                                    run_id, probe.error)
                return ReapEntry(run_id, ReapOutcome.UNKNOWN, error=probe.error)
            exit_code = probe.exit_code

        budget_fired = False
        pipe: PipeResult
        # allow_cancelled: a cancel recorded by a host that then died must still end the run
        # (otherwise it can never be terminalized and its sandbox leaks). The claim never
        # clears detached_since: the reaper selects on it.
        # A lease whose owner provably died on this machine is broken at once (the store
        # compares the owner, so a stale listing cannot break a live driver's lease).
        dead = record.claim_owner if owner_is_dead(record.claim_owner) else None
        async with hold_claim(
            self.store,
            run_id,
            self.owner,
            self.lease_ttl,
            allow_cancelled=True,
            break_lease_of=dead,
        ) as held:
            current = await self.store.get(run_id)
            if current is None:
                raise _NotClaimed(f"run {run_id!r} vanished before it could be reaped")
            if expired:
                # Re-derived from a read under the claim: the attach path clears
                # detached_since inside its own claim, and cancel_requested is sticky, so a
                # cancel written from the stale listing would poison a run a viewer owns now.
                if not _still_expired(record, current, held.epoch, self.cutoff):
                    raise _NotClaimed(f"a viewer came back to run {run_id!r} (or another "
                                      "driver took it) since it was listed")
                await self.store.request_cancel(run_id)
            await await_log_quiet(self.store, run_id, self.quiet)
            # Taking over from a driver that never let go counts toward the takeover limit,
            # as a Runner's driver does (corral.runs._takeovers): a run whose replay kills
            # the host driving it stops being adopted by one sweep after another.
            limit: TakeoverLimit | None = None
            count = await count_takeover(
                self.store, current, (await self.store.tail(run_id)).last_offset,
                held.epoch, record.claim_owner is not None)
            if self.max_takeovers is not None and count > self.max_takeovers:
                limit = TakeoverLimit(count, self.max_takeovers)
                self.logger.warning("reap: run %s: %s", run_id, limit)
            # Armed only now: the budget bounds the drive, not the wait for the claim or the
            # quiet window (a budget spent on waiting would record a finished agent as
            # aborted, close its log, and then reclaim the sandbox holding its journal).
            abort = anyio.Event()

            async def arm_budget() -> None:
                nonlocal budget_fired
                await anyio.sleep(self.budget)
                budget_fired = True
                abort.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(arm_budget)
                pipe = await pipe_to_run_log(
                    self.store,
                    run_id,
                    _lazy(self.drive, current, held.epoch, abort) if limit is None
                    else raising(limit),
                    epoch=held.epoch,
                    abort=abort,
                )
                tg.cancel_scope.cancel()

        final = pipe.record
        status = final.status if final is not None else pipe.status
        terminal = not pipe.claim_lost and status.terminal
        if pipe.exit_code is not None:
            exit_code = pipe.exit_code
        if pipe.record_error is not None:
            # We held the claim: nobody else owns the run. It stays running with its log
            # open (the pipe closes only after a stored status) and its sandbox in place
            # (never reclaim a run that is not terminal); the next sweep finishes it.
            self.logger.error("reap: run %s: %s", run_id, pipe.record_error)
            return ReapEntry(run_id, ReapOutcome.FAILED, status=status, exit_code=exit_code,
                             error=pipe.record_error)
        if budget_fired and not expired:
            outcome = ReapOutcome.BUDGET_EXCEEDED
        elif not terminal:
            # The terminal write was refused by the fence: another driver owns the run now.
            outcome = ReapOutcome.NOT_CLAIMED
        else:
            outcome = ReapOutcome.EXPIRED if expired else ReapOutcome.FINALIZED
        # Captured before reclaim may overwrite the outcome.
        terminalized_anyway = terminal if outcome is ReapOutcome.BUDGET_EXCEEDED else None
        error: str | None = None
        if expired and terminal and self.stop is not None:
            try:
                await self.stop(current)
            except Exception as exc:  # noqa: BLE001 - reclaim below still destroys the sandbox
                self.logger.warning("reap: stopping the agent of run %s failed: %s", run_id, exc)
        if terminal and self.reclaim is not None:
            try:
                # The originally listed record: the one re-read after the drive may come from
                # a fallback path without sandbox_key, and reclaim must never guess.
                await self.reclaim(record)
            except Exception as exc:  # noqa: BLE001 - reported, with status and exit code kept
                outcome = ReapOutcome.RECLAIM_FAILED
                error = _describe(exc)
                self.logger.error("reap: reclaiming the sandbox of run %s failed: %s",
                                  run_id, exc)
        return ReapEntry(
            run_id,
            outcome,
            status=status,
            exit_code=exit_code,
            terminalized_anyway=terminalized_anyway,
            error=error,
        )


async def reap_detached_runs(
    store: ReapStore,
    *,
    probe: Probe,
    drive: Drive,
    ttl: float,
    now: float | None = None,
    budget: float = DEFAULT_BUDGET,
    max_runs: int = DEFAULT_MAX_RUNS,
    quiet: float = DEFAULT_QUIET,
    reclaim: Reclaim | None = None,
    stop: Stop | None = None,
    owner: str | None = None,
    lease_ttl: float = DEFAULT_LEASE_TTL,
    logger: logging.Logger | None = None,
    max_takeovers: int | None = DEFAULT_MAX_TAKEOVERS,
) -> ReapResult:
    """Sweep unattended runs once: finalize those whose agent exited (or was never
    launched), expire those unattended for at least ``ttl`` seconds, and leave every other
    run exactly as it was. Unattended: detached, or its driver's lease lapsed
    (:attr:`RunRecord.unattended_since`).

    One ``list_reclaimable(now, 0, limit=max_runs)`` (every unattended run is a finalization
    candidate; expiry is decided here against the inclusive cutoff ``now - ttl``), then the
    runs one after another. Per run: expired → claim, re-read under the claim (a viewer came
    back → ``not-claimed``), record the cancel; not expired → ``probe`` first, and on
    ``producing``/``unknown`` touch nothing (no claim, no epoch bump, no write); on
    ``finished`` claim. Then wait for the log to be quiet (``quiet`` seconds), arm the
    ``budget``, drive with ``drive`` through the fenced pipe, classify, and — only for a
    terminal run — ``stop`` (expired runs) and ``reclaim`` with the listed record.

    Claiming a run whose driver never let go is a takeover, counted as a Runner's driver
    counts it (:mod:`corral.runs._takeovers`): past ``max_takeovers`` in a row without
    progress (``None``: no limit) the run is ended ``failed`` (code ``takeover_limit``)
    instead of driven, then reclaimed like any ended run.

    Never raises for a run or a store failure: every failure is logged and counted. Task
    cancellation from outside is not swallowed.
    """
    with span("corral.reaper.sweep", {"corral.reaper.owner": owner or ""}):
        logger = logger or log
        result = ReapResult()
        at = time.time() if now is None else now
        cap = max(0, int(max_runs))
        try:
            batch = await store.list_reclaimable(at, 0.0, limit=cap)
        except Exception as exc:  # noqa: BLE001 - a sweep never raises
            logger.error("reap: listing detached runs failed: %s", exc)
            return result
        sweep = _Sweep(
            store=store,
            probe=probe,
            drive=drive,
            reclaim=reclaim,
            stop=stop,
            cutoff=at - ttl,
            budget=budget,
            quiet=quiet,
            owner=owner or new_owner_id(),
            lease_ttl=lease_ttl,
            logger=logger,
            max_takeovers=max_takeovers,
        )
        result.considered = len(batch)
        # One run at a time: each may cost a claim, a provider call and a replay; fanning out
        # multiplies peak load for throughput the next sweep supplies anyway.
        for record in batch:
            entry = await sweep.reap_one(record)
            result.outcomes[entry.outcome] += 1
            result.runs.append(entry)
        result.probed = sweep.probed
        return result
