"""``corral ls``, and the record fields ``ls --json``, ``show`` and ``run --json`` print.

A listing of a current SQLite store is read with plain ``sqlite3``
(:func:`corral.stores._sqlite_tables.peek_runs`): no event loop and no store object, whose
imports would be most of the command's start-up. Any other store, or a SQLite file that needs
creating or migrating, is opened as every command opens it.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from corral.stores._records import RunRecord, RunStatus
from corral.stores._sqlite_tables import newest_of_thread, peek_runs

if TYPE_CHECKING:
    from corral.stores._protocols import Store

__all__ = ["SHOW_KEYS", "ls", "record_json"]

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
    for key in ("harness", "usage", "sandbox_ref", "output", "checkpoint", "undone_at"):
        if data.get(key) is not None:
            out[key] = data[key]
    return out


def _listed(args: argparse.Namespace) -> list[RunRecord]:
    status = RunStatus(args.status) if args.status else None
    if 1 <= args.limit <= 10_000:  # else the store names the limit's range
        from corral.stores._url import default_store_url, sqlite_location

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

    from corral.cli._store import with_store

    return with_store(args, listed)


def ls(args: argparse.Namespace) -> int:
    """Print the runs (a table, or ``--json``), newest first."""
    runs = _listed(args)
    if args.json:
        print(json.dumps([record_json(r) for r in runs]))
        return 0
    from corral.cli._run_text import ls_table

    for line in ls_table(runs):
        print(line)
    return 0
