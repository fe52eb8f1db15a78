"""``corral reap``: one reaper sweep (the cron entry point).

Finalizes detached runs whose agent exited, expires runs detached for at least ``--ttl``,
reclaims their sandboxes, and prunes journals of finished runs. Runs still producing (or
that cannot be judged) are left exactly as they are. Exit status: 0, or 1 when a run
``failed`` or its sandbox could not be reclaimed (``reclaim-failed``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any, Final, TextIO

import anyio

from corral._errors import ConfigError
from corral.runs._prune import PruneResult
from corral.runs._reap import DEFAULT_BUDGET, DEFAULT_MAX_RUNS, ReapOutcome, ReapResult
from corral.stores import open_store

DEFAULT_TTL: Final = "1h"
_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_PARTS: Final = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+")
_NUMBER: Final = re.compile(r"\d+(?:\.\d+)?")
_MAX_SECONDS: Final = 10 * 365 * 86400.0


def parse_duration(text: str, *, what: str = "duration") -> float:
    """Seconds in ``text``: a number with a unit (``30s``, ``5m``, ``1h``, ``2d``, ``500ms``),
    several of them (``1h30m``), or a bare number of seconds. Raises
    :class:`~corral._errors.ConfigError` naming the bad value and the accepted forms."""
    raw = text.strip().lower()
    seconds: float | None = None
    if _NUMBER.fullmatch(raw):
        seconds = float(raw)
    elif _PARTS.fullmatch(raw):
        seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(raw))
    if seconds is None:
        raise ConfigError(
            f"invalid {what} {text!r}: use a number with a unit, e.g. 30s, 5m, 1h, 2d or 1h30m"
        )
    if seconds > _MAX_SECONDS:
        raise ConfigError(f"invalid {what} {text!r}: longer than 10 years; use e.g. 30d")
    return seconds


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "reap",
        help="finalize or expire detached runs once and reclaim their sandboxes",
        description=(
            "One reaper sweep: runs whose viewer left and whose agent has exited are "
            "finalized; runs detached for at least --ttl are cancelled and ended; their "
            "sandboxes are destroyed. Runs still producing are not touched. Run it from cron."
        ),
    )
    p.add_argument("--ttl", default=DEFAULT_TTL, metavar="DURATION",
                   help=f"expire runs detached for at least this long (default {DEFAULT_TTL})")
    p.add_argument("--max-runs", type=_max_runs, default=DEFAULT_MAX_RUNS, metavar="N",
                   help=f"runs one sweep takes on (default {DEFAULT_MAX_RUNS})")
    p.add_argument("--budget", default=f"{DEFAULT_BUDGET:g}s", metavar="DURATION",
                   help=f"time one run's drive may take (default {DEFAULT_BUDGET:g}s)")
    p.add_argument("--store", metavar="URL", help="store URL (default: $CORRAL_STORE or SQLite)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=_reap)


def _max_runs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 10_000:
        raise argparse.ArgumentTypeError(f"must be a whole number from 0 to 10000, got {text!r}")
    return value


def _reap(args: argparse.Namespace) -> int:
    ttl = parse_duration(args.ttl, what="--ttl")
    budget = parse_duration(args.budget, what="--budget")
    if budget <= 0:
        raise ConfigError("--budget must be more than 0s")
    result, pruned = anyio.run(_sweep, args.store, ttl, args.max_runs, budget)
    if args.json:
        print(json.dumps(result.to_dict(), separators=(",", ":")))
    else:
        print_table(result, pruned, sys.stdout)
    bad = result.outcomes[ReapOutcome.FAILED] + result.outcomes[ReapOutcome.RECLAIM_FAILED]
    return 1 if bad else 0


async def _sweep(
    store_url: str | None, ttl: float, max_runs: int, budget: float
) -> tuple[ReapResult, PruneResult | None]:
    from corral.runs._runner import Runner

    store = await open_store(store_url)
    try:
        return await Runner(store).reap(ttl=ttl, max_runs=max_runs, budget=budget)
    finally:
        await store.aclose()


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
