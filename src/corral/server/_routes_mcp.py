"""``/mcp``: corral's MCP tools (:mod:`corral.server._mcp_tools`) over Streamable HTTP. A
route of the app, so a host app's ``auth`` dependency covers it; the guard checks the token,
Host and Origin as for ``/v1``. The endpoint is the app's own (``app.state.mcp``), there
while the app runs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request, Response
from starlette.types import Receive, Scope, Send

from corral.server._requests import ApiError
from corral.server._routing import Asgi

__all__ = ["router"]

router = APIRouter()


@router.api_route("/mcp", methods=["GET", "POST", "DELETE"], include_in_schema=False)
async def mcp(request: Request) -> Response:
    endpoint: Callable[[Scope, Receive, Send], Awaitable[None]] | None = request.app.state.mcp
    if endpoint is None:
        raise ApiError(503, "not_running", "the MCP endpoint is not running (enter "
                       "the app's running() context)")
    return Asgi(endpoint)
