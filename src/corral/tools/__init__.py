"""Host tools for the agent: typed Python callables (:mod:`corral.tools.core`), remote-tool
helpers (:mod:`corral.tools.remote`), the per-run MCP server (:mod:`corral.tools.mcp_server`)
and approvals (:mod:`corral.tools.approvals`)."""

from corral.tools.core import (
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
