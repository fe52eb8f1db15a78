"""What corral's routers share: the app's :class:`RunService` as a FastAPI dependency (each
app keeps its own in ``app.state``, so two apps in one process share nothing), the prefix
the app is mounted under, a route's raw ASGI answer (the event streams, ``/mcp``), the
resume point a ``Last-Event-ID`` header names, the OpenAPI schema of one server-sent event,
and the package's static files (the page and the API reference)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Annotated, Final

from fastapi import Depends, Request
from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from corral.server._requests import ApiError
from corral.server._service import RunService

__all__ = ["SSE_EVENT", "STATIC", "Asgi", "Service", "http_attrs", "prefix_of",
           "resume_point"]

STATIC: Final = Path(str(resources.files("corral.server") / "static"))


def _service(request: Request) -> RunService:
    """The service of the app answering ``request`` (``create_app`` puts it there)."""
    service: RunService = request.app.state.service
    return service


Service = Annotated[RunService, Depends(_service)]
"""A route's parameter for its app's service."""

SSE_EVENT: Final = {
    "type": "object",
    "description": "one server-sent event",
    "properties": {
        "id": {"type": "string", "description": "the event's log offset"},
        "data": {"type": "string", "description": "the AG-UI event (JSON)"},
        "retry": {"type": "integer"},
    },
    "required": ["data"],
}


def http_attrs(request: Request) -> dict[str, str]:
    """The HTTP server span's attributes (OpenTelemetry semantic conventions)."""
    return {"http.request.method": request.method, "url.path": request.url.path}


def prefix_of(request: Request) -> str:
    """The prefix the app is mounted under (``""`` when served alone)."""
    return str(request.scope.get("root_path", ""))


def resume_point(last_event_id: str | None, default: int = 0) -> int:
    """The log offset a ``Last-Event-ID`` header names (``default`` without one)."""
    if last_event_id is None or not last_event_id.strip():
        return default
    raw = last_event_id.strip()
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise ApiError(400, "invalid_last_event_id",
                       f"Last-Event-ID must be a log offset (a whole number), got {raw!r}")
    return int(raw)


class Asgi(Response):
    """Lets a route return a raw ASGI callable (the event stream)."""

    def __init__(self, inner: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        super().__init__()
        self.inner = inner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.inner(scope, receive, send)
