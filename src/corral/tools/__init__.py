"""Host tools for the agent: typed Python callables (:mod:`corral.tools._core`), remote-tool
helpers (:mod:`corral.tools._remote`), the per-run MCP server (:mod:`corral.tools._mcp_server`)
and approvals (:mod:`corral.tools._approvals`)."""

from corral.tools._core import (
    HostTool,
    ToolArgumentsError,
    ToolContext,
    ToolError,
    ToolLike,
    Toolset,
    UnknownToolError,
    result_text,
    tool,
)

__all__ = [
    "HostTool",
    "ToolArgumentsError",
    "ToolContext",
    "ToolError",
    "ToolLike",
    "Toolset",
    "UnknownToolError",
    "result_text",
    "tool",
]
