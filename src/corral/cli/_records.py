"""``corral ls``, and runs' records as JSON and as text for a person (what ``ls``, ``show``
and ``run --json`` print).

A listing of a current SQLite store is read with plain ``sqlite3``
(:func:`corral.stores._sqlite_tables.peek_runs`): no event loop and no store object, whose
imports would be most of the command's start-up. Any other store, or a SQLite file that needs
creating or migrating, is opened as every command opens it.

The text is as ``docker ps`` and ``gh run view`` show it: local times with their zone,
"3 min ago", durations, the command (or the harness of an agent run) cut to fit, columns
aligned. Standard library only, beside the records.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from corral.stores._records import RunRecord, RunStatus
from corral.stores._sqlite_tables import newest_of_thread, peek_runs

if TYPE_CHECKING:
    from corral.stores._protocols import Store

__all__ = ["SHOW_KEYS", "ago", "command_of", "duration_text", "local_time", "ls",
           "ls_table", "record_json", "show_text", "usage_lines"]

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


def record_json(record: RunRecord) -> dict[str, Any]:
    """A run record as the CLI prints it in JSON."""
    data = record.to_dict()
    out = {key: data.get(key) for key in SHOW_KEYS}
    out["cancel_requested"] = bool(out["cancel_requested"])
    out["driver_epoch"] = record.driver_epoch
    for key in ("harness", "usage", "sandbox_ref", "output", "checkpoint", "undone_at",
                "warnings"):
        if data.get(key) is not None:
            out[key] = data[key]
    return out


def _listed(args: argparse.Namespace) -> list[RunRecord]:
    status = RunStatus(args.status) if args.status else None
    if 1 <= args.limit <= 10_000:  # else the store names the limit's range
        from corral.stores._url import default_store_url, sqlite_location  # light: start-up

        location = sqlite_location(args.store or default_store_url())
        if location is not None:
            runs = peek_runs(location[0], thread=args.thread or None, status=status,
                             limit=args.limit)
            if runs is not None:
                return runs

    async def listed(store: Store) -> list[RunRecord]:
        if args.thread:
            return newest_of_thread(await store.list_by_thread(args.thread), status,
                                    args.limit)
        return await store.list_runs(status=status, limit=args.limit)

    # only now: the store layer and anyio are most of the start-up the sqlite3 peek avoids
    from corral.cli._store import with_store

    return with_store(args, listed)


def ls(args: argparse.Namespace) -> int:
    """Print the runs (a table, or ``--json``), newest first."""
    runs = _listed(args)
    if args.json:
        print(json.dumps([record_json(r) for r in runs]))
        return 0
    for line in ls_table(runs):
        print(line)
    return 0


def local_time(epoch: float) -> str:
    """``2026-05-04 14:03:07 CEST``: the local time with its zone."""
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(epoch))


def ago(epoch: float, now: float) -> str:
    """``12 s ago``, ``3 min ago``, ``2 h ago``, ``4 days ago``."""
    delta = max(0.0, now - epoch)
    if delta < 60:
        return f"{int(delta)} s ago"
    if delta < 3600:
        return f"{int(delta // 60)} min ago"
    if delta < 86400:
        return f"{int(delta // 3600)} h ago"
    days = int(delta // 86400)
    return f"{days} day{'s' if days != 1 else ''} ago"


def duration_text(seconds: float) -> str:
    """``0.4 s``, ``12 s``, ``3 min 20 s``, ``2 h 5 min``."""
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{int(seconds)} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    return f"{minutes // 60} h {minutes % 60} min"


def command_of(record: RunRecord) -> str:
    """What the run runs: its command line, or ``HARNESS agent`` (the prompt is in the log,
    not the record)."""
    spec = record.spec or {}
    argv = spec.get("argv")
    if isinstance(argv, list) and argv and (record.harness in (None, "command")):
        return shlex.join(str(a) for a in argv)
    harness = record.harness or "command"
    options = spec.get("harness_options")
    model = options.get("model") if isinstance(options, dict) else None
    agent = options.get("agent") if isinstance(options, dict) else None
    detail = " ".join(str(x) for x in (agent, model) if x)
    return f"[{harness}{' ' + detail if detail else ''}]"


def _elapsed(record: RunRecord, now: float) -> str:
    end = record.finished_at if record.finished_at is not None else (
        None if record.terminal else now)
    return "" if end is None else duration_text(end - record.started_at)


def _cut(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: max(1, width - 1)] + "…"


def ls_table(runs: Sequence[RunRecord], now: float | None = None,
             width: int | None = None) -> list[str]:
    """The ``corral ls`` table's lines: the header always (an empty list still has one)."""
    now = time.time() if now is None else now
    if width is None:
        width = shutil.get_terminal_size((120, 24)).columns if os.isatty(1) else 200
    rows: list[list[str]] = [["RUN_ID", "THREAD", "STATUS", "EXIT", "STARTED", "DURATION",
                              "COMMAND"]]
    for r in runs:
        status = r.status.value
        if r.cancel_requested and not r.terminal:
            status += " (cancel requested)"
        elif r.detached_since is not None and not r.terminal:
            status += " (detached)"
        rows.append([r.run_id, r.thread_id, status,
                     "" if r.exit_code is None else str(r.exit_code),
                     ago(r.started_at, now), _elapsed(r, now), command_of(r)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    room = max(20, width - sum(widths) - 2 * len(widths))
    return ["  ".join([*(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)),
                       _cut(row[-1], room)]).rstrip() for row in rows]


def show_text(record: RunRecord, usage_lines: Sequence[str],
              now: float | None = None) -> list[str]:
    """``corral show``'s lines: what ran, how it ended, when, for how long, on what."""
    now = time.time() if now is None else now
    status = record.status.value
    if record.exit_code is not None:
        status += f" (exit {record.exit_code})"
    lines = [f"run {record.run_id}: {status}"]

    def field(name: str, value: Any) -> None:
        lines.append(f"  {name:<17} {value}")

    field("thread", record.thread_id)
    field("command", command_of(record))
    if record.harness and record.harness != "command":
        field("harness", record.harness)
    field("started", f"{local_time(record.started_at)} ({ago(record.started_at, now)})")
    if record.finished_at is not None:
        field("finished", f"{local_time(record.finished_at)} "
                          f"(took {duration_text(record.finished_at - record.started_at)})")
    elif not record.terminal:
        field("running for", duration_text(now - record.started_at))
    if record.error is not None:
        field("error", _cut(record.error.message, 400)
              + (f" [{record.error.code}]" if record.error.code else ""))
    for warning in record.warnings or ():
        field("warning", _cut(str(warning.get("message", "")), 400)
              + f" [{warning.get('code')}]")
    if record.detached_since is not None and not record.terminal:
        field("detached", f"since {local_time(record.detached_since)} "
                          f"(corral attach {record.run_id})")
    if record.cancel_requested and not record.terminal:
        field("cancel", "requested")
    ref = record.sandbox_ref or {}
    if ref:
        field("sandbox", f"{ref.get('provider', '?')} {ref.get('id', '?')}")
    for line in usage_lines:
        lines.append("  " + line)
    return lines


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
