"""``corral mcp``: corral's run tools for MCP clients, on stdio.

An MCP client (a chat app, an agent) starts this command and gets tools to start a run or
a thread turn in a sandbox, read its events page by page, answer its approvals, cancel it,
and list runs and threads. Runs it starts are driven by this process; when the client goes
they detach and go on (``corral attach`` follows one again). ``corral serve`` offers the
same tools over HTTP at ``/mcp``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import anyio

from corral._cmdline import add_store_option
from corral._errors import ConfigError
from corral.server._config import ServerConfig, load_config_file
from corral.server._mcp_tools import CorralMcp
from corral.server._service import RunService
from corral.server._sse import encode_event

__all__ = ["mcp", "mcp_arguments"]


def mcp_arguments(p: argparse.ArgumentParser) -> None:
    """``corral mcp``'s parser."""
    p.description = __doc__.split("\n\n", 1)[1] if __doc__ else None
    add_store_option(p)
    p.add_argument("--config", metavar="FILE",
                   help="TOML file naming sandboxes and what runs may use (the format of "
                   "corral serve --config)")
    p.add_argument("--workspace-root", action="append", metavar="DIR",
                   help="a run's workspace must lie under DIR (repeatable; default: the "
                   "file's workspace_roots, else the current directory)")
    p.set_defaults(func=mcp)


def mcp(args: argparse.Namespace) -> int:
    extra: dict[str, Any] = load_config_file(args.config) if args.config else {}
    roots = args.workspace_root or extra.get("workspace_roots") or [os.getcwd()]
    for root in roots:
        if not os.path.isdir(root):
            raise ConfigError(f"--workspace-root {root}: not a directory")
    extra["workspace_roots"] = tuple(os.path.realpath(r) for r in roots)
    config = ServerConfig(store_url=args.store, reaper=False, **extra)
    config.validate()
    service = RunService(config, encode_event)

    async def main() -> None:
        async with service.running():
            await CorralMcp(service).serve_stdio()

    anyio.run(main)
    return 0
