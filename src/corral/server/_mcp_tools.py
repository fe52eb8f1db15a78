"""corral as an MCP server: tools to start, follow, approve, cancel and list runs.

The same tools are served two ways, with the MCP SDK corral uses for host tools:

- ``corral mcp``: on stdio, for an MCP client that starts corral itself (runs it starts
  are driven by that process and detach when the client goes);
- ``/mcp`` under ``corral serve``: Streamable HTTP (stateless, JSON answers), behind the
  server's guard like ``/v1`` (bearer token when one is configured; otherwise loopback
  Host names only, no foreign ``Origin``, JSON bodies only).

Tools (each answers structured JSON, also as text):

- ``start_run``: the body of ``POST /v1/runs`` (a command, or a prompt with an agent
  harness; ``thread_id`` of an earlier run makes a thread turn), checked against the same
  configuration (allowed harnesses, sandboxes, workspace roots);
- ``run_events``: one page of a run's AG-UI events after a log offset (``limit``; ``wait``
  seconds for new ones), the offset to ask after next, and whether the log has ended;
- ``get_run``, ``list_runs`` (newest first; by thread or status), ``list_threads``;
- ``list_approvals`` and ``approve`` (allow or deny a pending approval);
- ``cancel_run``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Final

import anyio
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import ValidationError

from corral._errors import ConfigError, CorralError, PrerequisiteMissing
from corral._version import __version__
from corral.runs._request import RunStartError
from corral.server._models import RunOut, StartRun
from corral.server._requests import ApiError, request_for
from corral.server._service import RunService, TooManyRuns
from corral.stores._protocols import RunExists, UnknownRun
from corral.stores._records import RunStatus
from corral.tools._approvals import ApprovalError, answer_approval, list_pending

__all__ = ["CorralMcp"]

SERVER_NAME: Final = "corral"
MAX_PAGE: Final = 1000
MAX_WAIT: Final = 30.0
POLL: Final = 0.2

_RUN_ID: Final = {"type": "string", "minLength": 1, "maxLength": 200,
                  "description": "the run's id"}


def _schema(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required),
            "additionalProperties": False}


def _start_schema() -> dict[str, Any]:
    schema = StartRun.model_json_schema()
    schema["required"] = [r for r in schema.get("required", []) if r != "thread_id"]
    schema["properties"]["thread_id"]["description"] = (
        "the thread (conversation) of the run: an earlier run's thread_id makes this run a "
        "turn of it (default: a new thread)")
    return schema


TOOLS: Final[dict[str, tuple[str, Callable[[], dict[str, Any]]]]] = {
    "start_run": ("Start a durable corral run in a sandbox: `command` (argv, the command "
                  "harness) or `prompt` with an agent `harness`. Give the thread_id of an "
                  "earlier run to continue its thread. Returns run_id and thread_id; read "
                  "its events with run_events.", _start_schema),
    "run_events": ("A page of a run's AG-UI events after log offset `after` (0: from the "
                   "start). Returns events [{offset, event}], `next` (pass it as `after`), "
                   "`done` (the log has ended and nothing follows) and the run's status. "
                   "`wait`: seconds to wait for new events when there are none yet.",
                   lambda: _schema({
                       "run_id": _RUN_ID,
                       "after": {"type": "integer", "minimum": 0, "default": 0},
                       "limit": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE,
                                 "default": 200},
                       "wait": {"type": "number", "minimum": 0, "maximum": MAX_WAIT,
                                "default": 0}}, ("run_id",))),
    "get_run": ("One run's record (status, thread, harness, times, error).",
                lambda: _schema({"run_id": _RUN_ID}, ("run_id",))),
    "list_runs": ("Runs, newest first; only a thread's, or only those in a status.",
                  lambda: _schema({
                      "thread_id": {"type": "string", "maxLength": 200},
                      "status": {"type": "string", "enum": [s.value for s in RunStatus]},
                      "limit": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE,
                                "default": 50}})),
    "list_threads": ("Threads (conversations) with their latest run, most recent first.",
                     lambda: _schema({"limit": {"type": "integer", "minimum": 1,
                                                "maximum": MAX_PAGE, "default": 50}})),
    "list_approvals": ("A run's pending approval requests (corral's `ask` rules and "
                       "approval tools): ids, tools and arguments.",
                       lambda: _schema({"run_id": _RUN_ID}, ("run_id",))),
    "approve": ("Answer a run's pending approval request: decision allow or deny.",
                lambda: _schema({
                    "run_id": _RUN_ID,
                    "approval_id": {"type": "string", "minLength": 1, "maxLength": 100},
                    "decision": {"type": "string", "enum": ["allow", "deny"]},
                    "reason": {"type": "string", "maxLength": 2000}},
                    ("run_id", "approval_id", "decision"))),
    "cancel_run": ("Cancel a run (it ends as aborted; idempotent).",
                   lambda: _schema({"run_id": _RUN_ID}, ("run_id",))),
}


class ToolRefused(Exception):
    """A tool call refused with a message for the client."""


class CorralMcp:
    """corral's MCP tools over ``service`` (use inside :meth:`RunService.running`)."""

    def __init__(self, service: RunService) -> None:
        self.service = service
        self._tools = [types.Tool(name=name, description=text, input_schema=schema())
                       for name, (text, schema) in TOOLS.items()]
        self._handlers: dict[str, Callable[[dict[str, Any]], Awaitable[Any]]] = {
            "start_run": self.start_run, "run_events": self.run_events,
            "get_run": self.get_run, "list_runs": self.list_runs,
            "list_threads": self.list_threads, "list_approvals": self.list_approvals,
            "approve": self.approve, "cancel_run": self.cancel_run,
        }

    def server(self) -> Server[Any]:
        """A low-level MCP server answering ``tools/list`` and ``tools/call``."""

        async def list_tools(ctx: ServerRequestContext[Any],
                             params: types.PaginatedRequestParams | None
                             ) -> types.ListToolsResult:
            return types.ListToolsResult(tools=self._tools)

        async def call_tool(ctx: ServerRequestContext[Any],
                            params: types.CallToolRequestParams) -> types.CallToolResult:
            return await self.call(params.name, params.arguments or {})

        return Server(SERVER_NAME, version=__version__, on_list_tools=list_tools,
                      on_call_tool=call_tool)

    async def call(self, name: str, args: dict[str, Any]) -> types.CallToolResult:
        """Run one tool: its JSON answer, or an error result saying what was wrong."""
        handler = self._handlers.get(name)
        try:
            if handler is None:
                raise ToolRefused(f"no tool {name!r}; the tools are {', '.join(TOOLS)}")
            value = await handler(args)
        except ValidationError as exc:
            return _error(_validation(exc))
        except ApiError as exc:
            return _error(exc.message)
        except UnknownRun as exc:
            return _error(f"no run {exc}" if " " not in str(exc) else str(exc))
        except (ToolRefused, ConfigError, PrerequisiteMissing, RunStartError, TooManyRuns,
                RunExists, ApprovalError, CorralError) as exc:
            return _error(str(exc))
        text = json.dumps(value, sort_keys=True)
        return types.CallToolResult(content=[types.TextContent(text=text)],
                                    structured_content=value)

    # ------------------------------------------------------------------ tools

    async def start_run(self, args: dict[str, Any]) -> dict[str, Any]:
        body = StartRun.model_validate(
            {"thread_id": "mcp-" + uuid.uuid4().hex[:20], **args})
        record = await self.service.start_run(request_for(self.service.config, body))
        return {"run_id": record.run_id, "thread_id": record.thread_id,
                "status": record.status.value}

    async def run_events(self, args: dict[str, Any]) -> dict[str, Any]:
        run_id = _string(args, "run_id")
        after = _int(args, "after", 0, 0, 1 << 62)
        limit = _int(args, "limit", 200, 1, MAX_PAGE)
        wait = args.get("wait", 0)
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or \
                not 0 <= wait <= MAX_WAIT:
            raise ToolRefused(f"wait must be 0 to {MAX_WAIT:g} seconds")
        store = self.service.store
        deadline = time.monotonic() + float(wait)
        while True:
            tail = await store.tail(run_id)  # UnknownRun for a run it lacks
            if tail.last_offset > after or tail.closed or time.monotonic() >= deadline:
                break
            await anyio.sleep(POLL)
        page = [e for e in await store.snapshot(run_id) if e.offset > after][:limit]
        next_after = page[-1].offset if page else after
        tail = await store.tail(run_id)
        record = await store.get(run_id)
        return {"run_id": run_id,
                "events": [{"offset": e.offset, "event": e.event} for e in page],
                "next": next_after, "done": tail.closed and next_after >= tail.last_offset,
                "status": record.status.value if record is not None else None}

    async def get_run(self, args: dict[str, Any]) -> dict[str, Any]:
        run_id = _string(args, "run_id")
        record = await self.service.store.get(run_id)
        if record is None:
            raise UnknownRun(run_id)
        return _run(record)

    async def list_runs(self, args: dict[str, Any]) -> dict[str, Any]:
        limit = _int(args, "limit", 50, 1, MAX_PAGE)
        status_name = args.get("status")
        try:
            status = RunStatus(status_name) if status_name is not None else None
        except ValueError:
            raise ToolRefused(f"status must be one of {', '.join(s.value for s in RunStatus)}"
                              ) from None
        thread = args.get("thread_id")
        store = self.service.store
        if thread is not None:
            records = list(reversed(await store.list_by_thread(_string(args, "thread_id"))))
            records = [r for r in records if status is None or r.status is status][:limit]
        else:
            records = await store.list_runs(status=status, limit=limit)
        return {"runs": [_run(r) for r in records]}

    async def list_threads(self, args: dict[str, Any]) -> dict[str, Any]:
        limit = _int(args, "limit", 50, 1, MAX_PAGE)
        # The store lists runs, not threads: a thread is its runs' thread_id, shown with
        # its newest run (runs come newest first).
        threads: dict[str, dict[str, Any]] = {}
        for record in await self.service.store.list_runs(limit=MAX_PAGE * 5):
            entry = threads.get(record.thread_id)
            if entry is None:
                if len(threads) >= limit:
                    continue
                threads[record.thread_id] = {
                    "thread_id": record.thread_id, "runs": 1,
                    "latest_run_id": record.run_id, "latest_status": record.status.value,
                    "updated_at": record.updated_at}
            else:
                entry["runs"] += 1
        return {"threads": list(threads.values())}

    async def list_approvals(self, args: dict[str, Any]) -> dict[str, Any]:
        run_id = _string(args, "run_id")
        if await self.service.store.get(run_id) is None:
            raise UnknownRun(run_id)
        return {"approvals": [
            {"approval_id": a.approval_id, "run_id": a.run_id, "tool": a.tool,
             "args": a.args, "created_at": a.created_at, "expires_at": a.expires_at}
            for a in await list_pending(self.service.store, run_id)]}

    async def approve(self, args: dict[str, Any]) -> dict[str, Any]:
        run_id = _string(args, "run_id")
        approval_id = _string(args, "approval_id")
        decision = args.get("decision")
        if decision not in ("allow", "deny"):
            raise ToolRefused("decision must be allow or deny")
        reason = args.get("reason")
        if reason is not None and not isinstance(reason, str):
            raise ToolRefused("reason must be a string")
        if await self.service.store.get(run_id) is None:
            raise UnknownRun(run_id)
        await answer_approval(self.service.store, run_id, approval_id, decision == "allow",
                              reason=reason)
        return {"approval_id": approval_id, "decision": decision}

    async def cancel_run(self, args: dict[str, Any]) -> dict[str, Any]:
        return _run(await self.service.cancel(_string(args, "run_id")))

    # ------------------------------------------------------------------ transports

    @asynccontextmanager
    async def http(self) -> AsyncIterator[Callable[..., Awaitable[None]]]:
        """The Streamable HTTP endpoint (an ASGI callable) while the context is open.
        Stateless and JSON-only: every request is a whole exchange, so any server process
        sharing the store answers any of them. Host and Origin are the guard's to check
        (:mod:`corral.server._guard`), as for ``/v1``."""
        manager = StreamableHTTPSessionManager(
            app=self.server(), stateless=True, json_response=True,
            security_settings=TransportSecuritySettings(
                enable_dns_rebinding_protection=False))
        async with manager.run():
            yield manager.handle_request

    async def serve_stdio(self) -> None:
        """Speak MCP on this process's stdin/stdout until the client closes stdin."""
        server = self.server()
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())


def _run(record: Any) -> dict[str, Any]:
    out: dict[str, Any] = RunOut.of(record, "").model_dump(mode="json")
    return out


def _string(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value or len(value) > 200:
        raise ToolRefused(f"{key} must be a non-empty string (at most 200 characters)")
    return value


def _int(args: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ToolRefused(f"{key} must be a whole number from {low} to {high}")
    return value


def _validation(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ())) or "arguments"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "invalid arguments: " + "; ".join(parts)


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)
