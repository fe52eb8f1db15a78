"""``pipe_to_run_log``: drive a producer's events into a run's log, ending in one status.

The pipe is total: whatever the producer does, it records exactly one terminal status
(through the epoch fence) and calls ``close`` exactly once, then re-reads the record; the
close always comes after the terminal status is stored. Rules:

- the producer yields ``(event, journal_offset)`` pairs and may end with a
  :class:`ProducerExit` carrying the agent's exit code or error;
- an abort (the ``abort`` event) before start, between events, or while the producer is
  waiting for its next event, is ``aborted`` — also when the producer then ends its stream;
- a ``RUN_ERROR`` event is ``failed`` with its message and code; a producer that raises, or
  exits non-zero, is ``failed`` and a synthetic ``RUN_ERROR`` is appended;
- a driver whose claim is lost (:class:`ClaimLost` from an append or the terminal write) lands
  nothing more, writes no status over its successor, and still calls ``close`` (which leaves a
  successor's log open);
- cancellation from outside records ``aborted``, closes, and re-raises the cancellation;
  with ``detach_on_cancel`` (a Runner's driver) it records nothing and leaves the log open
  instead, as ``stop`` does (the caller stamps the detach), and re-raises: the application
  that drove the run went away, the run did not end;
- a terminal write the store refuses for another reason (a transient database error) is
  retried a few times; if it never lands, the log is **not** closed (``record_error`` says
  why): a closed log under a ``running`` record would make every successor fail a run whose
  end may already be logged, while an open one lets the next driver finish it properly.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeAlias, cast

import anyio

from corral._log import library_logger
from corral.stores._records import UNSET, RunError, RunPatch, RunRecord, RunStatus
from corral.stores._protocols import ClaimLost, EventLog, RunStore

log = library_logger("corral.runs._pipe")

RUN_ERROR = "RUN_ERROR"
RUN_FINISHED = "RUN_FINISHED"

TERMINAL_WRITE_DELAYS: Final = (0.05, 0.2, 0.8)
"""Waits before each retry of a terminal status write the store refused (not a fence
miss): a transient database error must not leave a finished run ``running``."""


@dataclass(frozen=True, slots=True)
class ProducerExit:
    """The producer's final word: the agent's exit code and/or an error it observed."""

    exit_code: int | None = None
    error: RunError | None = None
    logged: bool = False
    """The run's end (its ``RUN_FINISHED``/``RUN_ERROR``) is already in the log, put there
    by an earlier driver whose terminal write was lost: record the status, append
    nothing."""


@dataclass(frozen=True, slots=True)
class LogBatch:
    """Events appended in one atomic append, all carrying ``journal_offset``.

    A harness batch (the events of one journal item) must land whole or not at all, so a
    successor resuming after ``journal_offset`` neither repeats nor skips any of them.
    """

    events: Sequence[Mapping[str, Any]]
    journal_offset: int
    exit_code: int | None = None
    """Set on the batch translated from the agent's exit: recorded on the run."""


Produced: TypeAlias = tuple[Mapping[str, Any], int] | LogBatch | ProducerExit


class PipeStore(RunStore, EventLog, Protocol):
    """What the pipe needs: run records and the event log."""


@dataclass(frozen=True, slots=True)
class PipeResult:
    """How a pipe ended.

    ``status`` is what this driver decided; ``record`` is the record re-read afterwards (the
    successor's live record when ``claim_lost``; ``None`` if it could not be read).
    """

    status: RunStatus
    record: RunRecord | None
    claim_lost: bool
    error: RunError | None
    exit_code: int | None
    appended: int
    stopped: bool = False
    """The driver stopped without finishing (``stop`` was set): no status, no close; the run
    goes on and a successor continues from the log."""
    record_error: str | None = None
    """Why the terminal status could not be stored even after retries (the claim was held).
    The log was left open, the record still says ``running``: a later driver finishes it."""


class _End:
    pass


class _Aborted:
    pass


@dataclass
class _Raised:
    exc: BaseException


_END = _End()
_ABORTED = _Aborted()
_STOPPED = _Aborted()


def error_from_exception(exc: BaseException) -> RunError:
    """A :class:`RunError` for an exception: its message (or type) and a string/number code."""
    message = str(exc) or type(exc).__name__
    code = getattr(exc, "code", None)
    if isinstance(code, bool) or not isinstance(code, str | int | float) or isinstance(code, float) and not math.isfinite(code):
        code = None
    return RunError(message=message, code=None if code is None else str(code))


def error_from_event(event: Mapping[str, Any]) -> RunError:
    """The error a ``RUN_ERROR`` event carries (AG-UI fields ``message`` and ``code``)."""
    message = event.get("message")
    code = event.get("code")
    return RunError(
        message=message if isinstance(message, str) and message else "the run reported an error",
        code=code if isinstance(code, str) else None,
    )


def run_error_event(error: RunError) -> dict[str, Any]:
    """A synthetic AG-UI ``RUN_ERROR`` event for ``error``."""
    event: dict[str, Any] = {"type": RUN_ERROR, "message": error.message}
    if error.code is not None:
        event["code"] = error.code
    return event


async def _pull(
    it: AsyncIterator[Produced], abort: anyio.Event | None, stop: anyio.Event | None = None
) -> object:
    """The producer's next item, ``_END``, ``_Raised``, ``_ABORTED`` if ``abort`` fired
    while waiting, or ``_STOPPED`` if ``stop`` did (the pending pull is cancelled)."""
    if abort is None and stop is None:
        try:
            return await it.__anext__()
        except StopAsyncIteration:
            return _END
        except Exception as exc:  # noqa: BLE001
            return _Raised(exc)
    result: object = _ABORTED
    async with anyio.create_task_group() as tg:

        async def watch(event: anyio.Event, outcome: object) -> None:
            nonlocal result
            await event.wait()
            result = outcome
            tg.cancel_scope.cancel()

        if abort is not None:
            tg.start_soon(watch, abort, _ABORTED)
        if stop is not None:
            tg.start_soon(watch, stop, _STOPPED)
        try:
            result = await it.__anext__()
        except StopAsyncIteration:
            result = _END
        except Exception as exc:  # noqa: BLE001
            result = _Raised(exc)
        tg.cancel_scope.cancel()
    return result


async def pipe_to_run_log(
    store: PipeStore,
    run_id: str,
    events: AsyncIterable[Produced],
    *,
    epoch: int,
    abort: anyio.Event | None = None,
    journal_offset: int = 0,
    clock: Callable[[], float] = time.time,
    close_timeout: float = 5.0,
    stop: anyio.Event | None = None,
    detach_on_cancel: bool = False,
) -> PipeResult:
    """Append ``events`` to ``run_id``'s log under claim ``epoch`` and finish the run.

    ``journal_offset`` is where the producer started reading the journal (carried by
    synthetic events before any real one). ``stop`` (detach): when set, the pipe stops
    between batches and returns without a status or a close, so the run stays open for a
    successor; ``abort`` wins when both are set. Never raises, except to propagate a
    cancellation from outside after recording ``aborted`` and closing (with
    ``detach_on_cancel``: after recording nothing, leaving the log open, as ``stop`` does).
    """
    it = aiter(events)
    stopped = False
    status: RunStatus | None = None
    error: RunError | None = None
    exit_code: int | None = None
    synthesize = False
    lost = False
    end_logged = False
    appended = 0
    last_journal = journal_offset
    try:
        while status is None:
            if abort is not None and abort.is_set():
                status = RunStatus.ABORTED
                break
            if stop is not None and stop.is_set():
                stopped = True
                break
            item = await _pull(it, abort, stop)
            if item is _STOPPED:
                if abort is not None and abort.is_set():
                    status = RunStatus.ABORTED
                else:
                    stopped = True
                break
            if item is _ABORTED:
                status = RunStatus.ABORTED
            elif item is _END:
                break
            elif isinstance(item, _Raised):
                status, error, synthesize = RunStatus.FAILED, error_from_exception(item.exc), True
            elif isinstance(item, ProducerExit):
                exit_code = item.exit_code
                end_logged = item.logged
                if item.error is not None:
                    status, error = RunStatus.FAILED, item.error
                    synthesize = not end_logged
                break
            else:
                if isinstance(item, LogBatch):
                    batch, offset = list(item.events), item.journal_offset
                    if item.exit_code is not None:
                        exit_code = item.exit_code
                else:
                    event, offset = cast(tuple[Mapping[str, Any], int], item)
                    batch = [event]
                if abort is not None and abort.is_set():
                    status = RunStatus.ABORTED  # the event that raced the abort is dropped
                    break
                if not batch:
                    continue
                try:
                    await store.append(run_id, [(e, offset) for e in batch], epoch=epoch)
                except ClaimLost:
                    lost = True
                    status = RunStatus.ABORTED
                    break
                except Exception as exc:  # noqa: BLE001
                    status, error, synthesize = RunStatus.FAILED, error_from_exception(exc), True
                    break
                appended += len(batch)
                last_journal = offset
                failure = next((e for e in batch if e.get("type") == RUN_ERROR), None)
                if failure is not None:
                    status, error = RunStatus.FAILED, error_from_event(failure)
        if status is None and not stopped:
            if abort is not None and abort.is_set():
                status = RunStatus.ABORTED
            elif exit_code is not None and exit_code != 0 and error is None:
                status = RunStatus.FAILED
                error = RunError(f"the agent exited with code {exit_code}", "exit_code")
                synthesize = not end_logged
            else:
                status = RunStatus.COMPLETED
    except anyio.get_cancelled_exc_class():
        # Cancelled from outside while no status was decided (every decision breaks out of
        # the loop with no await in between).
        if detach_on_cancel and status is None:
            stopped = True
        raise
    finally:
        # Runs on every path, cancellation included: shielded so the record and the log
        # always reach their end state.
        with anyio.CancelScope(shield=True):
            if stopped:
                result = PipeResult(
                    status=RunStatus.RUNNING,
                    record=None,
                    claim_lost=False,
                    error=None,
                    exit_code=None,
                    appended=appended,
                    stopped=True,
                )
            else:
                result = await _finish(
                    store, run_id, epoch, status=status, error=error, exit_code=exit_code,
                    synthesize=synthesize, lost=lost, last_journal=last_journal,
                    appended=appended, clock=clock,
                )
            await _aclose(it, run_id, close_timeout)
    return result


async def _aclose(it: AsyncIterator[Produced], run_id: str, timeout: float) -> None:
    aclose = getattr(it, "aclose", None)
    if aclose is not None:
        with anyio.move_on_after(timeout):
            try:
                await aclose()
            except Exception as exc:  # noqa: BLE001
                log.debug("closing the producer of run %s failed: %s", run_id, exc)


async def _finish(
    store: PipeStore,
    run_id: str,
    epoch: int,
    *,
    status: RunStatus | None,
    error: RunError | None,
    exit_code: int | None,
    synthesize: bool,
    lost: bool,
    last_journal: int,
    appended: int,
    clock: Callable[[], float],
) -> PipeResult:
    if status is None:  # cancelled from outside mid-pipe
        status = RunStatus.ABORTED
    if status is RunStatus.ABORTED and error is None:
        error = RunError("the run was aborted", "aborted")
        synthesize = True
    if synthesize and not lost and error is not None:
        try:
            await store.append(run_id, [(run_error_event(error), last_journal)], epoch=epoch)
            appended += 1
        except ClaimLost:
            lost = True
        except Exception as exc:  # noqa: BLE001
            log.warning("appending the synthesized RUN_ERROR to run %s failed: %s", run_id, exc)
            error = RunError(
                f"{error.message}; appending the synthesized RUN_ERROR failed: {exc}", error.code
            )
    record_error: str | None = None
    if not lost:
        patch = RunPatch(
            status=status,
            finished_at=clock(),
            error=error,
            exit_code=exit_code if exit_code is not None else UNSET,
        )
        try:
            await _write_terminal(store, run_id, patch, epoch)
        except ClaimLost:
            lost = True
        except Exception as exc:  # noqa: BLE001
            record_error = f"recording the terminal status failed: {exc}"
            log.error("recording the terminal status of run %s failed (the log stays open "
                      "for a successor): %s", run_id, exc)
    if lost:
        log.info("run %s: claim at epoch %d lost; its successor owns the run", run_id, epoch)
    if record_error is None:
        # Only after the status is stored: a closed log under a running record would make
        # every successor fail the run (nothing can be appended to finish it).
        try:
            await store.close(run_id, epoch=epoch)
        except Exception as exc:  # noqa: BLE001
            log.error("closing the event log of run %s failed: %s", run_id, exc)
    record: RunRecord | None = None
    try:
        record = await store.get(run_id)
    except Exception as exc:  # noqa: BLE001
        log.error("re-reading run %s after finishing failed: %s", run_id, exc)
    return PipeResult(
        status=status,
        record=record,
        claim_lost=lost,
        error=error,
        exit_code=exit_code,
        appended=appended,
        record_error=record_error,
    )


async def _write_terminal(store: PipeStore, run_id: str, patch: RunPatch, epoch: int) -> None:
    """The fenced terminal write, retried (bounded) when the store fails for any reason
    but the fence: the patch is idempotent, and a lost claim (:class:`ClaimLost`) is final."""
    for delay in (*TERMINAL_WRITE_DELAYS, None):
        try:
            await store.update(run_id, patch, expect_epoch=epoch)
            return
        except ClaimLost:
            raise
        except Exception as exc:
            if delay is None:
                raise
            log.warning("recording the terminal status of run %s failed, retrying in %gs: %s",
                        run_id, delay, exc)
            await anyio.sleep(delay)
