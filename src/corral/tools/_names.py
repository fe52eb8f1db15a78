"""The names a run's MCP server is known by, apart from the server itself: what projects it
into an agent CLI's config needs these two strings, not the MCP SDK the server loads."""

from __future__ import annotations

__all__ = ["MCP_PATH", "SERVER_NAME"]

SERVER_NAME = "corral"
"""The MCP server's name in every agent CLI's config."""
MCP_PATH = "/mcp"
"""Where the server answers (streamable HTTP)."""
