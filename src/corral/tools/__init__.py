"""Host tools: the application's Python functions, offered to the agent.

:func:`tool` and :class:`Toolset` define them (the schema comes from type hints or a pydantic
model); :class:`HostToolServer` serves a toolset to one run as the MCP server ``corral``;
:class:`Approvals` gates "ask" tools until ``corral approve`` answers (the requests and
answers live in the run's store, so any host sharing it can answer).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral._lazy import lazy_exports

if TYPE_CHECKING:
    from corral.tools._approvals import (
        ApprovalError,
        Approvals,
        answer_approval,
        list_pending,
    )
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
    from corral.tools._mcp_server import HostToolServer
    from corral.tools._permission import PermissionPromptTool
    from corral.tools._projection import run_tools_token
    from corral.tools._remote import (
        RemoteToolError,
        ToolDeniedError,
        ToolTimeoutError,
        execute_host_tool,
    )

# Names resolve on first use (corral._lazy).
_EXPORTS: dict[str, str] = {
    "ApprovalError": "corral.tools._approvals",
    "Approvals": "corral.tools._approvals",
    "answer_approval": "corral.tools._approvals",
    "list_pending": "corral.tools._approvals",
    "HostTool": "corral.tools._core",
    "ToolArgumentsError": "corral.tools._core",
    "ToolContext": "corral.tools._core",
    "ToolError": "corral.tools._core",
    "ToolLike": "corral.tools._core",
    "Toolset": "corral.tools._core",
    "UnknownToolError": "corral.tools._core",
    "result_text": "corral.tools._core",
    "tool": "corral.tools._core",
    "HostToolServer": "corral.tools._mcp_server",
    "PermissionPromptTool": "corral.tools._permission",
    "run_tools_token": "corral.tools._projection",
    "RemoteToolError": "corral.tools._remote",
    "ToolDeniedError": "corral.tools._remote",
    "ToolTimeoutError": "corral.tools._remote",
    "execute_host_tool": "corral.tools._remote",
}

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

__all__ = [
    "ApprovalError",
    "Approvals",
    "HostTool",
    "HostToolServer",
    "PermissionPromptTool",
    "RemoteToolError",
    "ToolArgumentsError",
    "ToolContext",
    "ToolDeniedError",
    "ToolError",
    "ToolLike",
    "ToolTimeoutError",
    "Toolset",
    "UnknownToolError",
    "answer_approval",
    "execute_host_tool",
    "list_pending",
    "result_text",
    "run_tools_token",
    "tool",
]
