"""Runs as text for a person: the ``corral ls`` table and the ``corral show`` view.

As ``docker ps`` and ``gh run view`` show them: local times with their zone, "3 min ago",
durations, the command (or the harness of an agent run) cut to fit, columns aligned. The
machine form (``--json``) is :func:`corral.cli._ls_impl.record_json`, unchanged. Standard
library only: ``corral ls`` imports this on every call.
"""

from __future__ import annotations

import os
import shlex
import shutil
import time
from collections.abc import Sequence
from typing import Any

from corral.stores._records import RunRecord

__all__ = ["ago", "command_of", "duration_text", "local_time", "ls_table", "show_text"]


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
