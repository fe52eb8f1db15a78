"""``corral gc``: the parser; :mod:`corral.cli._gc_impl` runs it."""

from __future__ import annotations

import argparse

from corral.server._cmdline import add_store_option


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("gc", help="destroy sandboxes idle past their keep_alive, and orphans "
                       "(labelled sandboxes no instance record points to); free checkpoint "
                       "chunks no checkpoint names")
    add_store_option(p)
    p.add_argument("--dry-run", action="store_true", help="list what would be destroyed")
    p.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    p.add_argument("--json", action="store_true", help="print one JSON document: {dry_run, entries, counts, chunks}")
    p.add_argument("--orphan-grace", type=float, default=600.0, metavar="SECONDS",
                   help="leave unrecorded sandboxes younger than this (default 600: one may "
                        "be being made)")
    p.set_defaults(func=_handler)


def _handler(args: argparse.Namespace) -> int:
    # Lazy: the sandbox layer and the providers load when `corral gc` runs.
    from corral.cli._gc_impl import handler

    return handler(args)
