"""One MCP server per run, named ``corral``, exposing a :class:`Toolset` to the agent.

Served on a unix socket on the host (in the run's socket directory, which the sandbox
sees at ``/run/corral``); the in-sandbox forwarder exposes it to the CLI at
``http://127.0.0.1:{corral.port.tools}/mcp``. The transport is the MCP SDK's Streamable
HTTP (stateless, JSON responses), behind :class:`corral.tools._asgi.RequestGuard`: a per-run
bearer token (constant-time compare, 401) and a body limit (413) are checked before the
MCP layer or any tool runs. Each call has a timeout; "ask" tools wait for an approval
(:mod:`corral.tools._approvals`) first. A tool's failure, denial or timeout comes back to
the agent as an ``isError`` result with the reason as text.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.transport_security import TransportSecuritySettings

from corral.tools._names import MCP_PATH, SERVER_NAME
from corral.tools._asgi import RequestGuard, serve_unix
from corral.tools._core import ToolContext, ToolError, Toolset, result_text
from corral.tools._remote import ApprovalGate, execute_host_tool

__all__ = ["MCP_PATH", "SERVER_NAME", "HostToolServer"]


class HostToolServer:
    """The MCP server of one run. ``token`` defaults to a fresh random one; keep it out of
    argv, logs and the workspace (see :mod:`corral.tools._projection`)."""

    def __init__(self, toolset: Toolset, *, token: str | None = None,
                 run_id: str | None = None, approvals: ApprovalGate | None = None,
                 call_timeout: float | None = 60.0, max_body: int = 1 << 20,
                 name: str = SERVER_NAME) -> None:
        self.toolset = toolset
        self.token = token or secrets.token_urlsafe(32)
        self.run_id = run_id
        self.approvals = approvals
        self.call_timeout = call_timeout
        self.max_body = max_body
        self.name = name
        self.calls = 0
        """Tool calls that reached a tool (after auth, size and argument checks)."""
        self._guard: RequestGuard | None = None

    def __repr__(self) -> str:
        return f"HostToolServer({self.name!r}, run_id={self.run_id!r}, tools={len(self.toolset)})"

    @property
    def refused(self) -> int:
        """Requests refused before reaching MCP (bad token, too large)."""
        return self._guard.refused if self._guard is not None else 0

    def _mcp(self) -> Server[Any]:
        async def list_tools(ctx: ServerRequestContext[Any],
                             params: types.PaginatedRequestParams | None
                             ) -> types.ListToolsResult:
            return types.ListToolsResult(tools=[
                types.Tool(name=t.name, description=t.description or None,
                           input_schema=t.input_schema)
                for t in self.toolset])

        async def call_tool(ctx: ServerRequestContext[Any],
                            params: types.CallToolRequestParams) -> types.CallToolResult:
            call_id = None if ctx.request_id is None else str(ctx.request_id)
            context = ToolContext(tool=params.name, run_id=self.run_id, call_id=call_id,
                                  tool_use_id=_tool_use_id(params.meta))
            try:
                value = await execute_host_tool(
                    self.toolset, {"name": params.name, "args": params.arguments or {}},
                    approvals=self.approvals, timeout=self.call_timeout, context=context)
            except ToolError as exc:
                return _error(str(exc))
            except Exception as exc:  # noqa: BLE001 - the tool's failure goes to the agent
                return _error(f"tool execution failed: {exc.__class__.__name__}: {exc}")
            self.calls += 1
            return types.CallToolResult(content=[types.TextContent(text=result_text(value))])

        return Server(self.name, version="1", on_list_tools=list_tools,
                      on_call_tool=call_tool)

    def asgi_app(self) -> RequestGuard:
        """The guarded ASGI app (one per server; it owns the MCP session manager)."""
        starlette = self._mcp().streamable_http_app(
            streamable_http_path=MCP_PATH, stateless_http=True, json_response=True,
            max_request_body_size=self.max_body,
            # Reached only over a unix socket (and the sandbox's own loopback); the bearer
            # token is the gate, and Host is whatever the forwarder's client sent.
            transport_security=TransportSecuritySettings(
                enable_dns_rebinding_protection=False),
        )
        self._guard = RequestGuard(starlette, token=self.token, max_body=self.max_body)
        return self._guard

    async def serve(self, socket_path: str | os.PathLike[str], *,
                    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                    ) -> None:
        """Serve on a unix socket until cancelled; ``task_status.started()`` once it
        listens. Use with ``await task_group.start(server.serve, path)``."""
        await serve_unix(self.asgi_app(), socket_path, task_status=task_status)


def _tool_use_id(meta: Any) -> str | None:
    """The agent's own id of the call, when its CLI sends one (Claude Code:
    ``_meta["claudecode/toolUseId"]``): the id its journal's tool call carries, so an
    approval or a frontend call names the call the client saw. Data only, bounded."""
    if not isinstance(meta, dict):
        return None
    value = meta.get("claudecode/toolUseId")
    if isinstance(value, str) and 0 < len(value) <= 200 and value.isprintable():
        return value
    return None


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)
