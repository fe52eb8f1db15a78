"""The Runner: start, drive (and take over), watch, detach and cancel durable runs.

One driving path serves every case. ``start`` creates the record, and under a first claim
makes the sandbox, logs the harness's start batch and launches the supervised agent; then it
releases the claim. Whoever wants the run to progress calls :meth:`Runner.drive`: it takes a
claim (breaking the lease of a driver that provably died on this machine, or waiting for a
remote one's lease to lapse), continues translating the journal after the journal offset
stored with the last logged event, and pipes the batches into the fenced log. A foreground
``corral run`` is ``start`` + ``drive``; ``corral attach`` and a takeover are just ``drive``.

Invariants kept here (DESIGN §4):

- every append and every terminal write carries the claim's epoch (the store fences them);
- a batch (the events of one journal item) is appended atomically with its journal offset,
  so a successor neither repeats nor skips events;
- a cancel is recorded in the store first (sticky), then the canceller takes the claim
  (fencing any live driver), stops the agent, logs the journal's rest, destroys the sandbox
  and ends the log;
- leaving (detach) stops driving between batches without a status or a close, and stamps
  ``detached_since`` unless a cancel is recorded; so does a ``drive`` whose task is
  cancelled (only :meth:`Runner.cancel` ends a run early);
- a cancel logs what the journal holds beyond the log (up to the agent's stop) before it
  destroys the sandbox and ends the log.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from corral._log import library_logger
from corral._paths import corral_home
from corral._telemetry import carrier, configure_from_env, context_of, mark_error, span
from corral.journal._layout import JournalPaths
from corral.journal._exit_probe import JournalLocationError, machine_id
from corral.journal._sentinel import new_nonce
from corral.runs._claims import hold_claim
from corral.runs._drive import POLL, ClaimedDrive, cancel_run
from corral.runs._file_feed_wiring import unlogged_file_events
from corral.runs._owner import driver_gone, new_owner_id
from corral.runs._pipe import LogBatch, PipeResult, Produced
from corral.runs._providers import ProviderCache
from corral.runs._placement import site_of
from corral.runs._produce import AgentNeverStarted, Checkpoint, continue_run
from corral.runs._release import definition_of, release_sandbox
from corral.runs._spec import check_harness, harness_for_record, run_spec_of
from corral.runs._request import (
    DEFAULT_LEASE_TTL,
    DEFAULT_MAX_OUTPUT,
    DriveResult,
    RunRequest,
    RunStartError,
    lease_ttl_from_env,
    max_takeovers_from,
    new_run_id,
)
from corral._errors import CorralError
from corral.runs._site import AgentSite
from corral.sandbox._contracts import Handle, Provider
from corral.sandbox._redact import Redactor
from corral.sandbox._secrets import Secrets
from corral.sandbox._watch import DEFAULT_MAX_WATCHES, check_max_watches
from corral.stores._protocols import (
    ClaimLost,
    ClaimRefused,
    LoggedEvent,
    NewRun,
    RefusalReason,
    Store,
    UnknownRun,
)
from corral.stores._records import RunPatch, RunRecord

if TYPE_CHECKING:
    from corral.journal._prune import PruneResult
    from corral.runs._reap_sweep import ReapResult
    from corral.runs._threads import Threads
    from corral.tools._core import Toolset

__all__ = [
    "DEFAULT_LEASE_TTL",
    "DEFAULT_MAX_OUTPUT",
    "DriveResult",
    "RunRequest",
    "RunStartError",
    "Runner",
    "lease_ttl_from_env",
    "new_run_id",
]

log = library_logger("corral.runs._runner")


class Runner:
    """Drives durable runs against one store. Safe to use from many processes at once.

    A façade: launching (:mod:`~corral.runs._launch`), the produce path
    (:mod:`~corral.runs._produce`), the services daemon (:mod:`~corral.runs._keep_services`),
    host tools (:mod:`~corral.runs._host_tools`), file events
    (:mod:`~corral.runs._file_feed_wiring`), the agent's end (:mod:`~corral.runs._agent_end`)
    and the sandbox's release (:mod:`~corral.runs._release`) each live in their own module."""

    def __init__(
        self,
        store: Store,
        *,
        lease_ttl: float | None = None,
        journals_dir: str | os.PathLike[str] | None = None,
        provider_config: Mapping[str, Mapping[str, Any]] | None = None,
        tools: Toolset | None = None,
        approval_timeout: float = 300.0,
        max_file_watches: int = DEFAULT_MAX_WATCHES,
        max_takeovers: int | None = None,
    ) -> None:
        """``tools``: host tools for the agent-CLI runs this runner starts and drives (a
        :class:`RunRequest` or :meth:`drive` may give its own). ``approval_timeout``: how long
        a call of an ``approval=True`` tool waits for ``corral approve``.
        ``max_file_watches``: directories a run's file events watch at most (changes in
        others are logged by a workspace walk before the run's end). ``max_takeovers``:
        how many drivers in a row may take a run over and die without it making progress
        (no new logged event) before the next one ends it ``failed`` (code
        ``takeover_limit``) instead of driving it; default ``$CORRAL_MAX_TAKEOVERS`` or 3
        (``none`` there: no limit)."""
        configure_from_env()  # OTEL_* ask for export and the application set up none
        self.store = store
        self.max_file_watches = check_max_watches(max_file_watches)
        self.max_takeovers = max_takeovers_from(max_takeovers)
        self.tools = tools
        self.approval_timeout = approval_timeout
        self._run_tools: dict[str, Toolset] = {}
        # The secrets of runs this runner started: a definition rebuilt from the record
        # lacks values given in code (only env/file origins are recorded).
        self._run_secrets: dict[str, Secrets] = {}
        self.lease_ttl = lease_ttl if lease_ttl is not None else lease_ttl_from_env()
        self.journals_dir = Path(journals_dir) if journals_dir else corral_home() / "journals"
        self.owner = new_owner_id()
        self._providers = ProviderCache(provider_config)
        self.checkpoint: Checkpoint | None = None
        """The produce path's step hook (:data:`corral.runs._produce.Checkpoint`), for
        tests that inject kill points; ``None`` in production."""

    @property
    def threads(self) -> Threads:
        """This runner's threads (#27): list, show, undo, fork, remove
        (:class:`~corral.Threads`)."""
        # start-up cost: threads load the checkpoint and ensure machinery, no driver's
        from corral.runs._threads import Threads

        return Threads(self)

    # ------------------------------------------------------------------ helpers

    def provider(self, name: str, config: Mapping[str, Any] | None = None,
                 package: str | None = None) -> Provider:
        """The registered provider ``name`` with ``config`` (as a record names it; ``None``:
        this runner's configuration for it), built once per runner."""
        return self._providers.get(name, config, package)

    def _providers_of(self, record: RunRecord) -> Callable[[str], Provider]:
        return self._providers.for_record(record)

    def _site(self, record: RunRecord) -> AgentSite | None:
        """Where the run's agent lives (``None``: its record names no journal)."""
        try:
            return site_of(record, journals_dir=self.journals_dir,
                           provider_for=lambda name: self._providers_of(record)(name))
        except JournalLocationError:
            return None

    async def sandbox_of(self, record: RunRecord) -> Handle | None:
        """The run's sandbox (resumed with the provider configuration its definition
        recorded), or ``None`` when it is gone or the run names none."""
        ref = record.sandbox_ref or {}
        name, sandbox_id = ref.get("provider"), ref.get("id")
        if not isinstance(name, str) or not isinstance(sandbox_id, str):
            return None
        try:
            return await self._providers_of(record)(name).resume(sandbox_id)
        except CorralError as exc:
            log.warning("run %s: its sandbox is unreachable: %s", record.run_id, exc)
            return None

    def redactor_for(self, record: RunRecord) -> Redactor | None:
        """The redactor of the run's secrets as known on this host (``None``: no secrets)."""
        secrets = self._secrets_for(record)
        return secrets.redactor() if secrets is not None else None

    def _secrets_for(self, record: RunRecord) -> Secrets | None:
        known = self._run_secrets.get(record.run_id)
        if known is not None:
            return known
        recorded = run_spec_of(record).sandbox
        if recorded is None or not recorded.get("secrets"):
            # No secrets recorded, so none to find: rebuilding the definition (it loads the
            # provider registry) would only delay a takeover (``corral attach``).
            return None
        sandbox = definition_of(record)
        if sandbox is None or not len(sandbox.secrets):
            return None
        return sandbox.secrets

    def _journal_paths(self, record: RunRecord) -> JournalPaths | None:
        site = self._site(record)
        return site.paths if site is not None else None

    def _forget(self, run_id: str) -> None:
        self._run_tools.pop(run_id, None)
        self._run_secrets.pop(run_id, None)

    async def _require(self, run_id: str) -> RunRecord:
        record = await self.store.get(run_id)
        if record is None:
            raise UnknownRun(run_id)
        return record

    # ------------------------------------------------------------------ start

    async def start(self, request: RunRequest) -> RunRecord:
        """Create the run, make its sandbox and launch the supervised agent.

        Returns the record once the agent is running; nobody drives it until
        :meth:`drive` is called. On failure the run is recorded as failed (its log ends
        with a ``RUN_ERROR``), the new sandbox is destroyed, and :class:`RunStartError` is
        raised.
        """
        # Imported here for start-up cost: launching loads the agent-CLI stack (harness
        # adapters, sessions, model proxy, httpx), which a driver taking over (``corral
        # attach``) of a command run never needs.
        from corral.runs._plan import plan_start

        plan = plan_start(request, self.tools)  # checked before anything is recorded
        # A provider that can tell at once it cannot work (a Docker daemon that does not
        # answer) says so now: a run refused before it starts leaves no record.
        preflight = getattr(plan.provider, "preflight", None)
        if preflight is not None:
            await preflight()
        run_id = request.run_id or new_run_id()
        thread_id = request.thread_id or run_id
        # Imported here for start-up cost, as _plan
        from corral.runs._launch import fail_start, launch_run
        # (the instance key's module loads the workspace definitions: start-up cost for
        # a driver taking a run over, which never computes a key)
        from corral.sandbox._key import RunContext as SandboxContext

        # (an exception marks the span failed)
        with span("corral.run.start", {"corral.run.id": run_id, "corral.thread.id": thread_id,
                                       "gen_ai.agent.name": plan.harness.name}):
            sandbox = plan.sandbox
            trace = carrier()  # this start's span: drivers on any host continue its trace
            if trace:
                plan.spec = replace(plan.spec, trace=trace)
            if len(sandbox.secrets):
                self._run_secrets[run_id] = sandbox.secrets
            if plan.tools is not None:
                self._run_tools[run_id] = plan.tools
            nonce = new_nonce()
            self.journals_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            await self.store.create(NewRun(
                run_id=run_id,
                thread_id=thread_id,
                harness=request.harness,  # the registry's name: any process rebuilds it
                spec=plan.spec.to_json(),
                journal={"dir": str(self.journals_dir), "nonce": nonce, "host": machine_id(),
                         **plan.placement.RECORD},  # where the agent lives, for every host
                # Recorded before the sandbox exists: ensure writes its instance record as
                # soon as the sandbox does, so if this process dies mid-bootstrap (the
                # workspace copy) whoever ends the run (the reaper) still finds and
                # reclaims it.
                sandbox_key=sandbox.key(SandboxContext(thread_id=thread_id, run_id=run_id)),
            ))
            paths = JournalPaths.for_run(self.journals_dir, run_id)
            async with hold_claim(self.store, run_id, self.owner, self.lease_ttl) as held:
                try:
                    await launch_run(plan, self.store, run_id, thread_id, paths, nonce,
                                     held.epoch)
                except BaseException as exc:
                    self._forget(run_id)
                    with anyio.CancelScope(shield=True):
                        if plan.ensured is not None:
                            if plan.site is not None:  # maybe launched, then it failed
                                with anyio.move_on_after(30), contextlib.suppress(Exception):
                                    await plan.site.stop(0.5)
                            await self._finish_sandbox(await self._require(run_id),
                                                       "aborted")
                        await fail_start(plan, self.store, run_id, held.epoch, exc)
                    if isinstance(exc, Exception):
                        message = sandbox.secrets.redactor().redact(str(exc))
                        raise RunStartError(f"run {run_id} could not start: {message}"
                                            ) from None
                    raise
        return await self._require(run_id)

    async def _finish_agent(self, record: RunRecord) -> None:
        # start-up cost: the price table and the tokens' derivation are for a run's end
        from corral.runs._agent_end import finish_agent

        await finish_agent(self.store, record, self._site(record),
                           provider_for=self._providers_of(record),
                           redactor=self.redactor_for(record))

    async def _finish_agent_quietly(self, record: RunRecord) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(60):
            try:
                await self._finish_agent(record)
            except Exception as exc:  # noqa: BLE001 - the reaper goes on
                log.error("finishing the agent of run %s failed: %s", record.run_id, exc)
        if record.terminal:
            await self._checkpoint_turn(record, record.status.value)

    async def _checkpoint_turn(self, record: RunRecord, outcome: str) -> None:
        """The thread's checkpoint after this turn (#27), before the sandbox may go."""
        # start-up cost: the checkpoint machinery is for a run's end, not a driver's start
        from corral.runs._thread_end import checkpoint_turn

        with anyio.CancelScope(shield=True):
            try:
                await checkpoint_turn(self.store, record, outcome,
                                      provider_for=self._providers_of(record),
                                      redactor=self.redactor_for(record))
            except Exception as exc:  # noqa: BLE001 - the run is over; the sandbox's turn
                log.error("checkpointing the thread of run %s failed: %s", record.run_id, exc)

    # ------------------------------------------------------------------ drive

    async def drive(
        self,
        run_id: str,
        *,
        stop: anyio.Event | None = None,
        clear_detached: bool = True,
        tools: Toolset | None = None,
    ) -> DriveResult:
        """Make the run progress until it ends, or until ``stop`` is set (then detach).

        Takes the claim when nobody live holds it; while another live driver holds it,
        waits and takes over as soon as that driver is gone (at once for a dead process on
        this machine, at lease expiry otherwise).

        ``clear_detached``: the claim clears ``detached_since`` (the caller is a viewer).
        A server that drives runs whether or not anyone watches passes ``False`` and keeps
        ``detached_since`` itself, as the mark of viewer absence.

        ``tools``: the run's host tools (default: those it was started with by this runner,
        else the runner's). While this call holds the claim it serves them to the agent
        on the run's tool socket; calls of ``approval=True`` tools log a CUSTOM
        ``corral.approval_request`` event and wait for ``corral approve``. A run started
        with host tools and driven without them sees its tool calls fail.

        **Cancelling this call detaches the run, it does not end it.** When the task running
        ``drive`` is cancelled (an exception in the application's events loop cancels its
        task group; a web handler's client disconnects; the process shuts down), the driver
        stops between batches, records no status, leaves the log open, releases its claim
        and stamps ``detached_since``, then re-raises the cancellation: the agent goes on,
        and ``drive`` (any process) or ``corral attach`` continues the run, or the reaper
        finishes it. Ending the run is an explicit :meth:`cancel`.
        """
        toolset = tools if tools is not None else self._run_tools.get(run_id, self.tools)
        try:
            return await self._drive(run_id, stop, clear_detached, toolset)
        except anyio.get_cancelled_exc_class():
            # Whoever drove went away, not the run: leave it detached (attachable, reapable),
            # as a viewer leaving does. Shielded and bounded: the cancellation must go on.
            with anyio.CancelScope(shield=True), anyio.move_on_after(30):
                try:
                    await self._detach_if_undriven(run_id)
                except Exception as exc:  # noqa: BLE001 - the lapsed lease marks it too
                    log.warning("run %s: stamping the detach of a cancelled driver failed: %s",
                                run_id, exc)
            raise

    async def _detach_if_undriven(self, run_id: str) -> None:
        record = await self.store.get(run_id)
        # Another live driver holds it: nothing to stamp (as a viewer's stop in drive).
        if record is not None and not record.terminal and (
                driver_gone(record) or record.claim_owner == self.owner):
            await self.detach(run_id)

    async def _drive(self, run_id: str, stop: anyio.Event | None, clear_detached: bool,
                     toolset: Toolset | None) -> DriveResult:
        while True:
            record = await self._require(run_id)
            if record.terminal:
                self._forget(run_id)
                if not (await self.store.tail(run_id)).closed:
                    # Its driver died between storing the end and closing the log; with
                    # the end stored nothing can be appended, so close it for followers.
                    await self.store.close(run_id)
                return DriveResult(record)
            held_elsewhere = not driver_gone(record)
            if stop is not None and stop.is_set():
                if held_elsewhere:
                    # Only a viewer here (another driver holds the run): nothing to stamp.
                    return DriveResult(record, detached=True)
                # Nobody drives it: leaving must mark it detached for attach or the reaper.
                return DriveResult(await self.detach(run_id), detached=True)
            if record.cancel_requested:
                if held_elsewhere:
                    await _wait(stop, POLL)  # the canceller is ending the run
                    continue
                return DriveResult(await self.cancel(run_id))  # a canceller died midway
            if held_elsewhere:
                await _wait(stop, POLL)
                continue
            try:
                result = await self._drive_claimed(record, stop, clear_detached, toolset)
            except ClaimRefused as refused:
                if refused.reason in (RefusalReason.UNKNOWN, RefusalReason.TERMINAL):
                    continue  # the loop re-reads and returns
                await _wait(stop, POLL)
                continue
            except ClaimLost:
                continue
            if result is None:
                continue
            if result.stopped:
                return DriveResult(await self.detach(run_id), detached=True)
            if result.claim_lost:
                continue
            if result.record_error is not None:
                # The store would not take the terminal status: the log is still open,
                # the next claim (ours or another driver's) records the logged end.
                await _wait(stop, POLL)
                continue
            final = result.record or await self._require(run_id)
            self._forget(run_id)
            with span("corral.run.end", {"corral.run.id": run_id,
                                         "corral.run.status": final.status.value},
                      parent=_trace_of(final)):
                await self._finish_sandbox(final, final.status.value)
            return DriveResult(final)

    async def _drive_claimed(self, record: RunRecord, stop: anyio.Event | None,
                             clear_detached: bool, tools: Toolset | None
                             ) -> PipeResult | None:
        site = self._site(record)
        if site is None:
            return None
        # Claim nothing for a run whose journal is on another machine: without it this host
        # would take "no journal here" for "never started" and end a live run.
        site.check_here()
        # A harness not installed here cannot translate the journal: say so before claiming
        # (a takeover counted, a run failed), and leave the run as it is.
        check_harness(record)
        drive = ClaimedDrive(self.store, self.owner, self.lease_ttl, self._providers_of(record),
                             self._stop_agent, self.max_file_watches, self.approval_timeout,
                             self.checkpoint, self.max_takeovers)
        with span(f"invoke_agent {record.harness}", {
                "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": record.harness,
                "corral.run.id": record.run_id, "corral.thread.id": record.thread_id,
                "corral.driver": self.owner}, parent=_trace_of(record)) as current:
            # the secrets once: finding them may rebuild the sandbox definition
            result = await drive(record, site, self._secrets_for(record), stop=stop,
                                 clear_detached=clear_detached, tools=tools)
            if result is not None and result.record is not None:
                if current is not None:
                    current.set_attribute("corral.run.status", result.record.status.value)
                if result.record.error is not None:
                    mark_error(current, result.record.error.message)
            return result

    async def unlogged_file_events(self, record: RunRecord) -> list[dict[str, Any]]:
        """The file events of a run with ``file_events`` that its log lacks (changes made
        while nobody watched), for a driver that finishes the run without a watch (the
        reaper); ``[]`` when there are none or they cannot be had. Never raises."""
        return await unlogged_file_events(
            self.store, record, self._journal_paths(record), self._secrets_for(record),
            provider_for=self._providers_of(record), max_watches=self.max_file_watches)

    async def _finish_sandbox(self, record: RunRecord, outcome: str) -> None:
        """Apply the run's lifecycle to its sandbox: destroy it (``destroy_on_complete`` or
        an aborted run), or snapshot/keep it for the next run of the thread. Before that,
        the agent's session is saved and the thread checkpointed (each bounded on its
        own: a slow checkpoint never keeps the lifecycle from applying)."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(120):
            try:
                await self._finish_agent(record)  # before the sandbox may go
            except Exception as exc:  # noqa: BLE001 - the sandbox's lifecycle still applies
                log.error("finishing the agent of run %s failed: %s", record.run_id, exc)
        await self._checkpoint_turn(record, outcome)
        with anyio.CancelScope(shield=True), anyio.move_on_after(120):
            try:
                await release_sandbox(self.store, record, outcome,
                                      provider_for=self._providers_of(record))
            except Exception as exc:  # noqa: BLE001
                log.error("finishing the sandbox of run %s failed: %s", record.run_id, exc)

    # ------------------------------------------------------------------ reap

    async def reap(
        self,
        *,
        ttl: float,
        max_runs: int = 25,
        budget: float = 30.0,
        now: float | None = None,
    ) -> tuple[ReapResult, PruneResult | None]:
        """One reaper sweep over unattended runs (detached, or their driver's lease lapsed:
        finalize, expire, reclaim), then one prune
        of this runner's journal directory. Never raises for a run's failure."""
        journals = self.journals_dir
        # start-up cost: the reaper (the output check, reclaim) is for a sweep, not a driver
        from corral.runs._reap_runner import reap_runner_runs

        result = await reap_runner_runs(
            self.store,
            provider_for=self.provider,
            ttl=ttl,
            max_runs=max_runs,
            budget=budget,
            now=now,
            owner=self.owner,
            journals_dir=str(journals) if journals.is_dir() else None,
            redactor_for=self.redactor_for,
            before_reclaim=self._finish_agent_quietly,
            files_for=self.unlogged_file_events,
            max_takeovers=self.max_takeovers,
        )
        # keep_alive is enforced as part of every sweep (idle sandboxes past it go).
        # Imported here for start-up cost: the sandbox machinery (ensure, bootstrap) is for
        # a reaper's sweep, not for a driver taking a run over (``corral attach``).
        from corral.sandbox._gc import collect_idle

        try:
            report = await collect_idle(self.store, now=now, providers=self._providers.built())
            if report.entries:
                log.info("reap: idle sandboxes: %s", dict(report.counts))
        except Exception as exc:  # noqa: BLE001 - the sweep never raises
            log.error("reap: collecting idle sandboxes failed: %s", exc)
        return result

    # ------------------------------------------------------------------ watch / detach

    def events(self, run_id: str, after: int = 0) -> AsyncIterator[LoggedEvent]:
        """The run's logged events after offset ``after``, following until the log closes."""
        return self.store.read(run_id, after)

    async def detach(self, run_id: str) -> RunRecord:
        """The viewer left: stamp ``detached_since`` (unless the run ended or a cancel is
        recorded). The agent keeps running; ``drive`` or a reaper picks the run up later."""
        record = await self._require(run_id)
        if record.terminal or record.cancel_requested:
            return record
        await self.store.update(run_id, RunPatch(detached_since=time.time()))
        return await self._require(run_id)

    # ------------------------------------------------------------------ cancel

    async def cancel(self, run_id: str) -> RunRecord:
        """Cancel a run from any process: recorded first, then the agent is stopped, what
        its journal holds beyond the log is logged (up to the agent's stop: a run nobody
        drove keeps its output), the sandbox destroyed, and the log ended with
        ``RUN_ERROR`` (status ``aborted``). The one way to end a run early: cancelling the
        task that runs :meth:`drive` only detaches it."""
        return await cancel_run(self.store, run_id, self.owner, self.lease_ttl,
                                stop_agent=self._kill_agent,
                                finish_sandbox=self._finish_sandbox_aborted,
                                journal_rest=self._journal_rest)

    async def _stop_agent(self, record: RunRecord) -> None:
        await self._kill_agent(record)
        await self._finish_sandbox(record, "aborted")

    async def _finish_sandbox_aborted(self, record: RunRecord) -> None:
        await self._finish_sandbox(record, "aborted")

    async def _kill_agent(self, record: RunRecord) -> None:
        """Stop the agent (its supervisor records the exit); the sandbox stays."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(30):
            site = self._site(record)
            if site is not None:
                try:
                    await site.stop(0.5)  # a mirror gets the journal's end too
                except Exception as exc:  # noqa: BLE001
                    log.warning("stopping the agent of run %s: %s", record.run_id, exc)

    async def _journal_rest(self, record: RunRecord) -> AsyncIterator[Produced]:
        """The journal's batches beyond the log, up to the agent's exit (for a cancel,
        under its claim): the same produce path every driver and the reaper use, not
        following (the agent was stopped)."""
        site = self._site(record)
        if site is None:
            return

        try:
            rest = continue_run(self.store, record, lambda: harness_for_record(record),
                                site.paths, site.nonce, redactor=self.redactor_for(record), follow=False)
            async for item in rest:
                if isinstance(item, LogBatch) and item.exit_code is not None:
                    # The exit's batch closes what the stop cut short (a result for every
                    # open tool call, the message's end); the run's end is the cancel's
                    # RUN_ERROR, not the terminal event the exit translates to.
                    yield LogBatch([e for e in item.events
                                    if e.get("type") not in ("RUN_FINISHED", "RUN_ERROR")],
                                   item.journal_offset)
                    return
                yield item
        except AgentNeverStarted:
            return  # no journal: nothing to log


def _trace_of(record: RunRecord) -> Any:
    """The trace context the run's start stored (its drivers' spans join that trace)."""
    trace = (record.spec or {}).get("trace")
    return context_of(trace if isinstance(trace, dict) else None)


async def _wait(stop: anyio.Event | None, seconds: float) -> None:
    if stop is None:
        await anyio.sleep(seconds)
        return
    with anyio.move_on_after(seconds):
        await stop.wait()
