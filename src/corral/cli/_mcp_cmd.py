"""``corral mcp``: corral's run tools for MCP clients, on stdio.

An MCP client (a chat app, an agent) starts this command and gets tools to start a run or
a thread turn in a sandbox, read its events page by page, answer its approvals, cancel it,
and list runs and threads. Runs it starts are driven by this process; when the client goes
they detach and go on (``corral attach`` follows one again). ``corral serve`` offers the
same tools over HTTP at ``/mcp``.
"""

from __future__ import annotations

import argparse

from corral.cli._parser import arguments

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "mcp",
        help="serve corral's run tools to an MCP client on stdio",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    arguments(p, _arguments)
    p.set_defaults(func=_run)


def _arguments(p: argparse.ArgumentParser) -> None:
    from corral.server._cmdline import add_store_option

    add_store_option(p)
    p.add_argument("--config", metavar="FILE",
                   help="TOML file naming sandboxes and what runs may use (the format of "
                   "corral serve --config)")
    p.add_argument("--workspace-root", action="append", metavar="DIR",
                   help="a run's workspace must lie under DIR (repeatable; default: the "
                   "file's workspace_roots, else the current directory)")


def _run(args: argparse.Namespace) -> int:
    from corral.cli._mcp_impl import mcp

    return mcp(args)
