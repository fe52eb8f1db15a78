"""``corral doctor``: the parser; :mod:`corral.cli._doctor_impl` runs it."""

from __future__ import annotations

import argparse

from corral.server._cmdline import add_store_option


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("doctor", help="check prerequisites and print fixes")
    add_store_option(p)
    p.add_argument("--json", action="store_true",
                   help="print one JSON document: {checks, not_in_this_version, ready}")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    # Lazy: the checks (anyio, the providers) load when `corral doctor` runs.
    from corral.cli._doctor_impl import run

    return run(args)
