"""``corral gc``: destroy sandboxes idle past their keep_alive."""

from __future__ import annotations

import argparse
import json

from corral.cli._store import add_store_option, with_store
from corral.sandbox._gc import GcReport, collect_idle
from corral.stores._protocols import Store


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("gc", help="destroy sandboxes idle past their keep_alive")
    add_store_option(p)
    p.add_argument("--dry-run", action="store_true", help="list what would be destroyed")
    p.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=handler)


def handler(args: argparse.Namespace) -> int:
    async def collect(store: Store) -> GcReport:
        return await collect_idle(store, dry_run=args.dry_run, limit=args.limit)

    report = with_store(args, collect)
    if args.json:
        for e in report.entries:
            print(json.dumps({"key": e.key, "provider": e.provider, "sandbox": e.sandbox_id,
                              "outcome": e.outcome, "detail": e.detail}))  # fmt: skip
    else:
        for e in report.entries:
            print(f"{e.outcome:15} {e.provider}/{e.sandbox_id} {e.detail}".rstrip())
        summary = ", ".join(f"{n} {k}" for k, n in sorted(report.counts.items())) or "nothing idle"
        print(f"gc: {summary}")
    return 1 if report.counts.get("destroy-failed") else 0
