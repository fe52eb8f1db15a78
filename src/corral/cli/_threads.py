"""``corral threads ls|show|undo|fork|rm``: threads listed, shown, undone, forked and
removed, over :class:`corral.Threads`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from corral._errors import ConfigError
from corral.cli._store import with_store
from corral.runs._runner import Runner
from corral.runs._threads import ThreadDetail, ThreadSummary
from corral.stores._protocols import Store

__all__ = ["run_fork", "run_ls", "run_rm", "run_show", "run_undo"]


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def run_ls(args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= 10_000:
        raise ConfigError(f"--limit must be between 1 and 10000, got {args.limit}")

    async def ls(store: Store) -> list[ThreadSummary]:
        return await Runner(store).threads.list(limit=args.limit)

    threads = with_store(args, ls)
    if args.json:
        _print_json([t.to_dict() for t in threads])
        return 0
    if not threads:
        print("no threads", file=sys.stderr)
        return 0
    rows = [("THREAD", "RUNS", "LAST STATUS", "LAST ACTIVITY", "HARNESS", "TITLE")]
    for t in threads:
        status = f"{t.last_status} (active)" if t.active_run else t.last_status
        rows.append((t.thread_id, str(t.runs), status, _when(t.last_activity),
                     t.harness or "-", t.title))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[5])
    return 0


def _print_detail(detail: ThreadDetail) -> None:
    print(f"thread {detail.thread_id}")
    head = detail.head
    print("runs:")
    for r in detail.runs:
        mark = " (undone)" if r.undone_at is not None else ""
        if any(w.get("code") == "session_lost" for w in r.warnings or ()):
            mark += " (started a new conversation)"
        note = ""
        if r.checkpoint:
            note = ("  checkpoint " + str(r.checkpoint["id"]) if "id" in r.checkpoint
                    else "  no checkpoint: " + str(r.checkpoint.get("error")
                                                    or r.checkpoint.get("skipped")))
        print(f"  {r.run_id}  {r.status.value}{mark}  {_when(r.started_at)}  "
              f"{detail.titles.get(r.run_id, '')}{note}")
    print("checkpoints:")
    for c in detail.checkpoints:
        cur = "  <- current" if head is not None and c.checkpoint_id == head.checkpoint_id \
            else ""
        after = f"after {c.run_id}" if c.run_id else "initial"
        print(f"  {c.checkpoint_id}  {after}  {c.total_bytes} bytes, {c.entry_count} "
              f"entries{', session' if c.has_session else ''}  {_when(c.created_at)}{cur}")
    for s in detail.sessions:
        print(f"session: {s.harness} {s.session_id or '-'} ({s.files} files, {s.size} bytes)")


def run_show(args: argparse.Namespace) -> int:
    async def show(store: Store) -> ThreadDetail:
        return await Runner(store).threads.show(args.thread)

    detail = with_store(args, show)
    if args.json:
        _print_json(detail.to_dict())
    else:
        _print_detail(detail)
    return 0


def run_undo(args: argparse.Namespace) -> int:
    async def undo(store: Store) -> ThreadDetail:
        return await Runner(store).threads.undo(args.thread)

    detail = with_store(args, undo)
    undone = [r for r in detail.runs if r.undone_at is not None]
    if args.json:
        _print_json(detail.to_dict())
    elif undone:
        last = max(undone, key=lambda r: r.undone_at or 0.0)
        print(f"corral: thread {args.thread}: run {last.run_id} undone; the workspace and "
              "conversation are as before it", file=sys.stderr)
    return 0


def run_fork(args: argparse.Namespace) -> int:
    async def fork(store: Store) -> ThreadDetail:
        return await Runner(store).threads.fork(args.thread, args.new, at=args.at)

    detail = with_store(args, fork)
    if args.json:
        _print_json(detail.to_dict())
    else:
        print(f"corral: thread {args.new} forked from {args.thread}"
              + (f" after run {args.at}" if args.at else "")
              + f"; run a turn with --thread {args.new}", file=sys.stderr)
    return 0


def run_rm(args: argparse.Namespace) -> int:
    async def rm(store: Store) -> dict[str, int]:
        return await Runner(store).threads.remove(args.thread, runs=args.runs)

    removed = with_store(args, rm)
    if args.json:
        _print_json({"thread_id": args.thread, **removed})
    else:
        runs = (f"{removed['runs']} run(s) with their logs" if args.runs
                else "its runs are kept")
        print(f"corral: thread {args.thread}: removed {removed['sessions']} saved "
              f"session(s), {removed['checkpoints']} checkpoint(s) ({removed['chunks']} "
              f"chunk(s) freed), {removed['sandboxes']} sandbox(es); {runs}",
              file=sys.stderr)
    return 0
