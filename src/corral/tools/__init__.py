"""Host tools: the application's Python functions, offered to the agent.

:func:`tool` and :class:`Toolset` define them (the schema comes from type hints or a pydantic
model); :class:`HostToolServer` serves a toolset to one run as the MCP server ``corral``;
:class:`Approvals` gates "ask" tools until ``corral approve`` answers (the requests and
answers live in the run's store, so any host sharing it can answer). The protocols a tool
object or an approval gate implements (``ToolLike``, ``ApprovalGate``) are in :mod:`corral.abc`.
"""

from __future__ import annotations

from corral._lazy import TYPE_CHECKING, lazy_namespace

# Protocols live in corral.abc only: their old names here resolve with a warning
_MOVED = {"ToolLike": "corral.abc"}

# The public names, listed once: resolved on first use (corral._lazy)
if TYPE_CHECKING or not lazy_namespace(globals(), moved=_MOVED):
    from corral.tools._approvals import (
        ApprovalError as ApprovalError,
        Approvals as Approvals,
        answer_approval as answer_approval,
        list_pending as list_pending,
    )
    from corral.tools._core import (
        HostTool as HostTool,
        ToolArgumentsError as ToolArgumentsError,
        ToolContext as ToolContext,
        ToolError as ToolError,
        Toolset as Toolset,
        UnknownToolError as UnknownToolError,
        result_text as result_text,
        tool as tool,
    )
    from corral.tools._mcp_server import HostToolServer as HostToolServer
    from corral.tools._permission import PermissionPromptTool as PermissionPromptTool
    from corral.tools._projection import run_tools_token as run_tools_token
    from corral.tools._remote import (
        RemoteToolError as RemoteToolError,
        ToolDeniedError as ToolDeniedError,
        ToolTimeoutError as ToolTimeoutError,
        execute_host_tool as execute_host_tool,
    )
