"""``corral show`` and ``attach``, and the event output ``corral run`` shares: what
needs only the store (the parsers are in :mod:`corral.cli._runs_cmd`).

``attach`` prints the logged events as soon as the store is open; the runner it drives the
run with (a takeover when the run's driver died) loads in a worker thread meanwhile, since its
modules take most of the command's start-up.
"""

from __future__ import annotations

import argparse
import errno
import json
import signal
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

import anyio
import anyio.to_thread

from corral._errors import ConfigError
from corral.cli._human_stream import TextStream, summary_line
from corral.cli._ls_impl import record_json
from corral.cli._store import with_store
from corral.server._cmdline import VIEWER_LEFT, silence_stdout
from corral.stores._protocols import LoggedEvent, Store, UnknownRun
from corral.stores._records import RunRecord, RunStatus

if TYPE_CHECKING:
    from corral.runs._runner import DriveResult, Runner

__all__ = ["EventPrinter", "attach", "exit_code_for", "follow", "say", "show"]

SECOND_SIGINT_WINDOW = 2.0


class EventPrinter:
    """Prints logged events: NDJSON with ``--json``, else text with line discipline
    (:class:`corral.cli._human_stream.TextStream`; ``line_deltas`` for the ``command``
    harness, whose deltas are whole lines)."""

    def __init__(self, as_json: bool, out: TextIO = sys.stdout, err: TextIO = sys.stderr,
                 *, line_deltas: bool = False):
        self.as_json = as_json
        self.out = out
        self.err = err
        self._text = TextStream(out, err, line_deltas=line_deltas)

    def __call__(self, logged: LoggedEvent) -> None:
        if self.as_json:
            line = json.dumps({"offset": logged.offset, "event": logged.event},
                              ensure_ascii=False, separators=(",", ":"))
            self.out.write(line + "\n")
            self.out.flush()
            return
        self._text.event(logged.event)

    def end_line(self) -> None:
        """End stdout's open line, before a line on stderr."""
        if not self.as_json:
            self._text.end_line()

    def close(self) -> None:
        """The stream ended (the run ended or we detach)."""
        if not self.as_json:
            self._text.close()


def exit_code_for(record: RunRecord) -> int:
    """0 only for a completed run; the agent's exit code for a failed one when it has one."""
    if record.status is RunStatus.COMPLETED:
        return 0
    if record.status is RunStatus.FAILED and record.exit_code and 0 < record.exit_code < 256:
        return record.exit_code
    return 1


# ---------------------------------------------------------------------------- commands


def show(args: argparse.Namespace) -> int:
    found = with_store(args, lambda store: store.get(args.run_id))
    if found is None:
        raise UnknownRun(args.run_id)
    record = found
    data = record_json(record)
    if args.json:
        print(json.dumps(data))
    else:
        from corral.cli._run_text import show_text

        usage = record.usage if isinstance(record.usage, dict) else None
        for line in show_text(record, usage_lines(usage) if usage else []):
            print(line)
    return 0


def usage_lines(usage: dict[str, Any]) -> list[str]:
    """A run's usage as ``corral show`` prints it: totals, cost, then a line per model."""

    def tokens(u: dict[str, Any]) -> str:
        return (f"{u.get('input_tokens', 0)} in, {u.get('output_tokens', 0)} out, "
                f"{u.get('cache_read_tokens', 0)} cache read, "
                f"{u.get('cache_write_tokens', 0)} cache write")

    lines = [f"{'tokens':17} {tokens(usage)} ({usage.get('requests', 0)} requests)"]
    if "cost_usd" in usage:
        unpriced = ", ".join(map(str, usage.get("unpriced") or []))
        if unpriced and not usage.get("cost_by_model"):
            # never shown as $0: a model without a price is not free
            lines.append(f"{'cost':17} unknown (no price for {unpriced})")
        else:
            lines.append(f"{'cost':17} ${usage['cost_usd']:.4f}"
                         + (f" + unpriced: {unpriced}" if unpriced else ""))
    costs = usage.get("cost_by_model") or {}
    for model, used in sorted((usage.get("models") or {}).items()):
        if isinstance(used, dict):
            cost = f", ${costs[model]:.4f}" if model in costs else ""
            lines.append(f"{'  ' + model:17} {tokens(used)}{cost}")
    return lines


def attach(args: argparse.Namespace) -> int:
    if args.after < 0:
        raise ConfigError("--after must be a log offset of 0 or more")

    async def attach(store: Store) -> int:
        record = await store.get(args.run_id)
        if record is None:
            raise UnknownRun(args.run_id)
        printer = EventPrinter(args.json, line_deltas=record.harness == "command")
        return await follow(store, args.run_id, args.after, printer)

    return with_store(args, attach)


async def follow(
    store: Store, run_id: str, after: int, printer: EventPrinter,
    runner: Runner | None = None,
) -> int:
    """Print the log from ``after`` while driving the run (with ``runner``, or a runner over
    ``store`` built in the meantime, see :class:`_RunnerWhenNeeded`).

    SIGINT or SIGTERM stops driving between batches and detaches (the run goes on); a
    second SIGINT within two seconds cancels the run. A standard output closed by its
    reader (``| head``) detaches too, quietly, and returns :data:`VIEWER_LEFT`.
    """
    runners = _RunnerWhenNeeded(store, runner)
    stop = anyio.Event()
    cancel = anyio.Event()
    show_scope = anyio.CancelScope()
    outcome: dict[str, Any] = {}

    async def drive() -> None:
        result = await (await runners.get()).drive(run_id, stop=stop)
        outcome["drive"] = result
        if result.detached:
            show_scope.cancel()

    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with anyio.create_task_group() as tg:

            async def on_signals() -> None:
                async for signum in signals:
                    if "signal" not in outcome:
                        outcome["signal"] = signum
                        outcome["at"] = time.monotonic()
                        stop.set()
                        if signum != signal.SIGINT:
                            return
                        printer.end_line()
                        say("detaching… press Ctrl-C again within 2 s to cancel the run")
                    elif signum == signal.SIGINT and (
                        time.monotonic() - outcome["at"] <= SECOND_SIGINT_WINDOW
                    ):
                        cancel.set()
                        return

            tg.start_soon(on_signals)
            async with anyio.create_task_group() as work:
                work.start_soon(drive)
                with show_scope:
                    async for logged in store.read(run_id, after):
                        try:
                            printer(logged)
                        except OSError as exc:
                            if not _closed_pipe(exc):
                                raise
                            # The viewer left (``| head``): detach as Ctrl-C does, quietly.
                            silence_stdout()
                            outcome["pipe"] = True
                            stop.set()
                            break
            if outcome.get("signal") == signal.SIGINT and not cancel.is_set():
                remaining = SECOND_SIGINT_WINDOW - (time.monotonic() - outcome["at"])
                with anyio.move_on_after(max(0.0, remaining)):
                    await cancel.wait()
            tg.cancel_scope.cancel()

    printer.close()
    if cancel.is_set():
        with anyio.CancelScope(shield=True):
            cancelled = await (await runners.get()).cancel(run_id)
        say(f"run {run_id} cancelled ({cancelled.status.value})")
        return 130
    result: DriveResult | None = outcome.get("drive")
    if outcome.get("pipe"):
        return VIEWER_LEFT  # quietly: the run goes on, detached (or it had just ended)
    if result is not None and result.detached and not result.record.terminal:
        say(f"detached; the run goes on. Watch again: corral attach {run_id}   "
            f"Cancel: corral cancel {run_id}")
        return 130
    final = await store.get(run_id)
    if final is None:
        return 1
    say_summary(final)
    return exit_code_for(final)


def say_summary(record: RunRecord) -> None:
    """The closing line of a followed run on stderr: ``corral: run X completed (exit 0,
    1.2 s, $0.003)``."""
    elapsed = (record.finished_at - record.started_at) if record.finished_at else None
    cost = (record.usage or {}).get("cost_usd")
    unpriced = (record.usage or {}).get("unpriced")
    print(summary_line(record.run_id, record.status.value, record.exit_code, elapsed,
                       cost if isinstance(cost, int | float) and not unpriced else None),
          file=sys.stderr, flush=True)


class _RunnerWhenNeeded:
    """The runner that drives (or cancels) a followed run: the caller's, or one over the
    store built on first need. Its modules (harnesses, providers, tool servers: most of
    ``corral attach``'s start-up) are imported in a worker thread, so the event loop prints
    the logged events meanwhile."""

    def __init__(self, store: Store, runner: Runner | None) -> None:
        self._store = store
        self._runner = runner
        self._lock = anyio.Lock()

    async def get(self) -> Runner:
        async with self._lock:
            if self._runner is None:
                runner_class = await anyio.to_thread.run_sync(_runner_class)
                self._runner = runner_class(self._store)
            return self._runner


def _runner_class() -> type[Runner]:
    # Lazy (and off the event loop): see _RunnerWhenNeeded.
    from corral.runs._runner import Runner

    return Runner


def say(text: str) -> None:
    try:
        print(f"corral: {text}", file=sys.stderr, flush=True)
    except OSError as exc:  # ``2>&1 | head``: the reader left, the command goes on quietly
        if not _closed_pipe(exc):
            raise


def _closed_pipe(exc: OSError) -> bool:
    return isinstance(exc, BrokenPipeError) or exc.errno == errno.EPIPE
