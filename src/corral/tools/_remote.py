"""Remote tools: run host tools from somewhere else through one authenticated call.

Roles (the same seam as the reference's remote-tools module):

- :func:`tool_descriptors` (host) serializes tools to plain descriptors
  ``{"name", "description", "inputSchema", "approval"}``;
- :func:`remote_tool_stubs` (remote side) rebuilds tools from descriptors whose run is
  delegated to a :class:`ToolExecutor`, e.g. :class:`HttpToolExecutor`, which POSTs
  ``{"name", "args"}`` with a bearer token and expects ``{"result": ...}``;
- :func:`execute_host_tool` (host) runs the named tool for such a request body, refusing
  unknown tools, bad arguments, and "ask" tools without an approval gate;
- :func:`is_tool_exec_request` narrows a request body.

Every failure of the HTTP executor is a typed :class:`RemoteToolError` naming the tool
and what went wrong (unreachable, timeout, rejected 4xx, server 5xx, bad response).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import httpx
from pydantic import TypeAdapter

from corral.tools._core import (
    ToolArgumentsError,
    ToolContext,
    ToolError,
    ToolLike,
    Toolset,
)

__all__ = [
    "ApprovalGate",
    "HttpToolExecutor",
    "RemoteTool",
    "RemoteToolBadResponse",
    "RemoteToolError",
    "RemoteToolRejected",
    "RemoteToolServerError",
    "RemoteToolTimeout",
    "RemoteToolUnreachable",
    "ToolDeniedError",
    "ToolExecutor",
    "ToolTimeoutError",
    "execute_host_tool",
    "is_tool_exec_request",
    "parse_descriptors",
    "remote_tool_stubs",
    "tool_descriptors",
]

BODY_TAIL = 300
_ANY: TypeAdapter[Any] = TypeAdapter(Any)


# ---------------------------------------------------------------- errors


class ToolDeniedError(ToolError, PermissionError):
    """An "ask" tool was denied (by a human, by its approval timeout, or for lack of an
    approval channel)."""


class ToolTimeoutError(ToolError, TimeoutError):
    """A host tool ran past its per-call timeout."""


class RemoteToolError(ToolError):
    """A remote tool call failed. ``tool`` is the tool's name."""

    def __init__(self, tool: str, message: str) -> None:
        super().__init__(f"remote tool {tool!r}: {message}")
        self.tool = tool


class RemoteToolUnreachable(RemoteToolError, ConnectionError):
    """The tool endpoint could not be reached (refused, no such socket, DNS)."""


class RemoteToolTimeout(RemoteToolError, TimeoutError):
    """The tool endpoint did not answer in time."""


class RemoteToolRejected(RemoteToolError):
    """The endpoint answered 4xx (auth, unknown tool, bad arguments, denied, too large)."""

    def __init__(self, tool: str, status: int, detail: str) -> None:
        super().__init__(tool, f"rejected with HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


class RemoteToolServerError(RemoteToolError):
    """The endpoint answered 5xx (the tool raised, or the host failed)."""

    def __init__(self, tool: str, status: int, detail: str) -> None:
        super().__init__(tool, f"host error HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


class RemoteToolBadResponse(RemoteToolError):
    """The endpoint answered something that is not ``{"result": ...}`` JSON."""


# ---------------------------------------------------------------- descriptors


def _object_schema(schema: Any) -> dict[str, Any]:
    if isinstance(schema, Mapping) and schema.get("type") == "object":
        return dict(schema)
    return {"type": "object", "properties": {}}


def tool_descriptors(tools: Iterable[ToolLike]) -> list[dict[str, Any]]:
    """Serialize tools to JSON-ready descriptors (the schema coerced to an object
    schema)."""
    return [{"name": t.name, "description": t.description,
             "inputSchema": _object_schema(t.input_schema), "approval": bool(t.approval)}
            for t in tools]


@dataclass(frozen=True, slots=True)
class RemoteTool:
    """A tool rebuilt from a descriptor; :meth:`run` delegates to the executor."""

    name: str
    description: str
    input_schema: dict[str, Any]
    approval: bool
    executor: ToolExecutor

    async def run(self, args: Any, context: ToolContext | None = None) -> Any:
        return await self.executor.execute(self.name, args)


class ToolExecutor(Protocol):
    """Runs a named tool elsewhere and returns its raw (JSON) result."""

    async def execute(self, name: str, args: Any) -> Any: ...


def parse_descriptors(data: Any) -> list[dict[str, Any]]:
    """Validate descriptors received from elsewhere; :class:`ToolArgumentsError` names the
    first malformed one."""
    if not isinstance(data, Sequence) or isinstance(data, (str, bytes)):
        raise ToolArgumentsError("tool descriptors must be a JSON array")
    out: list[dict[str, Any]] = []
    for i, d in enumerate(data):
        if not isinstance(d, Mapping) or not isinstance(d.get("name"), str) or not d["name"]:
            raise ToolArgumentsError(f"tool descriptor #{i} needs a non-empty 'name'")
        desc = d.get("description", "")
        if not isinstance(desc, str):
            raise ToolArgumentsError(f"tool descriptor {d['name']!r}: 'description' must "
                                     "be a string")
        schema = d.get("inputSchema", {"type": "object", "properties": {}})
        if not isinstance(schema, Mapping) or schema.get("type") != "object":
            raise ToolArgumentsError(f"tool descriptor {d['name']!r}: 'inputSchema' must be "
                                     "a JSON object schema")
        approval = d.get("approval", False)
        if not isinstance(approval, bool):
            raise ToolArgumentsError(f"tool descriptor {d['name']!r}: 'approval' must be "
                                     "true or false")
        out.append({"name": d["name"], "description": desc, "inputSchema": dict(schema),
                    "approval": approval})
    return out


def remote_tool_stubs(descriptors: Any, executor: ToolExecutor) -> Toolset:
    """Tools rebuilt from descriptors (validated with :func:`parse_descriptors`) whose
    runs go to ``executor``."""
    return Toolset(RemoteTool(d["name"], d["description"], d["inputSchema"], d["approval"],
                              executor) for d in parse_descriptors(descriptors))


# ---------------------------------------------------------------- HTTP executor


def _tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= BODY_TAIL else text[:BODY_TAIL] + "..."


def _detail(resp: httpx.Response) -> str:
    """The host's error message when it sent ``{"error": {"message"}}``, else the body."""
    try:
        body = resp.json()
    except ValueError:
        return _tail(resp.text) or resp.reason_phrase
    if isinstance(body, Mapping):
        err = body.get("error")
        if isinstance(err, Mapping) and isinstance(err.get("message"), str):
            return _tail(err["message"])
        if isinstance(err, str):
            return _tail(err)
    return _tail(resp.text)


class HttpToolExecutor:
    """POST ``{"name", "args"}`` to ``url`` with ``Authorization: Bearer <token>``;
    return the ``result`` of a 2xx ``{"result": ...}`` answer, raise a
    :class:`RemoteToolError` subclass for anything else. ``transport`` lets the call go
    over a unix socket (``httpx.AsyncHTTPTransport(uds=path)``)."""

    def __init__(self, url: str, token: str, *, timeout: float = 60.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.url = url
        self._token = token
        self.timeout = timeout
        self._transport = transport

    def __repr__(self) -> str:  # never show the token
        return f"HttpToolExecutor({self.url!r})"

    async def execute(self, name: str, args: Any) -> Any:
        try:
            payload = json.dumps({"name": name, "args": args})
        except (TypeError, ValueError) as exc:
            raise ToolArgumentsError(f"remote tool {name!r}: arguments are not JSON: {exc}"
                                     ) from None
        headers = {"content-type": "application/json",
                   "authorization": f"Bearer {self._token}"}
        try:
            async with httpx.AsyncClient(transport=self._transport,
                                         timeout=self.timeout) as client:
                resp = await client.post(self.url, content=payload, headers=headers)
        except httpx.TimeoutException:
            raise RemoteToolTimeout(name, f"no answer from {self.url} within "
                                          f"{self.timeout:g}s") from None
        except (httpx.ConnectError, OSError) as exc:
            raise RemoteToolUnreachable(name, f"cannot reach {self.url}: {exc}") from None
        except httpx.HTTPError as exc:
            raise RemoteToolBadResponse(name, f"broken exchange with {self.url}: "
                                              f"{exc.__class__.__name__}: {exc}") from None
        if 400 <= resp.status_code < 500:
            raise RemoteToolRejected(name, resp.status_code, _detail(resp))
        if resp.status_code >= 500:
            raise RemoteToolServerError(name, resp.status_code, _detail(resp))
        if not 200 <= resp.status_code < 300:
            raise RemoteToolBadResponse(name, f"unexpected HTTP {resp.status_code}")
        try:
            body = resp.json()
        except ValueError:
            raise RemoteToolBadResponse(name, f"answer is not JSON: {_tail(resp.text)!r}"
                                        ) from None
        if not isinstance(body, Mapping) or "result" not in body:
            raise RemoteToolBadResponse(name, "answer is not an object with a 'result' "
                                              f"field: {_tail(resp.text)!r}")
        return body["result"]


# ---------------------------------------------------------------- host side


class ApprovalGate(Protocol):
    """Holds an "ask" tool call until a human answers (see
    :class:`corral.tools._approvals.Approvals`). Returns ``None`` when allowed, else the
    denial reason."""

    async def request(self, tool: str, args: Any, *, call_id: str | None = None
                      ) -> str | None: ...


def is_tool_exec_request(body: Any) -> bool:
    """Whether ``body`` is ``{"name": <non-empty str>, "args": <object or absent/null>}``
    with no other keys."""
    return (isinstance(body, Mapping) and set(body) <= {"name", "args"}
            and isinstance(body.get("name"), str) and bool(body["name"])
            and (body.get("args") is None or isinstance(body.get("args"), Mapping)))


async def execute_host_tool(toolset: Toolset, body: Any, *, approvals: ApprovalGate | None
                            = None, timeout: float | None = None,
                            context: ToolContext | None = None) -> Any:
    """Run the tool a request body names and return its result as JSON-ready data.

    Raises :class:`ToolArgumentsError` (malformed body or arguments),
    :class:`corral.tools._core.UnknownToolError`, :class:`ToolDeniedError` (an "ask" tool
    denied, or no approval gate to ask), :class:`ToolTimeoutError` (past ``timeout``
    seconds, approval wait not counted); whatever the tool raises propagates."""
    if not is_tool_exec_request(body):
        raise ToolArgumentsError("a tool call must be a JSON object {\"name\": str, "
                                 "\"args\": object}")
    name: str = body["name"]
    args = body.get("args") or {}
    t = toolset.get(name)
    if t.approval:
        if hasattr(t, "validate"):
            t.validate(args)  # before asking a human about arguments that cannot run
        if approvals is None:
            raise ToolDeniedError(f"tool {name!r} needs approval and this run has no "
                                  "approval channel")
        # the agent's own id names the call the client saw (an AG-UI interrupt's toolCallId)
        call_id = (context.tool_use_id or context.call_id) if context is not None else None
        reason = await approvals.request(name, args, call_id=call_id)
        if reason is not None:
            raise ToolDeniedError(f"tool {name!r} was denied: {reason}")
    ctx = context or ToolContext(tool=name)
    # A tool that holds calls for its own approvals (the permission prompt) is bounded by
    # the approval timeout, not by the call timeout: a human may take longer than a tool.
    if timeout is None or getattr(t, "waits_for_approvals", False) is True:
        value = await t.run(args, ctx)
    else:
        with anyio.move_on_after(timeout) as scope:
            value = await t.run(args, ctx)
        if scope.cancelled_caught:
            raise ToolTimeoutError(f"tool {name!r} ran longer than its {timeout:g}s timeout")
    return _ANY.dump_python(value, mode="json")
