"""The ASGI app: :func:`create_app` composes one router per resource (``_routes_*``: runs,
events, approvals, threads, AG-UI, harnesses, ``/mcp``, the page) over the app's own
:class:`RunService` (in ``app.state``, taken by the routes as a dependency), the JSON error
answers (``_http_errors``) and the request guard (``_guard``, :class:`CorralApp`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

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
from corral.server._routing import STATIC
from corral.server._service import RunService
from corral.server._sse import encode_event

__all__ = ["CorralApp", "create_app"]


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
    from corral.server._mcp_tools import CorralMcp  # the MCP SDK: with the app only

    tools = CorralMcp(service)

    @asynccontextmanager
    async def running() -> AsyncIterator[RunService]:
        async with service.running(), tools.http() as app.state.mcp:
            try:
                yield service
            finally:
                app.state.mcp = None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with running():
            yield

    app = FastAPI(title="corral", version=__version__,
                  description="Durable coding-agent runs in sandboxes, streamed as AG-UI "
                  "events.", docs_url=None, redoc_url=None,
                  openapi_url=None,  # a route of the app (_routes_page): `auth` covers it
                  lifespan=lifespan, dependencies=_authorized_by(auth))
    app.state.service, app.state.mcp = service, None
    add_error_handlers(app)
    for router in _routers():
        app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.openapi = _documented_openapi(app, service.config.token)  # type: ignore[method-assign]
    return CorralApp(app, service, auth=auth is not None, running=running)


def _routers() -> tuple[APIRouter, ...]:
    """Every route of the app, by resource, in the order of the OpenAPI schema. Imported
    with the first app, not with this module: FastAPI builds a route's models where the
    route is declared (and imports pydantic.v1 for the first), and ``corral serve`` imports
    this module before it reads its arguments (``--help``, a refused configuration)."""
    from corral.server._routes_agui import router as agui  # start-up cost: when used
    from corral.server._routes_approvals import router as approvals
    from corral.server._routes_events import router as events
    from corral.server._routes_harnesses import router as harnesses
    from corral.server._routes_mcp import router as mcp
    from corral.server._routes_page import router as page
    from corral.server._routes_runs import router as runs
    from corral.server._routes_threads import router as threads

    return runs, agui, approvals, harnesses, threads, events, mcp, page


def _authorized_by(auth: Callable[..., Any] | None) -> list[DependsParam]:
    """The app's dependencies: the host app's ``auth``, returning ``False`` meaning 401."""
    if auth is None:
        return []

    async def authorized(allowed: Any = Depends(auth)) -> None:
        if allowed is False:
            raise StarletteHTTPException(401, "not authorized by the application")

    return [Depends(authorized)]


def _documented_openapi(app: FastAPI, token: str | None) -> Callable[[], dict[str, Any]]:
    """``app``'s schema builder, documenting the bearer token the guard checks on ``/v1/``
    when the server has one."""
    base = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = base()
            if token is not None:
                schema.setdefault("components", {})["securitySchemes"] = {
                    "bearer": {"type": "http", "scheme": "bearer",
                               "description": "the server's CORRAL_API_TOKEN"}
                }
                for path, item in schema.get("paths", {}).items():
                    if path.startswith("/v1/"):
                        for operation in item.values():
                            operation["security"] = [{"bearer": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    return openapi
