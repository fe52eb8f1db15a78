"""``corral attach`` and ``corral show``: a run viewed from its store, its events as they
come (also ``corral run``'s stream) or its record.

``attach`` prints the logged events as soon as the store is open; the runner it drives the
run with (a takeover when the run's driver died) loads in a worker thread meanwhile, since its
modules take most of the command's start-up.

The events as text for a person (``corral run`` / ``attach`` without ``--json``,
:class:`TextStream`): stdout only ever holds whole lines at every point a person or a prompt
can see it (a note on stderr, the end of a message, the end of the command), and messages are
separated by one blank line. The ``command`` harness delivers each stdout line as soon as it
is complete but carries its newline at the start of the *next* delta (see
:mod:`corral.harness._command`); with ``line_deltas`` the printer ends the line at once and
drops that leading newline when it comes. Agent harnesses stream tokens: their last line is
ended when the message ends (or before a note). Tool calls show on stderr as
``[tool] NAME  MAIN-ARGUMENT`` once their arguments are complete (the command of ``Bash``,
the path of ``Read``, …), their results as ``[tool result] …``.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Final, TextIO

import anyio
import anyio.to_thread

from corral._cmdline import VIEWER_LEFT, is_closed_pipe, silence_stdout
from corral._errors import ConfigError
from corral.cli._records import record_json, show_text, usage_lines
from corral.cli._store import with_store
from corral.stores._protocols import LoggedEvent, Store, UnknownRun
from corral.stores._records import RunRecord, RunStatus

if TYPE_CHECKING:
    from corral.runs._runner import DriveResult, Runner

__all__ = ["EventPrinter", "TextStream", "attach", "exit_code_for",
           "follow", "main_argument", "say", "show", "summary_line"]

SECOND_SIGINT_WINDOW = 2.0


class EventPrinter:
    """Prints logged events: NDJSON with ``--json``, else text with line discipline
    (:class:`TextStream`; ``line_deltas`` for the ``command``
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
        usage = record.usage if isinstance(record.usage, dict) else None
        for line in show_text(record, usage_lines(usage) if usage else []):
            print(line)
    return 0


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

            tg.start_soon(_on_signals, signals, outcome, stop, cancel, printer)
            async with anyio.create_task_group() as work:
                work.start_soon(drive)
                with show_scope:
                    async for logged in store.read(run_id, after):
                        try:
                            printer(logged)
                        except OSError as exc:
                            if not is_closed_pipe(exc):
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
    return await _ended(store, run_id, runners, cancel.is_set(), outcome)


async def _on_signals(signals: AsyncIterator[signal.Signals], outcome: dict[str, Any],
                      stop: anyio.Event,
                      cancel: anyio.Event, printer: EventPrinter) -> None:
    """The first SIGINT or SIGTERM stops driving (noted in ``outcome``); a second SIGINT
    within :data:`SECOND_SIGINT_WINDOW` asks for the run's cancel."""
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


async def _ended(store: Store, run_id: str, runners: _RunnerWhenNeeded, cancel: bool,
                 outcome: dict[str, Any]) -> int:
    """How a followed run ended for the viewer, said on stderr: its exit code."""
    if cancel:
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
        if not is_closed_pipe(exc):
            raise


# ---------------------------------------------------------------------------- text

# The argument that says what a tool call does, by the names agent CLIs give it (first found).
_MAIN_KEYS: Final = ("command", "cmd", "file_path", "path", "filePath", "pattern", "url",
                     "query", "prompt", "description", "env")
_MAX_ARG: Final = 160


def main_argument(raw_args: str) -> str:
    """The one argument worth showing of a tool call's JSON arguments, on one line and cut to
    fit (``""`` when there is none)."""
    try:
        args = json.loads(raw_args) if raw_args.strip() else {}
    except ValueError:
        value: Any = raw_args
    else:
        if not isinstance(args, dict):
            value = args
        else:
            value = next((args[k] for k in _MAIN_KEYS if args.get(k) not in (None, "")), None)
            if value is None:
                value = next((v for v in args.values() if isinstance(v, str) and v), "")
    if isinstance(value, list):
        value = " ".join(str(v) for v in value)
    text = " ".join(str(value).split())  # one line
    return text if len(text) <= _MAX_ARG else text[: _MAX_ARG - 1] + "…"


def _seconds(elapsed: float) -> str:
    if elapsed < 60:
        return f"{elapsed:.1f} s"
    minutes, seconds = divmod(int(elapsed), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    return f"{minutes // 60} h {minutes % 60} min"


def summary_line(run_id: str, status: str, exit_code: int | None, elapsed: float | None,
                 cost_usd: float | None) -> str:
    """``corral: run X completed (exit 0, 1.2 s, $0.003)``: how a followed run ended."""
    parts = []
    if exit_code is not None:
        parts.append(f"exit {exit_code}")
    if elapsed is not None:
        parts.append(_seconds(max(0.0, elapsed)))
    if cost_usd is not None:
        parts.append("$0" if cost_usd == 0 else "<$0.0001" if cost_usd < 0.0001
                     else f"${cost_usd:.4f}".rstrip("0").rstrip("."))
    detail = f" ({', '.join(parts)})" if parts else ""
    return f"corral: run {run_id} {status}{detail}"


class TextStream:
    """Writes AG-UI events as text with line discipline (see the module)."""

    def __init__(self, out: TextIO, err: TextIO, *, line_deltas: bool = False) -> None:
        self.out = out
        self.err = err
        self.line_deltas = line_deltas
        self._open = False  # stdout's last line has no newline yet
        self._owed = False  # we ended the line ourselves: the next leading "\n" is ours
        self._printed_message = False
        self._tools: dict[str, tuple[str, list[str]]] = {}

    def event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "TEXT_MESSAGE_START":
            self.end_line()
            if self._printed_message:
                self.out.write("\n")  # a blank line between messages
            self._owed = False
        elif kind == "TEXT_MESSAGE_CONTENT":
            self._text(str(event.get("delta", "")))
        elif kind == "TEXT_MESSAGE_END":
            self.end_line()
        elif kind == "TOOL_CALL_START":
            self._tools[str(event.get("toolCallId"))] = (str(event.get("toolCallName")), [])
        elif kind == "TOOL_CALL_ARGS":
            call = self._tools.get(str(event.get("toolCallId")))
            if call is not None:
                call[1].append(str(event.get("delta", "")))
        elif kind == "TOOL_CALL_END":
            self._tool_line(str(event.get("toolCallId")))
        elif kind == "TOOL_CALL_RESULT":
            self._tool_line(str(event.get("toolCallId")))
            content = " ".join(str(event.get("content", "")).split())
            self.note(f"[tool result] {content[:200]}")
        elif kind == "RUN_ERROR":
            self.note(f"[run error] {event.get('message')}")
        elif kind == "CUSTOM" and event.get("name") == "corral.session_lost":
            value = event.get("value") or {}
            self.note(f"corral: warning: this turn started a new conversation: the "
                      f"thread's {value.get('harness')} session {value.get('expected')} "
                      f"was not continued ({value.get('reason')})")
        elif kind == "CUSTOM" and event.get("name") == "sandbox.file":
            value = event.get("value") or {}
            self.note(f"[file] {value.get('type')} {value.get('path')}")
        elif kind in ("RUN_FINISHED",):
            self.end_line()
        self.out.flush()

    def _text(self, delta: str) -> None:
        if self._owed and delta.startswith("\n"):
            delta = delta[1:]
        self._owed = False
        if not delta:
            return
        self.out.write(delta)
        self._printed_message = True
        self._open = not delta.endswith("\n")
        if self.line_deltas and self._open:
            self.end_line()

    def _tool_line(self, call_id: str) -> None:
        call = self._tools.pop(call_id, None)
        if call is not None:
            name, parts = call
            arg = main_argument("".join(parts))
            self.note(f"[tool] {name}  {arg}" if arg else f"[tool] {name}")

    def end_line(self) -> None:
        """End stdout's open line (the next delta's leading newline is then dropped)."""
        if self._open:
            self.out.write("\n")
            self._open = False
            self._owed = True
        self.out.flush()

    def note(self, text: str) -> None:
        """One line on stderr, after ending stdout's open line."""
        self.end_line()
        self.err.write(text + "\n")
        self.err.flush()

    def close(self) -> None:
        """The stream ended: ends the open line, prints tool calls that never got an end."""
        for call_id in list(self._tools):
            self._tool_line(call_id)
        self.end_line()
