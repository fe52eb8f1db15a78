"""``corral reap``: the parser; :mod:`corral.cli._reap_impl` sweeps."""

from __future__ import annotations

import argparse
from typing import Final

from corral.cli._parser import arguments
from corral.server._cmdline import add_store_option

DEFAULT_TTL: Final = "1h"

__all__ = ["DEFAULT_TTL", "register"]


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
    arguments(p, _arguments)
    p.set_defaults(func=_reap)


def _arguments(p: argparse.ArgumentParser) -> None:
    # Lazy: the reaper's defaults live with the reaper (corral.runs), which `corral reap`
    # alone needs; its options are declared when its parser is used.
    from corral.runs._reap_sweep import DEFAULT_BUDGET, DEFAULT_MAX_RUNS

    p.add_argument("--ttl", default=DEFAULT_TTL, metavar="DURATION",
                   help=f"expire runs detached for at least this long (default {DEFAULT_TTL})")
    p.add_argument("--max-runs", type=_max_runs, default=DEFAULT_MAX_RUNS, metavar="N",
                   help=f"runs one sweep takes on (default {DEFAULT_MAX_RUNS})")
    p.add_argument("--budget", default=f"{DEFAULT_BUDGET:g}s", metavar="DURATION",
                   help=f"time one run's drive may take (default {DEFAULT_BUDGET:g}s)")
    add_store_option(p)
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


def _max_runs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 10_000:
        raise argparse.ArgumentTypeError(f"must be a whole number from 0 to 10000, got {text!r}")
    return value


def _reap(args: argparse.Namespace) -> int:
    # Lazy: the runner loads when `corral reap` runs, not for every command's parser.
    from corral.cli._reap_impl import reap

    return reap(args)
