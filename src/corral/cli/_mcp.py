"""``corral mcp``: corral's run tools for MCP clients, on stdio.

The tools are :class:`corral.server._mcp_tools.CorralMcp`'s, over a run service this
process drives. What a user reads about it is ``corral mcp --help``
(:func:`corral.cli._arguments.mcp_arguments`).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import anyio

from corral._errors import ConfigError
from corral.server._config import ServerConfig, load_config_file
from corral.server._mcp_tools import CorralMcp
from corral.server._service import RunService
from corral.server._sse import encode_event

__all__ = ["mcp"]


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
