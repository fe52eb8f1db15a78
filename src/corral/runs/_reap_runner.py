"""The reaper's collaborators for runs started by :class:`corral.runs._runner.Runner`, and
one sweep wired with them (what ``corral reap`` and ``corral serve`` call).

- ``probe``: :func:`probe_runner_run`, :func:`corral.runs._run_probe.probe_run_exit` (the
  journal's tail) plus the case of a starter that provably died before launching the agent;
- ``drive``: :func:`journal_drive` continues the harness translation after the journal
  offset stored with the last logged event, one atomic batch per journal item (or records
  the end an earlier driver already logged, :func:`logged_end`; or fails a run whose agent
  was never launched);
- ``stop``: :func:`journal_stop` stops an expired run's agent through its supervisor;
- ``reclaim``: :func:`record_reclaimer` destroys the run's sandbox, found through its
  instance record (``sandbox_key``) or the ``sandbox_ref`` the Runner stores;
- after the sweep, :func:`prune_journals` deletes this host's journal files of runs that
  ended (the journal's prune, :mod:`corral.journal._prune`, told by run records).
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final, Protocol

import anyio
import anyio.to_thread

from corral._log import library_logger
from corral.harness._registry import HarnessNotInstalled
from corral.journal._prune import (
    DEFAULT_MAX_DELETES,
    DEFAULT_ORPHAN_TTL,
    PruneResult,
    prune_journal_dir,
)
from corral.runs._output_end import output_state, settle_output
from corral.runs._owner import owner_is_dead
from corral.runs._pipe import LogBatch, Produced
from corral.runs._produce import (
    NOT_STARTED,
    AgentNeverStarted,
    Checkpoint,
    continue_run,
    logged_end,
)
from corral.runs._run_probe import JournalLocationError, journal_site, probe_run_exit
from corral.runs._quiesce import DEFAULT_QUIET
from corral.runs._takeovers import DEFAULT_MAX_TAKEOVERS
from corral.runs._reap_sweep import (
    DEFAULT_BUDGET,
    DEFAULT_MAX_RUNS,
    Drive,
    ProbeResult,
    ReapResult,
    ReapStore,
    reap_detached_runs,
)
from corral.runs._spec import check_harness, harness_for_record, run_spec_of
from corral.runs._reclaim import (
    DEFAULT_DESTROY_TIMEOUT,
    ReclaimOutcome,
    ReclaimProvider,
    SandboxReclaimFailedError,
    sandbox_reclaimer,
)
from corral.stores._records import RunRecord
from corral.stores._protocols import InstanceStore, Store
from corral.sandbox._contracts import SandboxRef
from corral.sandbox._redact import Redactor
from corral.sandbox._provider_registry import recorded_config
from corral.sandbox import _traced as traced

__all__ = [
    "NOT_STARTED",
    "AgentNeverStarted",
    "journal_drive",
    "logged_end",
    "probe_runner_run",
    "journal_stop",
    "prune_journals",
    "reap_runner_runs",
    "record_reclaimer",
]

log = library_logger("corral.runs._reap_runner")

STOP_GRACE: Final = 2.0
"""Seconds between SIGTERM and SIGKILL when stopping an expired run's agent."""


async def probe_runner_run(record: RunRecord) -> ProbeResult:
    """:func:`probe_run_exit`, except for a run whose starter provably died on this machine
    (its lease's owner is a dead process here) without detaching and before launching the
    agent (neither journal nor supervisor status exists): ``not-started``, so the sweep ends
    it now instead of calling it ``producing`` until the TTL runs out.

    Only a dead starter proves it: a live one (or one on another machine, whose journal is
    not here to look at) may still launch the agent.

    Any other run whose harness is not installed here is ``elsewhere``: this process cannot
    translate its journal, so it must not act on it (expiry included); the error says
    which package the run's harness needs."""
    if record.detached_since is None and owner_is_dead(record.claim_owner):
        try:
            site = journal_site(record)
            await site.refresh()
        except JournalLocationError:
            pass
        else:
            paths = site.paths

            def launched() -> bool:
                return paths.journal.exists() or paths.status.exists()

            if not await anyio.to_thread.run_sync(launched):
                return ProbeResult.not_started(NOT_STARTED)
    try:
        check_harness(record)
    except HarnessNotInstalled as exc:
        return ProbeResult.elsewhere(f"run {record.run_id}: {exc}")
    return await probe_run_exit(record)


def journal_drive(
    store: ReapStore,
    redactor_for: Callable[[RunRecord], Redactor | None] | None = None,
    files_for: Callable[[RunRecord], Awaitable[list[dict[str, Any]]]] | None = None,
    *,
    checkpoint: Checkpoint | None = None,
) -> Drive:
    """A ``drive`` that continues a run from where its log stopped.

    First, a log that already holds the run's end (or is closed) is finished with that end
    (:func:`logged_end`), appending nothing; a run with no journal (its agent was never
    launched; we hold the claim, so its starter is fenced off) fails with
    :class:`AgentNeverStarted`. Otherwise:
    It reads the journal offset stored with the last logged event (``None``: nothing was
    logged, start with the harness's start batch), resumes the translation there, and yields
    one :class:`~corral.runs._pipe.LogBatch` per journal item; the exit's batch carries the
    exit code. The harness is rebuilt from the record (``harness`` and ``spec``), as the
    Runner does; ``redactor_for`` gives the redactor of the
    run's secrets, applied to every event before it is logged. ``files_for`` gives the
    run's file events nobody logged yet (:mod:`corral.runs._file_feed`); they go in just
    before the exit's batch, at the journal offset already logged.

    The events come from the one produce path (:func:`corral.runs._produce.continue_run`),
    which the Runner's drivers use too; ``checkpoint`` is its step hook (tests).
    """

    async def events(record: RunRecord, epoch: int) -> AsyncIterator[Produced]:
        site = journal_site(record)
        paths, nonce = site.paths, site.nonce

        async def before_exit(logged_offset: int, code: int | None) -> list[LogBatch]:
            if code != 0:
                gone = await site.gone()
                if gone is not None:
                    raise gone  # destroyed underneath: the story, not the exit code
            files = await files_for(record) if files_for is not None else []
            return [LogBatch(files, logged_offset)] if files else []

        async def on_journal_error() -> bool:
            gone = await site.gone()
            if gone is not None:
                raise gone
            return False

        if await logged_end(store, record) is None:
            # A journal that lived in the sandbox: with the sandbox gone, what this host's
            # copy lacks is lost, and following it would wait for it forever.
            await site.refresh()
            lost = await site.lost()
            if lost is not None:
                raise lost
        redactor = redactor_for(record) if redactor_for is not None else None
        batches = continue_run(
            store, record, lambda: harness_for_record(record), paths, nonce,
            redactor=redactor,
            follow=True, before_exit=before_exit, on_journal_error=on_journal_error,
            checkpoint=checkpoint)
        schema = run_spec_of(record).output_schema
        if schema is not None:
            # the result the agent gave (stored on the record), or the run fails
            redact = redactor.redact_obj if redactor is not None else None
            state = await output_state(store, record, schema, redact, epoch=epoch)
            batches = settle_output(batches, store, record, state, redact)
        try:
            async for item in batches:
                yield item
        finally:
            await batches.aclose()  # type: ignore[attr-defined]

    def drive(record: RunRecord, epoch: int, abort: anyio.Event) -> AsyncIterator[Produced]:
        return events(record, epoch)

    return drive


async def journal_stop(record: RunRecord) -> None:
    """Stop the run's agent (SIGTERM, then SIGKILL) and its supervisor."""
    await journal_site(record).stop(STOP_GRACE, supervisor=True)


ProviderFor = Callable[[str, Mapping[str, Any] | None, str | None], ReclaimProvider]
"""``provider_for(name, config, package)``: the provider a record names, built with the
configuration it recorded (``None``: the caller's own for that name); ``package`` is the one
to name if ``name`` is not installed."""


def record_reclaimer(
    provider_for: ProviderFor,
    instances: InstanceStore,
    *,
    destroy_timeout: float = DEFAULT_DESTROY_TIMEOUT,
    logger: logging.Logger | None = None,
) -> Callable[[RunRecord], Awaitable[ReclaimOutcome]]:
    """A ``reclaim`` callable for runs bound to a sandbox either way corral records it.

    With ``sandbox_key``: the instance record names the provider and its configuration
    (rebuilt through ``provider_for``); :func:`reclaim_sandbox`
    does the rest (destroy, delete the record regardless). Otherwise with ``sandbox_ref``
    (``{"provider", "id"}``, a sandbox owned by the run): that provider destroys it. No
    reference at all → ``no-sandbox-key``. A failed destroy raises
    :class:`SandboxReclaimFailedError` (the sweep reports ``reclaim-failed``).
    """
    logger = logger or log

    async def reclaim(record: RunRecord) -> ReclaimOutcome:
        if record.sandbox_key is not None:
            instance = await instances.get_instance(record.sandbox_key)
            if instance is None:
                return ReclaimOutcome.NOT_FOUND
            config, package = recorded_config(instance.meta)
            reclaimer = sandbox_reclaimer(
                provider_for(instance.provider, config or None, package), instances,
                destroy_timeout=destroy_timeout, logger=logger,
            )
            return await reclaimer(record)  # raises SandboxReclaimFailedError with the cause
        ref: Any = record.sandbox_ref or {}
        name, sandbox_id = ref.get("provider"), ref.get("id")
        if not isinstance(name, str) or not isinstance(sandbox_id, str):
            return ReclaimOutcome.NO_SANDBOX_KEY
        try:
            with anyio.fail_after(destroy_timeout):
                await traced.destroy(provider_for(name, None, None), SandboxRef(name, sandbox_id),
                                     reason="reaper")
        except TimeoutError:
            cause = f"destroy did not finish within {destroy_timeout:g}s"
        except Exception as exc:  # noqa: BLE001 - reported as reclaim-failed
            cause = str(exc) or type(exc).__name__
        else:
            return ReclaimOutcome.DESTROYED
        logger.error("reclaim: run %s: destroying %s sandbox %s failed: %s",
                     record.run_id, name, sandbox_id, cause)
        raise SandboxReclaimFailedError(record.run_id, None, f"{name} sandbox {sandbox_id}: {cause}")

    return reclaim


async def reap_runner_runs(
    store: Store,
    *,
    provider_for: ProviderFor,
    ttl: float,
    max_runs: int = DEFAULT_MAX_RUNS,
    budget: float = DEFAULT_BUDGET,
    quiet: float = DEFAULT_QUIET,
    now: float | None = None,
    owner: str | None = None,
    journals_dir: str | None = None,
    logger: logging.Logger | None = None,
    redactor_for: Callable[[RunRecord], Redactor | None] | None = None,
    before_reclaim: Callable[[RunRecord], Awaitable[None]] | None = None,
    files_for: Callable[[RunRecord], Awaitable[list[dict[str, Any]]]] | None = None,
    max_takeovers: int | None = DEFAULT_MAX_TAKEOVERS,
) -> tuple[ReapResult, PruneResult | None]:
    """One sweep over Runner-started runs with the collaborators above, then (when
    ``journals_dir`` is given) one journal prune of that directory. ``before_reclaim`` runs
    before a run's sandbox is reclaimed (e.g. to save an agent CLI's session from it); it
    must not raise. ``max_takeovers``: the takeover limit (:func:`reap_detached_runs`)."""
    reclaim = record_reclaimer(provider_for, store, logger=logger)
    if before_reclaim is not None:
        plain, first = reclaim, before_reclaim

        async def reclaim(record: RunRecord) -> ReclaimOutcome:
            await first(await store.get(record.run_id) or record)
            return await plain(record)

    result = await reap_detached_runs(
        store,
        probe=probe_runner_run,
        drive=journal_drive(store, redactor_for=redactor_for, files_for=files_for),
        reclaim=reclaim,
        stop=journal_stop,
        ttl=ttl,
        now=now,
        budget=budget,
        max_runs=max_runs,
        quiet=quiet,
        owner=owner,
        logger=logger,
        max_takeovers=max_takeovers,
    )
    pruned = None
    if journals_dir is not None:
        pruned = await prune_journals(store, journals_dir, now=now, logger=logger)
    return result, pruned


class RecordReader(Protocol):
    async def get(self, run_id: str) -> RunRecord | None: ...


async def prune_journals(
    store: RecordReader,
    directory: str | os.PathLike[str],
    *,
    now: float | None = None,
    orphan_ttl: float = DEFAULT_ORPHAN_TTL,
    max_deletes: int = DEFAULT_MAX_DELETES,
    logger: logging.Logger | None = None,
) -> PruneResult:
    """Delete the journal files in ``directory`` of runs whose record is terminal, or of
    long-orphaned runs (no record); see :mod:`corral.journal._prune`. Never raises."""

    async def run_ended(run_id: str) -> bool | None:
        record = await store.get(run_id)
        return None if record is None else record.terminal

    return await prune_journal_dir(run_ended, directory, now=now, orphan_ttl=orphan_ttl,
                                   max_deletes=max_deletes, logger=logger)
