"""The one produce path: journal → harness translation → redaction → the fenced event log.

Every driver of a run uses it: a foreground ``corral run`` and ``corral attach`` (the
Runner) and the reaper (bounded by its budget), each following the journal until the
agent's exit. It carries the no-loss, no-duplicate guarantee (DESIGN §4): the translation
resumes after the journal offset stored with the last logged event, and each journal item's
events
go to the pipe as one :class:`~corral.runs._pipe.LogBatch`, appended atomically with that
offset, so a successor neither repeats nor skips any event whatever step its predecessor
died at.

``checkpoint`` is called at each step with the step's name (:data:`STEPS`); tests inject
kill points there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Final, cast

import anyio.to_thread

from corral._errors import CorralError
from corral._telemetry import enabled as telemetry_enabled
from corral._telemetry import span_at
from corral.harness._base import Harness, RunContext, translate_run
from corral.harness._command import wire_twin
from corral.journal._layout import JournalPaths
from corral.journal._reader import JournalError
from corral.runs._logged import LoggedOffset
from corral.runs._pipe import (
    RUN_ERROR,
    RUN_FINISHED,
    LogBatch,
    Produced,
    ProducerExit,
    error_from_event,
)
from corral.runs._run_probe import probe_run_exit
from corral.runs._session_lost import run_context
from corral.sandbox._redact import Redactor
from corral.stores._protocols import EventLog
from corral.stores._records import RunError, RunRecord

__all__ = [
    "NOT_STARTED",
    "STEPS",
    "AgentNeverStarted",
    "Checkpoint",
    "continue_run",
    "logged_end",
    "produce_batches",
]

NOT_STARTED: Final = "the process that started this run died before the agent started"

STEPS: Final = ("read", "translated", "logged")
"""The produce path's steps, as passed to a :data:`Checkpoint`: a journal item was read,
its events were translated and redacted, its batch was appended (the pipe asked for the
next one)."""

Checkpoint = Callable[[str], Awaitable[None]]
"""Called with each step's name (:data:`STEPS`) as the produce path passes it."""

BeforeExit = Callable[[int, "int | None"], Awaitable[Sequence[LogBatch] | None]]
"""Called before the exit's batch with the journal offset logged so far and the agent's
exit code: the batches to append first, or ``None`` to stop without logging the exit (a
cancel took the run over). It may raise to end the run failed with that error instead."""


class AgentNeverStarted(CorralError):
    """A run's agent was never launched (no journal): its starter died first. Nothing will
    ever write the journal, so the run can only end ``failed``."""

    code = "not_started"


async def _step(checkpoint: Checkpoint | None, name: str) -> None:
    if checkpoint is not None:
        await checkpoint(name)


def _wire(events: Sequence[Any]) -> list[dict[str, Any]]:
    # Imported here for start-up cost: only a harness other than the command one needs it.
    from corral.harness._events import event_to_dict

    return [event_to_dict(e) for e in events]


async def produce_batches(
    harness: Harness,
    ctx: RunContext,
    paths: JournalPaths,
    nonce: str,
    *,
    after: int | None,
    redactor: Redactor | None,
    follow: bool,
    before_exit: BeforeExit | None = None,
    on_journal_error: Callable[[], Awaitable[bool]] | None = None,
    checkpoint: Checkpoint | None = None,
    logged: LoggedOffset | None = None,
) -> AsyncIterator[Produced]:
    """Translate the journal after offset ``after`` (``None``: from the start, the
    harness's start batch first) and yield one :class:`LogBatch` per journal item, its
    events redacted; the exit's batch carries the exit code and ends the iteration.

    ``follow``: wait for the journal to grow until the agent's exit (every driver does;
    ``False`` stops at the journal's current end). ``on_journal_error``: a
    :class:`JournalError` ends the iteration quietly when it returns true (e.g. the run
    was cancelled and its journal went away). ``logged`` is raised past each journal item
    once its events are logged (or it had none)."""
    # A command run's events are made as wire dicts at once (no AG-UI models to import:
    # start-up cost of a takeover, ``corral attach``); any other harness's are dumped here.
    twin = wire_twin(harness)
    batches = translate_run(twin or harness, ctx, paths, nonce=nonce, after=after,
                            follow=follow, eventless=logged is not None)
    logged_offset = after or 0
    tool_spans = _ToolSpans()
    try:
        async for batch in batches:
            if not batch.events and batch.item is not None and batch.exit is None:
                if logged is not None:  # an item with nothing to log
                    logged.reached(batch.journal_offset)
                continue
            await _step(checkpoint, "read")
            # a wire twin's events are their wire dicts already (typed as the models)
            events = (cast("list[dict[str, Any]]", list(batch.events)) if twin is not None
                      else _wire(batch.events))
            if redactor is not None:
                events = [redactor.redact_obj(e) for e in events]
            await _step(checkpoint, "translated")
            tool_spans.see(events)
            exit = batch.exit
            if exit is not None and before_exit is not None:
                first = await before_exit(logged_offset, exit.code)
                if first is None:
                    return
                for extra in first:
                    yield extra
            yield LogBatch(events, batch.journal_offset,
                           exit_code=exit.code if exit is not None else None)
            await _step(checkpoint, "logged")
            logged_offset = batch.journal_offset
            if logged is not None:
                logged.reached(logged_offset)
            if exit is not None:
                return
    except JournalError as exc:
        if on_journal_error is not None and await on_journal_error():
            return
        raise _without_paths(exc, paths) from None
    finally:
        tool_spans.close()
        await batches.aclose()  # type: ignore[attr-defined]


def _without_paths(exc: JournalError, paths: JournalPaths) -> JournalError:
    """``exc`` with this host's journal paths replaced by what they are: the message ends
    up in the run's ``RUN_ERROR`` event, which every viewer sees, and a host path there
    tells them about the host (and means nothing on another one)."""
    message = str(exc)
    for path, name in ((paths.journal, "the run's journal"),
                       (paths.stderr, "the run's stderr journal"),
                       (paths.directory, "the journals directory")):
        message = message.replace(str(path), name)
    if message == str(exc):
        return exc
    try:
        return type(exc)(message)
    except TypeError:
        return JournalError(message)


class _ToolSpans:
    """An ``execute_tool`` span per tool call, from its ``TOOL_CALL_START`` to its
    ``TOOL_CALL_RESULT`` as this driver logs them (OpenTelemetry GenAI conventions)."""

    def __init__(self) -> None:
        self.open: dict[str, span_at] = {}

    def see(self, events: Sequence[dict[str, Any]]) -> None:
        if not telemetry_enabled():
            return
        for event in events:
            kind, call = event.get("type"), str(event.get("toolCallId", ""))
            if kind == "TOOL_CALL_START" and call not in self.open:
                name = str(event.get("toolCallName", ""))
                self.open[call] = span_at(f"execute_tool {name}", {
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
                    "gen_ai.tool.call.id": call})
            elif kind == "TOOL_CALL_RESULT" and call in self.open:
                self.open.pop(call).end()

    def close(self) -> None:
        for pending in self.open.values():
            pending.end(error="no result while this driver drove the run")
        self.open.clear()


async def continue_run(
    store: EventLog,
    record: RunRecord,
    harness: Callable[[], Harness],
    paths: JournalPaths,
    nonce: str,
    *,
    redactor: Redactor | None,
    follow: bool,
    before_exit: BeforeExit | None = None,
    on_journal_error: Callable[[], Awaitable[bool]] | None = None,
    checkpoint: Checkpoint | None = None,
) -> AsyncIterator[Produced]:
    """What a driver holding the run's claim pipes into its log: the end an earlier driver
    already logged (:func:`logged_end`, appending nothing), or :class:`AgentNeverStarted`
    for a run with no journal, or the translation after the journal offset stored with the
    last logged event (:func:`produce_batches`). ``harness`` builds the run's harness, only
    when the journal is to be translated (a run whose harness cannot be rebuilt here can
    still be finished with the end its log holds).

    Call it only under the claim: appends of any predecessor are fenced from then on, so
    the log's tail read here is final."""
    end = await logged_end(store, record)
    if end is not None:
        yield end
        return
    if not await anyio.to_thread.run_sync(paths.journal.exists):
        # We hold the claim, so whoever started the run is fenced off: with no journal,
        # its agent was never launched and nothing will ever write one.
        raise AgentNeverStarted(f"{NOT_STARTED} (it left no journal)")
    tail = await store.tail(record.run_id)
    batches = produce_batches(
        harness(), run_context(record), paths, nonce,
        after=tail.last_journal_offset, redactor=redactor, follow=follow,
        before_exit=before_exit, on_journal_error=on_journal_error, checkpoint=checkpoint)
    try:
        async for item in batches:
            yield item
    finally:
        await batches.aclose()  # type: ignore[attr-defined]


async def _last_event(store: EventLog, run_id: str, last_offset: int) -> dict[str, Any] | None:
    if last_offset < 1:
        return None
    events = store.read(run_id, after=last_offset - 1)
    try:
        async for logged in events:
            return logged.event
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
    return None


async def logged_end(store: EventLog, record: RunRecord) -> ProducerExit | None:
    """How to finish a ``running`` run whose log cannot (or need not) be continued, or
    ``None`` to drive it normally.

    - The log already ends with the run's end (``RUN_FINISHED``/``RUN_ERROR``): an earlier
      driver logged the exit batch and died, or lost its terminal write, before storing
      the status. The status is that end (exit code from the journal's sentinel); nothing
      is appended. Resuming the journal after the exit would find no exit and fail the run.
    - The log is closed without an end (nothing can be appended): the journal decides —
      its exit code if the agent exited, else ``failed`` saying the log was closed.

    The result carries ``logged=True``: the pipe records it without appending.
    """
    tail = await store.tail(record.run_id)
    last = await _last_event(store, record.run_id, tail.last_offset)
    kind = last.get("type") if last is not None else None
    if kind not in (RUN_FINISHED, RUN_ERROR) and not tail.closed:
        return None
    probe = await probe_run_exit(record)
    code = probe.exit_code if probe.state == "finished" else None
    if kind == RUN_ERROR and last is not None:
        return ProducerExit(exit_code=code, error=error_from_event(last), logged=True)
    if kind == RUN_FINISHED or code is not None:
        return ProducerExit(exit_code=code, logged=True)
    return ProducerExit(
        error=RunError("the run's event log was closed before the run's end was logged",
                       "log_closed"),
        logged=True,
    )
