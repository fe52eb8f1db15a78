"""``corral run``, ``attach``, ``cancel``, ``ls`` and ``show``: durable runs from the shell."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, TextIO

import anyio

from corral.cli._progress import CopyProgressLine
from corral._errors import ConfigError
from corral._ids import check_id
from corral.sandbox import _validate as validate
from corral.sandbox._config_file import find_config, load_config
from corral.cli._trust import check_found_config
from corral.sandbox._definition import Sandbox
from corral.sandbox._transfer import report_copy_progress
from corral.stores._records import RunRecord, RunStatus
from corral.runs._runner import DEFAULT_MAX_OUTPUT, DriveResult, Runner, RunRequest
from corral.stores._protocols import LoggedEvent, Store, UnknownRun
from corral.cli._store import add_store_option, with_store

SHOW_KEYS = (
    "run_id",
    "thread_id",
    "status",
    "exit_code",
    "error",
    "started_at",
    "finished_at",
    "detached_since",
    "cancel_requested",
    "driver_epoch",
    "sandbox_key",
)
SECOND_SIGINT_WINDOW = 2.0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser(
        "run",
        help="start a durable run and stream its events",
        description=(
            "Start a run in a fresh sandbox and stream its events until it ends. "
            "Ctrl-C detaches (the run goes on; `corral attach RUN_ID` to watch again); "
            "a second Ctrl-C within 2 s cancels it."
        ),
    )
    run.add_argument("--provider", help="sandbox provider: bubblewrap (default) or local")
    run.add_argument("--workspace", metavar="DIR", help="directory copied into /workspace")
    run.add_argument("--max-copy-size", metavar="SIZE",
                     help="most file contents to copy into /workspace, e.g. 4GiB (default: "
                          "[workspace] max_copy_size, $CORRAL_MAX_COPY_SIZE or 1GiB)")
    run.add_argument("--config", metavar="PATH",
                     help="sandbox definition file (default: corral.toml in the workspace "
                          "or the current directory, or their parents)")
    run.add_argument("--thread", metavar="T", help="thread id (default: the run id)")
    run.add_argument("--run-id", metavar="R", help="run id (default: generated)")
    run.add_argument("--harness", default="command", help="harness (default: command)")
    run.add_argument("--model", metavar="M", help="model for agent harnesses")
    run.add_argument("--timeout", type=_positive(float), metavar="SECONDS",
                     help="stop the agent after this long (the run fails, exit code 124)")
    run.add_argument("--file-events", nargs="?", const="on", choices=["on", "diff"],
                     help="log the agent's workspace changes as sandbox.file events "
                          "(--file-events diff: with patches)")
    run.add_argument("--max-output", metavar="SIZE",
                     help="stop the agent once its output passes this size (default 1GiB; "
                          "the journal lives on the host, outside the sandbox's disk quota)")
    run.add_argument("--token-budget", type=_positive(int), metavar="N",
                     help="agent harnesses: model tokens the run may use; model calls past "
                          "it are refused")
    _common(run)
    run.add_argument("--detach", action="store_true", help="start, print the run id, return")
    run.add_argument("argv", nargs="*", metavar="COMMAND",
                     help="the command (after --), or the prompt for agent harnesses")
    run.set_defaults(func=_run)

    attach = sub.add_parser("attach", help="watch a run again (takes it over when needed)")
    attach.add_argument("run_id", metavar="RUN_ID")
    attach.add_argument("--after", type=int, default=0, metavar="N",
                        help="print only events after log offset N")
    _common(attach)
    attach.set_defaults(func=_attach)

    cancel = sub.add_parser("cancel", help="cancel a run from any process")
    cancel.add_argument("run_id", metavar="RUN_ID")
    add_store_option(cancel)
    cancel.set_defaults(func=_cancel)

    ls = sub.add_parser("ls", help="list runs")
    ls.add_argument("--thread", metavar="T")
    ls.add_argument("--status", choices=[s.value for s in RunStatus])
    ls.add_argument("--limit", type=int, default=50)
    _common(ls)
    ls.set_defaults(func=_ls)

    show = sub.add_parser("show", help="show one run's record")
    show.add_argument("run_id", metavar="RUN_ID")
    _common(show)
    show.set_defaults(func=_show)


def _positive(kind: Callable[[str], float]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"{text!r} must be more than 0")
        return value

    parse.__name__ = kind.__name__  # argparse names it in "invalid int value"
    return parse


def _common(p: argparse.ArgumentParser) -> None:
    add_store_option(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")


# ---------------------------------------------------------------------------- output


class EventPrinter:
    """Prints logged events: NDJSON with ``--json``, else the text as it streams."""

    def __init__(self, as_json: bool, out: TextIO = sys.stdout, err: TextIO = sys.stderr):
        self.as_json = as_json
        self.out = out
        self.err = err
        self._text_open = False

    def __call__(self, logged: LoggedEvent) -> None:
        if self.as_json:
            line = json.dumps({"offset": logged.offset, "event": logged.event},
                              ensure_ascii=False, separators=(",", ":"))
            self.out.write(line + "\n")
            self.out.flush()
            return
        event = logged.event
        kind = event.get("type")
        if kind == "TEXT_MESSAGE_CONTENT":
            self.out.write(str(event.get("delta", "")))
            self.out.flush()
            self._text_open = True
        elif kind == "TOOL_CALL_START":
            self._note(f"[tool] {event.get('toolCallName')}")
        elif kind == "TOOL_CALL_RESULT":
            content = str(event.get("content", ""))
            self._note(f"[tool result] {content[:200]}")
        elif kind == "RUN_ERROR":
            self._note(f"[run error] {event.get('message')}")
        elif kind == "CUSTOM" and event.get("name") == "sandbox.file":
            value = event.get("value") or {}
            self._note(f"[file] {value.get('type')} {value.get('path')}")
        elif kind == "RUN_FINISHED":
            self.out.flush()

    def _note(self, text: str) -> None:
        self.out.flush()
        self.err.write(text + "\n")
        self.err.flush()


def exit_code_for(record: RunRecord) -> int:
    """0 only for a completed run; the agent's exit code for a failed one when it has one."""
    if record.status is RunStatus.COMPLETED:
        return 0
    if record.status is RunStatus.FAILED and record.exit_code and 0 < record.exit_code < 256:
        return record.exit_code
    return 1


def record_json(record: RunRecord) -> dict[str, Any]:
    data = record.to_dict()
    out = {key: data.get(key) for key in SHOW_KEYS}
    out["cancel_requested"] = bool(out["cancel_requested"])
    out["driver_epoch"] = record.driver_epoch
    for key in ("harness", "usage", "sandbox_ref"):
        if data.get(key) is not None:
            out[key] = data[key]
    return out


# ---------------------------------------------------------------------------- commands


def _run(args: argparse.Namespace) -> int:
    if not args.argv:
        raise ConfigError(
            "nothing to run: give a command after --, e.g. corral run -- echo hello"
            if args.harness == "command"
            else "give the prompt, e.g. corral run --harness claude-code \"fix the test\""
        )
    # The server's rule (corral._ids): ids become file names, URLs and log fields.
    if args.run_id is not None:
        check_id(args.run_id, "--run-id")
    if args.thread is not None:
        check_id(args.thread, "--thread")
    sandbox, config_dir = _definition(args)
    workspace = args.workspace or (str(config_dir) if config_dir is not None else None)
    options = {"model": args.model} if args.model else {}
    request = RunRequest(
        command=list(args.argv) if args.harness == "command" else None,
        prompt=None if args.harness == "command" else " ".join(args.argv),
        harness=args.harness,
        options=options,
        run_id=args.run_id,
        thread_id=args.thread,
        provider=args.provider or "bubblewrap",
        workspace=workspace,
        sandbox=sandbox,
        timeout=args.timeout,
        token_budget=args.token_budget,
        max_output=(validate.size(args.max_output, "--max-output")
                    if args.max_output is not None else DEFAULT_MAX_OUTPUT),
    )
    if args.file_events:
        file_events: bool | Literal["diff"] = "diff" if args.file_events == "diff" else True
        request = replace(request, sandbox=replace(request.definition(),
                                                   file_events=file_events))
    if args.max_copy_size is not None:
        defn = request.definition()
        ws = replace(defn.workspace,
                     max_copy_size=validate.size(args.max_copy_size, "--max-copy-size"))
        request = replace(request, sandbox=replace(defn, workspace=ws))
    async def start(store: Store) -> int:
        return await _start(store, args, request)

    if not sys.stderr.isatty():
        return with_store(args, start)
    with report_copy_progress(CopyProgressLine(sys.stderr)):
        return with_store(args, start)


def _definition(args: argparse.Namespace) -> tuple[Sandbox | None, Path | None]:
    """The sandbox definition from ``--config`` or a ``corral.toml`` found in the workspace
    (or current) directory, and the directory holding it."""
    if args.config:
        path: Path | None = Path(args.config)
        if not path.is_file():  # type: ignore[union-attr]
            raise ConfigError(f"--config {args.config}: no such file")
    else:
        path = find_config(args.workspace or os.getcwd())
    if path is None:
        return None, None
    sandbox = load_config(path)
    if not args.config:  # the repository's own file: a request, not the host's settings
        check_found_config(sandbox, path, provider_chosen=bool(args.provider))
    if args.provider and args.provider != sandbox.provider_name:
        sandbox = replace(sandbox, provider=args.provider, provider_config={})
    return sandbox, path.resolve().parent


async def _start(store: Store, args: argparse.Namespace, request: RunRequest) -> int:
    runner = Runner(store)
    record = await runner.start(request)
    if args.detach:
        record = await runner.detach(record.run_id)
        if args.json:
            print(json.dumps(record_json(record)))
        else:
            print(record.run_id)
        return 0
    _say(f"run {record.run_id} started (thread {record.thread_id}); "
         "Ctrl-C detaches, twice cancels")
    return await _follow(runner, record.run_id, 0, EventPrinter(args.json))


def _attach(args: argparse.Namespace) -> int:
    if args.after < 0:
        raise ConfigError("--after must be a log offset of 0 or more")

    async def attach(store: Store) -> int:
        if await store.get(args.run_id) is None:
            raise UnknownRun(args.run_id)
        return await _follow(Runner(store), args.run_id, args.after, EventPrinter(args.json))

    return with_store(args, attach)


async def _follow(
    runner: Runner, run_id: str, after: int, printer: Callable[[LoggedEvent], None]
) -> int:
    """Print the log from ``after`` while driving the run.

    SIGINT or SIGTERM stops driving between batches and detaches (the run goes on); a
    second SIGINT within two seconds cancels the run.
    """
    stop = anyio.Event()
    cancel = anyio.Event()
    show_scope = anyio.CancelScope()
    outcome: dict[str, Any] = {}

    async def drive() -> None:
        result = await runner.drive(run_id, stop=stop)
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
                        _say("detaching… press Ctrl-C again within 2 s to cancel the run")
                    elif signum == signal.SIGINT and (
                        time.monotonic() - outcome["at"] <= SECOND_SIGINT_WINDOW
                    ):
                        cancel.set()
                        return

            tg.start_soon(on_signals)
            async with anyio.create_task_group() as work:
                work.start_soon(drive)
                with show_scope:
                    async for logged in runner.events(run_id, after):
                        printer(logged)
            if outcome.get("signal") == signal.SIGINT and not cancel.is_set():
                remaining = SECOND_SIGINT_WINDOW - (time.monotonic() - outcome["at"])
                with anyio.move_on_after(max(0.0, remaining)):
                    await cancel.wait()
            tg.cancel_scope.cancel()

    if cancel.is_set():
        with anyio.CancelScope(shield=True):
            cancelled = await runner.cancel(run_id)
        _say(f"run {run_id} cancelled ({cancelled.status.value})")
        return 130
    result: DriveResult | None = outcome.get("drive")
    if result is not None and result.detached and not result.record.terminal:
        _say(f"detached; the run goes on. Watch again: corral attach {run_id}   "
             f"Cancel: corral cancel {run_id}")
        return 130
    final = await runner.store.get(run_id)
    return exit_code_for(final) if final is not None else 1


def _cancel(args: argparse.Namespace) -> int:
    async def cancel(store: Store) -> RunRecord:
        return await Runner(store).cancel(args.run_id)

    record = with_store(args, cancel)
    _say(f"run {record.run_id}: {record.status.value}")
    return 0


def _ls(args: argparse.Namespace) -> int:
    async def listed(store: Store) -> list[RunRecord]:
        if args.thread:
            runs = list(reversed(await store.list_by_thread(args.thread)))
            if args.status:
                runs = [r for r in runs if r.status.value == args.status]
            return runs[: args.limit]
        status = RunStatus(args.status) if args.status else None
        return await store.list_runs(status=status, limit=args.limit)

    runs = with_store(args, listed)
    if args.json:
        print(json.dumps([record_json(r) for r in runs]))
        return 0
    rows = [("RUN_ID", "THREAD", "STATUS", "EXIT", "STARTED", "DETACHED")]
    for r in runs:
        rows.append((
            r.run_id,
            r.thread_id,
            r.status.value + (" (cancel requested)" if r.cancel_requested and not r.terminal else ""),
            "" if r.exit_code is None else str(r.exit_code),
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.started_at)),
            "yes" if r.detached_since is not None else "",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _show(args: argparse.Namespace) -> int:
    found = with_store(args, lambda store: store.get(args.run_id))
    if found is None:
        raise UnknownRun(args.run_id)
    record = found
    data = record_json(record)
    if args.json:
        print(json.dumps(data))
    else:
        for key, value in data.items():
            print(f"{key:17} {'' if value is None else value}")
    return 0


def _say(text: str) -> None:
    print(f"corral: {text}", file=sys.stderr, flush=True)
