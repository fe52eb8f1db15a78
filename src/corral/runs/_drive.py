"""One claimed section of a Runner's driver: take the run's claim, then pipe what the
produce path (:mod:`corral.runs._produce`) makes of the journal into the fenced log, while
watching for a cancel, keeping the services daemon alive, serving host tools and feeding
file events."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import anyio

from corral._log import library_logger
from corral.harness._base import NeedsAgentRuntime
from corral.runs._claims import hold_claim
from corral.runs._file_feed_wiring import file_feed
from corral.runs._host_tools import serve_tools
from corral.runs._logged import LoggedOffset, complete_end
from corral.runs._owner import owner_is_dead
from corral.runs._pipe import LogBatch, PipeResult, Produced, ProducerExit, pipe_to_run_log
from corral.runs._produce import Checkpoint, logged_end, produce_batches
from corral.runs._request import RunStartError
from corral.runs._session_lost import run_context
from corral.runs._site import AgentSite
from corral.runs._spec import harness_for_record, run_spec_of
from corral.runs._takeovers import DEFAULT_MAX_TAKEOVERS, TakeoverLimit, count_takeover
from corral.sandbox._contracts import Provider
from corral.sandbox._secrets import Secrets
from corral.stores._protocols import ClaimLost, ClaimRefused, RefusalReason, Store, UnknownRun
from corral.stores._records import RunRecord

if TYPE_CHECKING:
    from corral.tools._core import Toolset
    from corral.tools._output import OutputState

__all__ = ["CANCEL_LOG_BUDGET", "DEFAULT_MAX_TAKEOVERS", "POLL", "ClaimedDrive", "JournalRest",
           "TakeoverLimit", "cancel_run"]

log = library_logger("corral.runs._runner")

POLL: Final = 0.2
"""How often a waiting driver re-reads the record (takeover of a dead local driver and
noticing a cancel both happen within about this)."""


@dataclass(frozen=True, slots=True)
class ClaimedDrive:
    """What a driver needs for one claimed section (a Runner's settings)."""

    store: Store
    owner: str
    lease_ttl: float
    provider_for: Callable[[str], Provider]
    stop_agent: Callable[[RunRecord], Awaitable[None]]
    max_watches: int
    approval_timeout: float
    checkpoint: Checkpoint | None = None
    max_takeovers: int | None = DEFAULT_MAX_TAKEOVERS

    async def __call__(self, record: RunRecord, site: AgentSite,
                       secrets: Secrets | None, *, stop: anyio.Event | None,
                       clear_detached: bool, tools: Toolset | None) -> PipeResult:
        """Claim the run (breaking the lease of a driver that provably died here) and
        drive it until it ends, ``stop`` is set, or the claim is lost."""
        breaking = record.claim_owner if owner_is_dead(record.claim_owner) else None
        async with hold_claim(self.store, record.run_id, self.owner, self.lease_ttl,
                              clear_detached=clear_detached,
                              break_lease_of=breaking) as held:
            # a takeover: the driver before never let go (it died, or its lease lapsed)
            takeover = record.claim_owner is not None
            return await self._claimed(record, site, secrets, held.epoch, stop, tools,
                                       takeover)

    async def _claimed(self, record: RunRecord, site: AgentSite, secrets: Secrets | None,
                       epoch: int, stop: anyio.Event | None, tools: Toolset | None,
                       takeover: bool = False) -> PipeResult:
        run_id, store = record.run_id, self.store
        paths, nonce = site.paths, site.nonce
        await site.refresh()  # before anything reads a mirror of the journal
        # Appends from any predecessor are fenced from here on, so the tail is final.
        end = await logged_end(store, record)
        if end is not None:
            # A predecessor logged the run's end (or closed the log) but never stored the
            # status: record that end; resuming after the exit would find none.
            return await pipe_to_run_log(store, run_id, _once(end), epoch=epoch,
                                         detach_on_cancel=True)
        tail = await store.tail(run_id)
        count = await count_takeover(store, record, tail.last_offset, epoch, takeover)
        if self.max_takeovers is not None and count > self.max_takeovers:
            await self.stop_agent(record)
            return await pipe_to_run_log(
                store, run_id, _raising(TakeoverLimit(count, self.max_takeovers)),
                epoch=epoch, detach_on_cancel=True)
        lost = await site.lost()  # the journal's unread part went with the sandbox
        if lost is not None:
            return await pipe_to_run_log(store, run_id, _raising(lost), epoch=epoch)
        if not paths.journal.exists():
            # We hold the claim, so the starter is gone: it died before launching the
            # agent. Nothing will ever write this journal.
            await self.stop_agent(record)
            return await pipe_to_run_log(store, run_id, _never_launched(), epoch=epoch,
                                         detach_on_cancel=True)
        harness = harness_for_record(record)
        abort = anyio.Event()
        feed = await file_feed(store, record, paths, epoch, secrets,
                               provider_for=self.provider_for, max_watches=self.max_watches)

        async def before_exit(logged_offset: int, code: int | None) -> list[LogBatch] | None:
            # A cancel kills the agent; its exit must not land as a failure.
            if await self._cancelled(run_id):
                abort.set()
                return None
            if code != 0:
                # Killed because its sandbox was destroyed underneath (its cgroup frozen
                # and killed): say that, not "exited with 137".
                gone = await site.gone()
                if gone is not None:
                    raise gone
            if feed is not None:
                await feed.flush()  # the agent's last changes go in before its end
            return []

        async def on_journal_error() -> bool:
            if await self._cancelled(run_id):
                abort.set()
                return True
            gone = await site.gone()
            if gone is not None:
                raise gone  # the story, not the journal's symptom of it
            return False

        logged = LoggedOffset(tail.last_journal_offset or 0)
        redactor = secrets.redactor() if secrets is not None else None
        schema = run_spec_of(record).output_schema
        output: OutputState | None = None
        if schema is not None:
            # only a run with a schema loads the validator (pydantic, jsonschema)
            from corral.runs._output_end import output_state, settle_output

            output = await output_state(store, record, schema,
                                        redactor.redact_obj if redactor is not None else None,
                                        epoch=epoch)

        async def after_journal() -> bool:
            return await logged.wait(complete_end(paths.journal))

        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch_cancel, run_id, abort)
            tg.start_soon(site.follow)  # a mirror of the journal kept up to date
            if isinstance(harness, NeedsAgentRuntime):
                # Imported here for start-up cost: the services daemon's keeper loads the
                # model proxy and httpx, which only agent-CLI runs need.
                from corral.runs._keep_services import keep_services

                tg.start_soon(keep_services, store, record, site, epoch)
            await serve_tools(tg, store, record, tools, epoch,
                              approval_timeout=self.approval_timeout,
                              redactor=redactor, after_journal=after_journal,
                              output=output if not getattr(harness, "native_output", False)
                              else None)
            if feed is not None:
                try:
                    await feed.start(e.event for e in await store.snapshot(run_id))
                except Exception as exc:  # noqa: BLE001 - e.g. inotify limits: the run goes on
                    log.warning("run %s: no file events from this driver: %s", run_id, exc)
                    feed.close()
                    feed = None
                else:
                    tg.start_soon(feed.run)
            produced = produce_batches(
                harness, run_context(record), paths, nonce,
                after=tail.last_journal_offset, follow=True,
                redactor=secrets.redactor() if secrets is not None else None,
                before_exit=before_exit, on_journal_error=on_journal_error,
                checkpoint=self.checkpoint, logged=logged)
            if output is not None:
                produced = settle_output(produced, store, record, output,
                                         redactor.redact_obj if redactor else None)
            result = await pipe_to_run_log(
                store, run_id, produced, epoch=epoch, abort=abort, stop=stop,
                journal_offset=tail.last_journal_offset or 0,
                # the caller went away (its task was cancelled), not the run: no status,
                # no close; Runner.drive stamps the detach
                detach_on_cancel=True)
            tg.cancel_scope.cancel()
        if feed is not None:
            feed.close()
        return result

    async def _cancelled(self, run_id: str) -> bool:
        current = await self.store.get(run_id)
        return current is not None and current.cancel_requested is True

    async def _watch_cancel(self, run_id: str, abort: anyio.Event) -> None:
        while not abort.is_set():
            record = await self.store.get(run_id)
            if record is None or record.cancel_requested:
                abort.set()
                return
            await anyio.sleep(POLL)


async def cancel_run(store: Store, run_id: str, owner: str, lease_ttl: float, *,
                     stop_agent: Callable[[RunRecord], Awaitable[None]],
                     finish_sandbox: Callable[[RunRecord], Awaitable[None]] | None = None,
                     journal_rest: JournalRest | None = None) -> RunRecord:
    """Cancel a run: recorded first (sticky), then the canceller takes the claim (fencing
    any live driver), stops the agent, logs what its journal holds beyond the log (up to
    the agent's stop: ``journal_rest``), destroys the sandbox (``finish_sandbox``) and ends
    the log with ``RUN_ERROR`` (status ``aborted``).

    Without ``finish_sandbox``, ``stop_agent`` is expected to destroy the sandbox too (and
    nothing of the journal can be read after it)."""
    record = await store.request_cancel(run_id)
    if record is None:
        raise UnknownRun(run_id)
    for _ in range(100):
        if record.terminal:
            return record
        try:
            async with hold_claim(store, run_id, owner, lease_ttl, allow_cancelled=True,
                                  break_lease_of=record.claim_owner) as held:
                await stop_agent(record)
                ended = anyio.Event()
                await pipe_to_run_log(
                    store, run_id,
                    _rest_then_end(record, journal_rest, finish_sandbox, ended),
                    epoch=held.epoch, abort=ended)
        except ClaimRefused as refused:
            if refused.reason is RefusalReason.UNKNOWN:
                raise UnknownRun(run_id) from None
            if refused.reason is not RefusalReason.TERMINAL:
                await anyio.sleep(0.05)  # the lease changed hands: read again
        except ClaimLost:
            pass
        current = await store.get(run_id)
        if current is None:
            raise UnknownRun(run_id)
        record = current
    return record


JournalRest = Callable[[RunRecord], AsyncIterator[Produced]]
"""``journal_rest(record)``: under the canceller's claim, after the agent's stop, the
batches of the run's journal beyond the journal offset its log holds, up to (not
including) the agent's exit."""

CANCEL_LOG_BUDGET: Final = 60.0
"""Seconds a cancel spends at most logging what the journal held (a journal of many
megabytes translates in a few seconds; the rest is reported, and the cancel goes on)."""


async def _rest_then_end(record: RunRecord, journal_rest: JournalRest | None,
                         finish_sandbox: Callable[[RunRecord], Awaitable[None]] | None,
                         ended: anyio.Event) -> AsyncIterator[Produced]:
    """What a cancel pipes into the log: the journal's unlogged batches, then (the sandbox
    destroyed) the abort, which the pipe turns into ``RUN_ERROR`` and ``aborted``."""
    if journal_rest is not None:
        deadline = time.monotonic() + CANCEL_LOG_BUDGET
        rest = journal_rest(record)
        try:
            async for item in rest:
                if isinstance(item, ProducerExit):
                    continue  # the run's end is the cancel, not what the journal says
                yield item
                if time.monotonic() > deadline:
                    log.warning("run %s: the cancel logged the journal for %gs; the rest of "
                                "it is left out of the log", record.run_id, CANCEL_LOG_BUDGET)
                    break
        except Exception as exc:  # noqa: BLE001 - the cancel must end the run regardless
            log.warning("run %s: logging its journal before the cancel's end failed: %s",
                        record.run_id, exc)
        finally:
            aclose = getattr(rest, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()
    if finish_sandbox is not None:
        await finish_sandbox(record)
    ended.set()


async def _nothing() -> AsyncIterator[Produced]:
    return
    yield  # pragma: no cover


async def _once(item: Produced) -> AsyncIterator[Produced]:
    yield item


async def _raising(exc: Exception) -> AsyncIterator[Produced]:
    raise exc
    yield  # pragma: no cover


async def _never_launched() -> AsyncIterator[Produced]:
    raise RunStartError("the run's starter stopped before it launched the agent")
    yield  # pragma: no cover
