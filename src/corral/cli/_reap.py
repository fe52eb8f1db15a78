"""``corral reap``: one reaper sweep (the cron entry point).

Finalizes detached runs whose agent exited, expires runs detached for at least ``--ttl``,
reclaims their sandboxes, and prunes journals of finished runs. Runs still producing (or
that cannot be judged) are left exactly as they are. Exit status: 0, or 1 when a run
``failed`` or its sandbox could not be reclaimed (``reclaim-failed``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from corral._durations import parse_duration
from corral._errors import ConfigError
from corral.cli._store import with_store
from corral.journal._prune import PruneResult
from corral.runs._reap_sweep import ReapOutcome, ReapResult
from corral.runs._runner import Runner
from corral.stores._protocols import Store

__all__ = ["print_table", "reap"]


def reap(args: argparse.Namespace) -> int:
    ttl = parse_duration(args.ttl, what="--ttl")
    budget = parse_duration(args.budget, what="--budget")
    if budget <= 0:
        raise ConfigError("--budget must be more than 0s")
    async def sweep(store: Store) -> tuple[ReapResult, PruneResult | None]:
        return await Runner(store).reap(ttl=ttl, max_runs=args.max_runs, budget=budget)

    result, pruned = with_store(args, sweep)
    if args.json:
        print(json.dumps(result.to_dict(), separators=(",", ":")))
    else:
        print_table(result, pruned, sys.stdout)
    bad = result.outcomes[ReapOutcome.FAILED] + result.outcomes[ReapOutcome.RECLAIM_FAILED]
    return 1 if bad else 0


def print_table(result: ReapResult, pruned: PruneResult | None, out: TextIO) -> None:
    """The human-readable summary: one line per run, then the counts."""
    rows: list[tuple[str, ...]] = [("RUN", "OUTCOME", "STATUS", "EXIT", "NOTE")]
    for e in result.runs:
        note = e.error or ""
        if e.terminalized_anyway is not None:
            note = ("budget exceeded; " + note).rstrip("; ")
        rows.append((e.run_id, e.outcome.value, e.status.value if e.status else "-",
                     "-" if e.exit_code is None else str(e.exit_code), note[:120]))
    if len(rows) > 1:
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        for r in rows:
            cells = [c.ljust(w) for c, w in zip(r[:4], widths, strict=True)]
            print("  ".join([*cells, r[4]]).rstrip(), file=out)
    counts = ", ".join(f"{o.value} {n}" for o, n in result.outcomes.items() if n)
    summary: dict[str, Any] = {"considered": result.considered, "probed": result.probed}
    print(f"considered {summary['considered']}, probed {summary['probed']}"
          + (f": {counts}" if counts else ""), file=out)
    if pruned is not None and (pruned.deleted or pruned.failures):
        print(f"journals: deleted {len(pruned.deleted)}, kept {len(pruned.kept)}"
              + (f", {len(pruned.failures)} failure(s)" if pruned.failures else ""), file=out)
