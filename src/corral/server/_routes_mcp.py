"""``/mcp``: corral's MCP tools (:mod:`corral.server._mcp_tools`) over Streamable HTTP. A
route of the app, so a host app's ``auth`` dependency covers it; the guard checks the token,
Host and Origin as for ``/v1``. Each app has its own :class:`McpEndpoint` (in
``app.state.mcp``), serving while the app runs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request, Response
from starlette.types import Receive, Scope, Send

from corral.server._requests import ApiError
from corral.server._routing import Asgi
from corral.server._service import RunService

if TYPE_CHECKING:
    from corral.server._mcp_tools import CorralMcp

__all__ = ["McpEndpoint", "router"]

router = APIRouter()


class McpEndpoint:
    """One app's MCP endpoint: the tools over its service, an ASGI endpoint while
    :meth:`serving`."""

    def __init__(self, service: RunService) -> None:
        from corral.server._mcp_tools import CorralMcp  # the MCP SDK: with an app only

        self._tools: CorralMcp = CorralMcp(service)
        self.asgi: Callable[[Scope, Receive, Send], Awaitable[None]] | None = None

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """Serve the tools (Streamable HTTP) until the block ends."""
        async with self._tools.http() as endpoint:
            self.asgi = endpoint
            try:
                yield
            finally:
                self.asgi = None


@router.api_route("/mcp", methods=["GET", "POST", "DELETE"], include_in_schema=False)
async def mcp(request: Request) -> Response:
    endpoint: McpEndpoint = request.app.state.mcp
    if endpoint.asgi is None:
        raise ApiError(503, "not_running", "the MCP endpoint is not running (enter "
                       "the app's running() context)")
    return Asgi(endpoint.asgi)
