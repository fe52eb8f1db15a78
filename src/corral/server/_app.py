"""The ASGI app: :func:`create_app` composes the routers (``_routes_*``: the ``/v1`` JSON
API, AG-UI, ``/mcp``, the page) over one :class:`RunService` kept in ``app.state``, the
JSON error answers (``_http_errors``) and the request guard (``_guard``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Final

from fastapi import APIRouter, Depends, FastAPI
from fastapi.params import Depends as DependsParam
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from corral._version import __version__
from corral.runs._runner import Runner
from corral.server._config import ServerConfig
from corral.server._guard import Guard
from corral.server._http_errors import add_error_handlers
from corral.server._routes_agui import router as agui_routes
from corral.server._routes_approvals import router as approval_routes
from corral.server._routes_events import router as event_routes
from corral.server._routes_harnesses import router as harness_routes
from corral.server._routes_mcp import McpEndpoint
from corral.server._routes_mcp import router as mcp_routes
from corral.server._routes_page import STATIC, documented_openapi
from corral.server._routes_page import router as page_routes
from corral.server._routes_runs import router as run_routes
from corral.server._routes_threads import router as thread_routes
from corral.server._service import RunService
from corral.server._sse import encode_event

__all__ = ["CorralApp", "create_app"]

ROUTERS: Final[tuple[APIRouter, ...]] = (
    run_routes, agui_routes, approval_routes, harness_routes, thread_routes, event_routes,
    mcp_routes, page_routes)
"""Every route of the app, by resource (a ``_routes_*`` module each), in the order of the
OpenAPI schema."""


class CorralApp(Guard):
    """corral's ASGI application: the API, the AG-UI endpoint and the page, behind the
    request guard. Serve it alone (its ASGI lifespan runs :meth:`running`) or mount it in
    another Starlette/FastAPI app under a prefix; Starlette does not run a mounted app's
    lifespan, so enter :meth:`running` from the host app's own lifespan."""

    def __init__(self, app: ASGIApp, service: RunService, *, auth: bool,
                 running: Callable[[], AbstractAsyncContextManager[RunService]] | None = None
                 ) -> None:
        config = service.config
        super().__init__(app, token=config.token, max_body=config.max_body,
                         loopback_only=not auth)
        self.service = service
        self._running = running or service.running

    def running(self) -> AbstractAsyncContextManager[RunService]:
        """Open the store (unless the runner brought one), start the background work (the
        reaper loop when configured, presence, the MCP endpoint), and on exit detach every
        drive."""
        return self._running()


def create_app(
    service: RunService | None = None,
    *,
    runner: Runner | None = None,
    auth: Callable[..., Any] | None = None,
    config: ServerConfig | None = None,
) -> CorralApp:
    """corral's ASGI app. ``corral serve`` serves one; a web app mounts one::

        corral_app = create_app(runner=Runner(store), auth=current_user)

        @asynccontextmanager
        async def lifespan(app: FastAPI) -> AsyncIterator[None]:
            async with corral_app.running():
                yield

        app = FastAPI(lifespan=lifespan)
        app.mount("/corral", corral_app)

    ``runner`` drives the runs (its store is the app's); without one the app opens
    ``config.store_url`` itself. ``auth`` is the host app's authentication, as a FastAPI
    dependency (a callable taking a ``Request``, or any dependency FastAPI can resolve): it
    runs for every request and refuses one by raising ``HTTPException`` or by returning
    ``False`` (401). With ``auth`` the app answers any Host name (the host app decides who
    gets in); ``config`` holds the rest (sandboxes the API may name, limits, the reaper).
    Nothing is global: two apps in one process share nothing but what they are given.
    """
    if service is None:
        service = RunService(config or ServerConfig(), encode_event, runner=runner)
    elif runner is not None or config is not None:
        raise TypeError("create_app: give a service, or runner/config, not both")
    mcp = McpEndpoint(service)

    @asynccontextmanager
    async def running() -> AsyncIterator[RunService]:
        async with service.running(), mcp.serving():
            yield service

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with running():
            yield

    app = FastAPI(title="corral", version=__version__,
                  description="Durable coding-agent runs in sandboxes, streamed as AG-UI "
                  "events.", docs_url=None, redoc_url=None,
                  openapi_url=None,  # a route of the app (_routes_page): `auth` covers it
                  lifespan=lifespan, dependencies=_authorized_by(auth))
    app.state.service, app.state.mcp = service, mcp
    add_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.openapi = documented_openapi(app, service.config.token)  # type: ignore[method-assign]
    return CorralApp(app, service, auth=auth is not None, running=running)


def _authorized_by(auth: Callable[..., Any] | None) -> list[DependsParam]:
    """The app's dependencies: the host app's ``auth``, returning ``False`` meaning 401."""
    if auth is None:
        return []

    async def authorized(allowed: Any = Depends(auth)) -> None:
        if allowed is False:
            raise StarletteHTTPException(401, "not authorized by the application")

    return [Depends(authorized)]
