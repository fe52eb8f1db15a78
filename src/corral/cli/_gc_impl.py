"""``corral gc``: destroy sandboxes idle past their keep_alive, then free the checkpoint
chunks no checkpoint names (the parser is in :mod:`corral.cli._gc_cmd`)."""

from __future__ import annotations

import argparse
import json

from corral.cli._store import with_store
from corral.sandbox._gc import GcReport, collect_idle
from corral.stores._protocols import Store

__all__ = ["handler"]


def handler(args: argparse.Namespace) -> int:
    async def collect(store: Store) -> GcReport:
        return await collect_idle(store, dry_run=args.dry_run, limit=args.limit,
                                  orphan_grace=args.orphan_grace)

    report = with_store(args, collect)
    if args.json:  # one answer: one document, also when nothing was done
        print(json.dumps({
            "dry_run": bool(args.dry_run),
            "entries": [{"key": e.key, "provider": e.provider, "sandbox": e.sandbox_id,
                         "outcome": e.outcome, "detail": e.detail} for e in report.entries],
            "counts": dict(sorted(report.counts.items())),
            "chunks": report.chunks,
        }))
    else:
        for e in report.entries:
            print(f"{e.outcome:15} {e.provider}/{e.sandbox_id} {e.detail}".rstrip())
        summary = ", ".join(f"{n} {k}" for k, n in sorted(report.counts.items())) or "nothing idle"
        if report.chunks:
            summary += f"; {report.chunks} checkpoint chunk(s) no checkpoint names freed"
        print(f"gc: {summary}")
    return 1 if report.counts.get("destroy-failed") else 0
