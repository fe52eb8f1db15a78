"""A structured result at the end of a run (``RunRequest(output_schema=...)``).

Every driver of such a run (the Runner's, the reaper's) passes what the produce path makes
through :func:`settle_output`:

- a translator's ``CUSTOM corral.output_candidate`` (a result the CLI produced natively:
  Claude Code's ``structured_output``, Codex's final message under ``--output-schema``) is
  validated and taken out of the log; a valid one is stored on the record at once (a
  successor resuming after it finds it there);
- results given through the host tool ``submit_result`` were validated and stored by the
  tool (:class:`corral.tools._output.OutputState`);
- the count of results that did not match is the run's, not one driver's: stored on the
  record (``output_tries``) as each comes, read back by a driver taking the run over;
- at the agent's ``RUN_FINISHED``: with a valid result (this driver's, else the record's)
  ``CUSTOM corral.output`` (value: the result) goes in just before it; without one the
  ``RUN_FINISHED`` becomes a ``RUN_ERROR`` (code ``output_invalid``) naming the last
  validation error, so the run ends ``failed``.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final

from corral.runs._pipe import RUN_FINISHED, LogBatch, Produced, run_error_event
from corral.stores._protocols import RunStore
from corral.stores._records import RunError, RunPatch, RunRecord
from corral.tools._output import OUTPUT_CANDIDATE_EVENT, OUTPUT_EVENT, OutputState

__all__ = ["OUTPUT_INVALID", "output_state", "settle_output"]

OUTPUT_INVALID: Final = "output_invalid"
"""The error code of a run that ended without a result matching its output schema."""


async def output_state(store: RunStore, record: RunRecord, schema: Mapping[str, Any],
                       redact: Callable[[Any], Any] | None, *,
                       epoch: int | None = None) -> OutputState:
    """A driver's :class:`OutputState` for ``record``, continuing the count of invalid
    results the run's earlier drivers stored (``output_tries``). Each accepted result is
    stored as the record's ``output``, each invalid one's count and error as its
    ``output_tries`` (``redact``-ed: the run's secrets never leave in a result or an
    error), fenced by the driver's claim ``epoch``."""
    current = await store.get(record.run_id)
    tries = (current.output_tries if current is not None else None) or {}
    invalid = tries.get("invalid")
    error = tries.get("error")

    async def keep(value: dict[str, Any]) -> None:
        await store.update(record.run_id, RunPatch(output=redact(value) if redact else value),
                           expect_epoch=epoch)

    async def count(invalid: int, error: str) -> None:
        shown = redact(error) if redact is not None else error
        await store.update(record.run_id, RunPatch(output_tries={
            "invalid": invalid, "error": shown if isinstance(shown, str) else error}),
            expect_epoch=epoch)

    on_valid: Callable[[dict[str, Any]], Awaitable[object]] = keep
    return OutputState(dict(schema), on_valid=on_valid, on_invalid=count,
                       invalid=invalid if isinstance(invalid, int) and invalid > 0 else 0,
                       last_error=error if isinstance(error, str) else None)


async def settle_output(produced: AsyncIterable[Produced], store: RunStore, record: RunRecord,
                        state: OutputState,
                        redact: Callable[[Any], Any] | None = None
                        ) -> AsyncIterator[Produced]:
    """``produced`` with the run's result settled (see the module docstring)."""
    it = aiter(produced)
    try:
        async for item in it:
            if isinstance(item, LogBatch):
                item = await _settle(item, store, record.run_id, state, redact)
            yield item
    finally:
        aclose = getattr(it, "aclose", None)
        if aclose is not None:
            await aclose()


async def _settle(batch: LogBatch, store: RunStore, run_id: str, state: OutputState,
                  redact: Callable[[Any], Any] | None) -> LogBatch:
    events: list[Mapping[str, Any]] = []
    changed = False
    for event in batch.events:
        if event.get("type") == "CUSTOM" and event.get("name") == OUTPUT_CANDIDATE_EVENT:
            changed = True
            await _candidate(event.get("value"), state)
            continue
        if event.get("type") == RUN_FINISHED:
            changed = True
            events += await _end(event, store, run_id, state, redact)
            continue
        events.append(event)
    if not changed:
        return batch
    return LogBatch(events, batch.journal_offset, exit_code=batch.exit_code)


async def _candidate(value: object, state: OutputState) -> None:
    if isinstance(value, Mapping) and "value" in value:
        await state.offer(value["value"])
        return
    error = value.get("error") if isinstance(value, Mapping) else None
    await state.reject(str(error) if error else "the agent CLI gave a malformed result")


async def _end(finished: Mapping[str, Any], store: RunStore, run_id: str, state: OutputState,
               redact: Callable[[Any], Any] | None) -> list[Mapping[str, Any]]:
    value: Any = state.value
    if value is not None and redact is not None:
        value = redact(value)
    if value is None:
        current = await store.get(run_id)
        value = current.output if current is not None else None
    if value is not None:
        return [{"type": "CUSTOM", "name": OUTPUT_EVENT, "value": dict(value)}, finished]
    why = state.last_error or ("the agent never gave one (through submit_result, none its "
                               "CLI let through)")
    return [run_error_event(RunError(
        f"the run gave no result matching its output schema: {why}", OUTPUT_INVALID))]
