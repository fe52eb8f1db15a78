"""``corral acp``: corral as an ACP agent on stdio, for editors (Zed and every ACP client).

The editor starts this command and speaks the Agent Client Protocol on its stdin/stdout.
Each editor session is a corral thread; each prompt a durable run of the chosen harness in
a sandbox holding a copy of the session's directory (kept for the thread's next prompts).
Tool calls, file changes and permission requests (corral's ask rules) reach the editor.
Closing the editor detaches running runs; reopening the session (session/load) replays it
and follows a run still going.
"""

from __future__ import annotations

import argparse

from corral.cli._parser import arguments

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "acp",
        help="be an ACP agent on stdio (for editors)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    arguments(p, _arguments)
    p.set_defaults(func=_run)


def _arguments(p: argparse.ArgumentParser) -> None:
    from corral.server._cmdline import add_store_option

    p.add_argument("--harness", help="harness of the runs (default: [agent] harness of "
                   "--config, else claude-code; command runs each prompt with sh -c)")
    p.add_argument("--provider", help="sandbox provider: bubblewrap (default), docker or "
                   "local")
    p.add_argument("--model", metavar="M", help="model for agent harnesses")
    p.add_argument("--agent", metavar="NAME",
                   help="--harness acp: the ACP agent (gemini, opencode, claude)")
    p.add_argument("--config", metavar="PATH",
                   help="sandbox definition file (default: corral.toml in the session's "
                   "directory or its parents, read as the repository's request)")
    p.add_argument("--no-file-events", action="store_true",
                   help="do not show the files a run changes")
    add_store_option(p)


def _run(args: argparse.Namespace) -> int:
    from corral.cli._acp_impl import acp

    return acp(args)
