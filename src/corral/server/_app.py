"""The ASGI app: the ``/v1`` JSON API, the event stream and the web page."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib import resources
from pathlib import Path
from dataclasses import replace
from typing import Annotated, Any, Final

import anyio.to_thread
from ag_ui.core import RunAgentInput
from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from corral._log import library_logger
from corral._telemetry import context_of, span
from corral._version import __version__
from corral._errors import ConfigError, CorralError, PrerequisiteMissing
from corral.tools._output import SUBMIT_TOOL
from corral.harness._registry import harness_names
from corral.stores._records import RunStatus
from corral.sandbox._contracts import UnsupportedCapability
from corral.runs._runner import Runner, RunRequest, RunStartError
from corral.runs._threads import ThreadBusy, ThreadError, UnknownThread
from corral.stores._protocols import RunExists, UnknownRun
from corral.server._agui import AguiInputError, answers_of, frontend_descriptors, start_body
from corral.server._agui_answer import apply_answers
from corral.server._agui_runs import Segments
from corral.server._config import ServerConfig
from corral.server._guard import Guard
from corral.server._requests import ApiError, request_for, resolve_sandbox
from corral.server._models import (
    ApprovalAnswer,
    ApprovalList,
    ApprovalOut,
    ApprovalResult,
    ErrorBody,
    ForkBody,
    HarnessList,
    HarnessUnavailable,
    RunCreated,
    RunList,
    RunOut,
    StartRun,
    ThreadList,
    ThreadOut,
    ThreadRemoved,
    events_url,
)
from corral.server._service import RunService, TooManyRuns
from corral.server._sse import EventStream, encode_event
from corral.tools._approvals import ApprovalError, answer_approval, list_pending
from corral.tools._permission import PERMISSION_TOOL

log = library_logger("corral.server._app")

STATIC: Final = Path(str(resources.files("corral.server") / "static"))
_ERROR_CODES: Final = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "body_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "too_many_runs",
}


_SSE_EVENT: Final = {
    "type": "object",
    "description": "one server-sent event",
    "properties": {
        "id": {"type": "string", "description": "the event's log offset"},
        "data": {"type": "string", "description": "the AG-UI event (JSON)"},
        "retry": {"type": "integer"},
    },
    "required": ["data"],
}


def _error(status: int, code: str, message: str, details: Any = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"code": code, "message": message}
    if details is not None:
        body["details"] = details
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def _responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {s: {"model": ErrorBody, "description": _ERROR_CODES.get(s, "error")}
            for s in statuses}


def _describe_validation(exc: RequestValidationError) -> tuple[str, list[dict[str, Any]]]:
    details: list[dict[str, Any]] = []
    parts: list[str] = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p != "body" or len(err.get("loc", ())) == 1]
        where = ".".join(loc) or "body"
        msg = str(err.get("msg", "invalid"))
        details.append({"loc": loc, "message": msg, "type": str(err.get("type", ""))})
        parts.append(f"{where}: {msg}")
    message = "invalid request: " + "; ".join(parts[:5])
    if len(parts) > 5:
        message += f" (and {len(parts) - 5} more)"
    return message, details


def _http_attrs(request: Request) -> dict[str, str]:
    """The HTTP server span's attributes (OpenTelemetry semantic conventions)."""
    return {"http.request.method": request.method, "url.path": request.url.path}


def _root(request: Request) -> str:
    """The prefix the app is mounted under (``""`` when served alone)."""
    return str(request.scope.get("root_path", ""))


def _resume_point(last_event_id: str | None, default: int = 0) -> int:
    """The log offset a ``Last-Event-ID`` header names (``default`` without one)."""
    if last_event_id is None or not last_event_id.strip():
        return default
    raw = last_event_id.strip()
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise ApiError(400, "invalid_last_event_id",
                       f"Last-Event-ID must be a log offset (a whole number), got {raw!r}")
    return int(raw)


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
    config = service.config

    from corral.server._mcp_tools import CorralMcp  # the MCP SDK: with the app only

    tools = CorralMcp(service)
    mcp_endpoint: list[Callable[[Scope, Receive, Send], Awaitable[None]]] = []

    @asynccontextmanager
    async def running() -> AsyncIterator[RunService]:
        async with service.running(), tools.http() as endpoint:
            mcp_endpoint.append(endpoint)
            try:
                yield service
            finally:
                mcp_endpoint.clear()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with running():
            yield

    dependencies = []
    if auth is not None:
        host_auth = auth

        async def authorized(allowed: Any = Depends(host_auth)) -> None:
            if allowed is False:
                raise StarletteHTTPException(401, "not authorized by the application")

        dependencies.append(Depends(authorized))
    app = FastAPI(
        title="corral",
        version=__version__,
        description="Durable coding-agent runs in sandboxes, streamed as AG-UI events.",
        docs_url=None,
        redoc_url=None,
        # served below as a route of this app, so that the host app's `auth` covers it
        # (FastAPI's own /openapi.json route skips the app's dependencies)
        openapi_url=None,
        lifespan=lifespan,
        dependencies=dependencies,
    )

    # ------------------------------------------------------------------ errors

    @app.exception_handler(RequestValidationError)
    async def on_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, details = _describe_validation(exc)
        return _error(422, "invalid_request", message, details)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, _ERROR_CODES.get(exc.status_code, "error"),
                      str(exc.detail), headers=dict(exc.headers or {}))

    @app.exception_handler(ApiError)
    async def on_api(_: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.code, exc.message)

    def mapped(status: int, code: str) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
        async def handle(_: Request, exc: Exception) -> JSONResponse:
            return _error(status, code, str(exc))

        return handle

    # Starlette picks a handler by the exception's class, most specific first.
    for exc_type, (status, code) in {
        UnknownRun: (404, "run_not_found"), RunExists: (409, "run_exists"),
        TooManyRuns: (429, "too_many_runs"), RunStartError: (500, "run_start_failed"),
        ConfigError: (400, "invalid_request"),
        UnknownThread: (404, "thread_not_found"), ThreadBusy: (409, "thread_busy"),
        ThreadError: (409, "thread_refused"),
    }.items():
        app.add_exception_handler(exc_type, mapped(status, code))

    @app.exception_handler(PrerequisiteMissing)
    async def on_missing(_: Request, exc: PrerequisiteMissing) -> JSONResponse:
        # the server's machine lacks something (an agent CLI, a model key, a Docker daemon):
        # the operator's to fix, not a bug of the server
        log.warning("request refused: %s", exc)
        return _error(503, exc.code, str(exc))

    @app.exception_handler(UnsupportedCapability)
    async def on_unsupported(_: Request, exc: UnsupportedCapability) -> JSONResponse:
        log.warning("request refused: %s", exc)
        return _error(400, "unsupported", str(exc))

    @app.exception_handler(CorralError)
    async def on_corral(_: Request, exc: CorralError) -> JSONResponse:
        log.error("request failed: %s", exc)
        return _error(500, "internal", str(exc))

    @app.exception_handler(Exception)
    async def on_bug(_: Request, exc: Exception) -> JSONResponse:
        log.error("unexpected error: %s", exc, exc_info=exc)
        return _error(500, "internal", "internal error; the server log has the details")

    # ------------------------------------------------------------------ API

    @app.post(
        "/v1/runs",
        status_code=201,
        response_model=RunCreated,
        responses=_responses(400, 401, 403, 409, 413, 422, 429, 500),
        summary="Start a run; the server drives it until it ends",
    )
    async def start_run(body: StartRun, response: Response, request: Request) -> RunCreated:
        with span("POST /v1/runs", _http_attrs(request), parent=context_of(request.headers)):
            record = await service.start_run(run_request(body))
        url = _root(request) + events_url(record.run_id)
        response.headers["location"] = url.removesuffix("/events")
        return RunCreated(run_id=record.run_id, thread_id=record.thread_id,
                          status=record.status, events_url=url)

    def run_request(body: StartRun) -> RunRequest:
        return request_for(config, body)

    @app.post(
        "/v1/agui",
        responses={
            200: {
                "description": "the run's AG-UI events as server-sent events (AG-UI's SSE "
                "encoding; `id` is the log offset, so a reconnect resumes with "
                "Last-Event-ID)",
                "content": {"text/event-stream": {"schema": _SSE_EVENT}},
            },
            **_responses(400, 401, 403, 409, 413, 422, 429, 500),
        },
        response_class=Response,
        summary="AG-UI: start (or resume) the durable run an AG-UI RunAgentInput describes, "
        "or continue it with frontend tool results and resume entries",
    )
    async def agui(
        run_input: RunAgentInput,
        request: Request,
        last_event_id: Annotated[str | None, Header()] = None,
    ) -> Any:
        position = _resume_point(last_event_id)
        try:
            answers = answers_of(run_input)
            if answers.ids:
                # the client answers what a run of the thread waits for: the same corral
                # run goes on, shown as the AG-UI run of this input
                going_on = await apply_answers(service.store, run_input.thread_id, answers)
                return _Asgi(EventStream(
                    service, going_on.record.run_id, 0,
                    project=Segments(run_input.thread_id, run_input.run_id,
                                     going_on.segment, position).feed_events))
            existing = await service.store.get(run_input.run_id)
            if existing is None:
                body = start_body(run_input, config.default_harness)
                frontend = frontend_descriptors(run_input, reserved_tool_names())
            elif existing.thread_id != run_input.thread_id:
                raise RunExists(f"run {run_input.run_id!r} exists on another thread")
        except AguiInputError as exc:
            raise ApiError(400, "invalid_agui_input", str(exc)) from None
        if existing is None:
            with span("POST /v1/agui", _http_attrs(request),
                      parent=context_of(request.headers)):
                await service.start_run(replace(run_request(body), frontend_tools=frontend
                                                or None))
        # else: the client retries or reconnects: the same run's stream, from where it was
        return _Asgi(EventStream(service, run_input.run_id, 0, project=Segments(
            run_input.thread_id, run_input.run_id, 0, position).feed_events))

    def reserved_tool_names() -> set[str]:
        """corral's own host tool names: a client's tool never shadows one."""
        own = service.runner.tools
        return {PERMISSION_TOOL, SUBMIT_TOOL, *(t.name for t in own or ())}

    @app.get("/v1/runs", response_model=RunList, responses=_responses(401, 422),
             summary="List runs, newest first")
    async def list_runs(
        request: Request,
        thread_id: Annotated[str | None, Query(max_length=200)] = None,
        status: RunStatus | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    ) -> RunList:
        store = service.store
        if thread_id is not None:
            records = list(reversed(await store.list_by_thread(thread_id)))
            if status is not None:
                records = [r for r in records if r.status is status]
            records = records[:limit]
        else:
            records = await store.list_runs(status=status, limit=limit)
        return RunList(runs=[RunOut.of(r, _root(request)) for r in records])

    @app.get("/v1/runs/{run_id}", response_model=RunOut, responses=_responses(401, 404),
             summary="One run")
    async def get_run(run_id: str, request: Request) -> RunOut:
        record = await service.store.get(run_id)
        if record is None:
            raise UnknownRun(run_id)
        return RunOut.of(record, _root(request))

    @app.post("/v1/runs/{run_id}/cancel", response_model=RunOut,
              responses=_responses(401, 403, 404), summary="Cancel a run (idempotent)")
    async def cancel_run(run_id: str, request: Request) -> RunOut:
        return RunOut.of(await service.cancel(run_id), _root(request))

    @app.get("/v1/runs/{run_id}/approvals", response_model=ApprovalList,
             responses=_responses(401, 404), summary="A run's pending approval requests")
    async def pending_approvals(run_id: str) -> ApprovalList:

        if await service.store.get(run_id) is None:
            raise UnknownRun(run_id)
        pending = await list_pending(service.store, run_id)
        return ApprovalList(approvals=[
            ApprovalOut(approval_id=a.approval_id, run_id=a.run_id, tool=a.tool, args=a.args,
                        created_at=a.created_at, expires_at=a.expires_at)
            for a in pending
        ])

    @app.post("/v1/runs/{run_id}/approvals/{approval_id}", response_model=ApprovalResult,
              responses=_responses(400, 401, 403, 404, 409, 413, 422),
              summary="Answer a host tool's approval request (allow or deny)")
    async def answer(run_id: str, approval_id: str, body: ApprovalAnswer) -> ApprovalResult:

        if await service.store.get(run_id) is None:
            raise UnknownRun(run_id)
        allow = body.decision == "allow"
        try:
            await answer_approval(service.store, run_id, approval_id, allow,
                                  reason=body.reason)
        except ApprovalError as exc:
            # a forged or foreign id, an unknown, expired or already answered request
            raise ApiError(409, "approval_refused", str(exc)) from None
        return ApprovalResult(approval_id=approval_id, decision=body.decision)

    @app.get("/v1/harnesses", response_model=HarnessList, responses=_responses(401),
             summary="The harnesses this server starts runs with (and its default)")
    async def harnesses() -> HarnessList:
        allowed = config.allowed_harnesses
        names = list(allowed) if allowed is not None else harness_names()
        # what is missing (agent installs, model keys) is read on each call: an operator's
        # `corral agents install` shows without a restart
        from corral.agents._prepare import harness_unavailable  # start-up cost: when used

        missing = await anyio.to_thread.run_sync(
            lambda: {n: harness_unavailable(n) for n in names})
        ready = [n for n in names if missing[n] is None]
        unavailable = [HarnessUnavailable(name=n, code=exc.code, reason=str(exc))
                       for n, exc in missing.items() if exc is not None]
        agents = [n for n in ready if n != "command"]
        preferred = [config.default_harness, "claude-code", *agents, "command"]
        suggested = next((n for n in preferred if n is not None and n in ready), None)
        return HarnessList(harnesses=ready, default_harness=config.default_harness,
                           unavailable=unavailable, suggested_harness=suggested)

    @app.get("/v1/threads/{thread_id}/active", response_model=RunOut,
             responses=_responses(401, 404), summary="The thread's running run")
    async def active_run(thread_id: str, request: Request) -> RunOut:
        record = await service.store.find_active_run(thread_id)
        if record is None:
            raise ApiError(404, "no_active_run", f"thread {thread_id!r} has no running run")
        return RunOut.of(record, _root(request))

    @app.get("/v1/threads", response_model=ThreadList, responses=_responses(401, 422),
             summary="List threads, newest activity first")
    async def list_threads(limit: Annotated[int, Query(ge=1, le=1000)] = 50) -> ThreadList:
        found = await service.runner.threads.list(limit=limit)
        return ThreadList(threads=[t.to_dict() for t in found])

    @app.get("/v1/threads/{thread_id}", response_model=ThreadOut,
             responses=_responses(400, 401, 404), summary="A thread's runs and checkpoints")
    async def get_thread(thread_id: str) -> ThreadOut:
        return ThreadOut(**(await service.runner.threads.show(thread_id)).to_dict())

    @app.post("/v1/threads/{thread_id}/undo", response_model=ThreadOut,
              responses=_responses(400, 401, 403, 404, 409),
              summary="Undo the thread's last turn (workspace and conversation)")
    async def undo_thread(thread_id: str) -> ThreadOut:
        return ThreadOut(**(await service.runner.threads.undo(thread_id)).to_dict())

    @app.post("/v1/threads/{thread_id}/fork", response_model=ThreadOut,
              responses=_responses(400, 401, 403, 404, 409, 413, 422),
              summary="Start a new thread from this one's state after a run")
    async def fork_thread(thread_id: str, body: ForkBody) -> ThreadOut:
        detail = await service.runner.threads.fork(thread_id, body.as_, at=body.at)
        return ThreadOut(**detail.to_dict())

    @app.delete("/v1/threads/{thread_id}", response_model=ThreadRemoved,
                responses=_responses(400, 401, 403, 404, 409),
                summary="Remove a thread's sessions, checkpoints and sandboxes (and, with "
                        "?runs=true, its runs and their logs)")
    async def remove_thread(
        thread_id: str,
        runs: Annotated[bool, Query(description="also remove the thread's runs: their "
                                    "records, event logs and approvals")] = False,
    ) -> ThreadRemoved:
        removed = await service.runner.threads.remove(thread_id, runs=runs)
        return ThreadRemoved(thread_id=thread_id, **removed)

    @app.get(
        "/v1/runs/{run_id}/events",
        responses={
            200: {
                "description": "server-sent events: `id` is the log offset, `data` the AG-UI "
                "event as JSON; a last `: end` comment marks the end of the log",
                "content": {"text/event-stream": {"schema": _SSE_EVENT}},
            },
            204: {"description": "the run's log is closed and nothing follows `after`"},
            **_responses(400, 401, 404, 422),
        },
        response_class=Response,
        summary="Stream a run's events (resume with Last-Event-ID or ?after=)",
    )
    async def run_events(
        run_id: str,
        after: Annotated[int | None, Query(ge=0, description="resume after this offset")] = None,
        token: Annotated[str | None, Query(description="the API token, for EventSource "
                                            "(which cannot send headers)")] = None,
        last_event_id: Annotated[str | None, Header()] = None,
    ) -> Any:
        # the browser's resume point wins over the URL's
        position = _resume_point(last_event_id, after or 0)
        tail = await service.store.tail(run_id)  # raises UnknownRun for a run it lacks
        if tail.closed and position >= tail.last_offset:
            return Response(status_code=204)
        return _Asgi(EventStream(service, run_id, position))

    # ------------------------------------------------------------------ MCP

    # corral's MCP tools over Streamable HTTP (corral.server._mcp_tools). A route of this
    # app, so the host app's `auth` dependency covers it; the guard checks the token,
    # Host and Origin as for /v1.
    @app.api_route("/mcp", methods=["GET", "POST", "DELETE"], include_in_schema=False)
    async def mcp(request: Request) -> Response:
        if not mcp_endpoint:
            raise ApiError(503, "not_running", "the MCP endpoint is not running (enter "
                           "the app's running() context)")
        return _Asgi(mcp_endpoint[0])

    # ------------------------------------------------------------------ page

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"cache-control": "no-store"})

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi_json() -> JSONResponse:
        return JSONResponse(app.openapi())

    # The API reference: a small page of this package (no CDN: corral may run offline)
    # that renders /openapi.json; /redoc is the same reference, for those who look there.
    @app.get("/docs", include_in_schema=False)
    @app.get("/redoc", include_in_schema=False)
    async def docs() -> FileResponse:
        return FileResponse(STATIC / "docs.html", headers={"cache-control": "no-store"})

    @app.get("/healthz", include_in_schema=False)
    async def health() -> dict[str, Any]:
        return {"ok": True, "version": __version__}

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    base_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        # Auth is enforced by the Guard middleware; document it for clients.
        if app.openapi_schema is None:
            schema = base_openapi()
            if config.token is not None:
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

    app.openapi = openapi  # type: ignore[method-assign]

    return CorralApp(app, service, auth=auth is not None, running=running)


class _Asgi(Response):
    """Lets a route return a raw ASGI callable (the event stream)."""

    def __init__(self, inner: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        super().__init__()
        self.inner = inner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.inner(scope, receive, send)


__all__ = ["create_app", "encode_event", "resolve_sandbox"]
