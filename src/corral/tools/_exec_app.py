"""The host's tool-exec endpoint: ``POST /`` with ``{"name", "args"}`` -> ``{"result"}``.

The other end of :class:`corral.tools._remote.HttpToolExecutor`. Status codes: 401 bad
token, 413 body too large (both from :class:`corral.tools._asgi.RequestGuard`, before any
tool code), 400 malformed body, 404 unknown tool, 422 bad arguments, 403 denied, 504 tool
timeout, 500 the tool raised (``{"error": {"message": "tool execution failed: ..."}}``).
"""

from __future__ import annotations

import json
from typing import Any

from corral.tools._asgi import ASGIApp, Receive, RequestGuard, Scope, Send, json_error
from corral.tools._core import ToolArgumentsError, ToolContext, Toolset, UnknownToolError
from corral.tools._remote import (
    ApprovalGate,
    ToolDeniedError,
    ToolTimeoutError,
    execute_host_tool,
)

__all__ = ["tool_exec_app"]


def tool_exec_app(toolset: Toolset, *, token: str, max_body: int = 1 << 20,
                  timeout: float | None = 60.0, approvals: ApprovalGate | None = None,
                  run_id: str | None = None) -> RequestGuard:
    """An ASGI app serving ``toolset`` as one authenticated tool-exec call."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                kind = msg["type"].rsplit(".", 1)[-1]
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        if scope["method"] != "POST":
            await json_error(send, 405, "use POST")
            return
        msg = await receive()
        try:
            body: Any = json.loads(msg.get("body", b""))
        except ValueError:
            await json_error(send, 400, "the body is not JSON")
            return
        name = body.get("name") if isinstance(body, dict) else None
        ctx = ToolContext(tool=str(name), run_id=run_id)
        try:
            result = await execute_host_tool(toolset, body, approvals=approvals,
                                             timeout=timeout, context=ctx)
        except UnknownToolError as exc:
            await json_error(send, 404, str(exc))
        except ToolArgumentsError as exc:
            await json_error(send, 400 if name is None else 422, str(exc))
        except ToolDeniedError as exc:
            await json_error(send, 403, str(exc))
        except ToolTimeoutError as exc:
            await json_error(send, 504, str(exc))
        except Exception as exc:  # noqa: BLE001 - the tool's failure goes to the caller
            await json_error(send, 500, f"tool execution failed: "
                                         f"{exc.__class__.__name__}: {exc}")
        else:
            out = json.dumps({"result": result}).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(out)).encode())]})
            await send({"type": "http.response.body", "body": out})

    inner: ASGIApp = app
    return RequestGuard(inner, token=token, max_body=max_body)
