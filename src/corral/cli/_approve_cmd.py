"""``corral approve``: the parser; :mod:`corral.cli._approve_impl` answers or lists."""

from __future__ import annotations

import argparse
from typing import Any

from corral.server._cmdline import add_store_option


def register(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "approve", help="answer a pending host-tool approval of a run",
        description="Allow or deny a host tool call waiting for approval, or list them. "
                    "Approvals live in the store (--store, CORRAL_STORE): any host sharing "
                    "it can answer, wherever the run is driven.")
    p.add_argument("run_id", metavar="RUN_ID", help="the run that asks")
    p.add_argument("approval_id", metavar="APPROVAL_ID", nargs="?",
                   help="the approval to answer (see --list)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--allow", action="store_true", help="let the tool call run")
    g.add_argument("--deny", action="store_true", help="refuse the tool call")
    g.add_argument("--list", action="store_true", help="list pending approvals of the run")
    p.add_argument("--reason", help="a note passed to the agent with a denial")
    p.add_argument("--json", action="store_true",
                   help="with --list: one JSON object a line, with the HTTP API's fields "
                   "(approval_id, run_id, tool, args, created_at, expires_at)")
    add_store_option(p)
    p.set_defaults(func=_handler)


def _handler(args: argparse.Namespace) -> int:
    # Lazy: the host-tool approvals (and what they import) load when `corral approve` runs.
    from corral.cli._approve_impl import handler

    return handler(args)
