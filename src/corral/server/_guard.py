"""The ASGI middleware in front of the API: authentication, origin checks, body size.

- With a token configured every ``/v1/`` and ``/mcp`` request needs ``Authorization:
  Bearer <token>``, compared in constant time. Browsers' EventSource cannot set headers,
  so the event stream (``GET /v1/runs/{id}/events``) alone also accepts ``?token=``.
- Without a token (loopback only) the Host header must name a loopback address, so a web
  page on another site cannot reach the API through DNS rebinding.
- A state-changing request that carries an ``Origin`` must come from this server's origin
  (no cross-site form posts or fetches); ``Origin: null`` (sandboxed iframes, ``data:``
  pages, redirects) is a foreign origin.
- Without a token, a state-changing ``/v1/`` or ``/mcp`` request must have a JSON content
  type or the ``X-Corral-Request`` header: a web page on another site cannot send either
  without a CORS preflight, which this server never grants (a form, a ``text/plain`` body
  or a bodiless ``fetch`` needs none). With a token the ``Authorization`` header does the same.
- A request body larger than ``max_body`` bytes gets ``413`` before the app sees it.

Every refusal is a JSON body ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

import hmac
import json
import re
from typing import Final
from urllib.parse import parse_qs, urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.server._config import is_loopback

_EVENTS_PATH: Final = re.compile(r"^/v1/runs/[^/]+/events/?$")
_SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
MCP_PATH: Final = "/mcp"
"""corral's MCP endpoint (Streamable HTTP): guarded as the ``/v1/`` API is."""


async def send_error(
    send: Send, status: int, code: str, message: str, headers: list[tuple[bytes, bytes]] | None
    = None
) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *(headers or []),
        ],
    })
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


CUSTOM_HEADER: Final = "X-Corral-Request"
"""The header a client sends on a state-changing request that has no JSON body."""


def _is_json(content_type: str) -> bool:
    """``application/json`` or ``application/<anything>+json``, parameters aside."""
    media = content_type.split(";", 1)[0].strip().lower()
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


def preflighted(scope: Scope) -> bool:
    """Whether a browser would have asked the server (a CORS preflight, which corral never
    answers) before sending this request cross-site: it has a JSON content type or corral's
    custom header. A form, a ``text/plain`` body or a bodiless ``fetch`` does not."""
    if _header(scope, CUSTOM_HEADER.lower().encode()):
        return True
    return _is_json(_header(scope, b"content-type") or "")


def _host_name(host_header: str) -> str:
    """The host part of a Host header (``[::1]:8000`` → ``::1``)."""
    return urlsplit("//" + host_header).hostname or ""


def route_path(scope: Scope) -> str:
    """The request's path below the app's mount point: a mounted app's ``scope["path"]``
    still starts with the prefix it is mounted under (``root_path``), and checks keyed on
    ``/v1/`` must not be dodged by it."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        return path[len(root):] or "/"
    return path


class Guard:
    """Wraps the app; see the module docstring."""

    def __init__(self, app: ASGIApp, *, token: str | None, max_body: int,
                 loopback_only: bool = True) -> None:
        self.app = app
        self.token = token.encode() if token else None
        self.max_body = max_body
        self.loopback_only = loopback_only
        """Without a token, answer loopback Host names only (``False`` when the app that
        mounts corral authenticates requests itself)."""

    def _authorized(self, scope: Scope) -> bool:
        assert self.token is not None
        header = _header(scope, b"authorization") or ""
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(
            value.strip().encode("utf-8", "surrogateescape"), self.token
        ):
            return True
        if scope["method"] == "GET" and _EVENTS_PATH.match(route_path(scope)):
            query = parse_qs(bytes(scope.get("query_string", b"")).decode("latin-1"))
            for candidate in query.get("token", []):
                if hmac.compare_digest(candidate.encode("utf-8", "surrogateescape"),
                                       self.token):
                    return True
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = route_path(scope)
        method: str = scope["method"]
        host = _header(scope, b"host") or ""
        if (self.token is None and self.loopback_only and host
                and not is_loopback(_host_name(host))):
            await send_error(send, 403, "forbidden_host",
                             f"Host {host!r} is not a loopback name; this server has no token "
                             "configured and answers only http://127.0.0.1 or localhost")
            return
        if path.startswith("/v1/") or path == MCP_PATH or path.startswith(MCP_PATH + "/"):
            if self.token is not None and not self._authorized(scope):
                await send_error(
                    send, 401, "unauthorized",
                    "missing or wrong bearer token: send Authorization: Bearer <token> "
                    "(the server's CORRAL_API_TOKEN)",
                    [(b"www-authenticate", b'Bearer realm="corral"')],
                )
                return
            origin = _header(scope, b"origin")
            if method not in _SAFE_METHODS and origin is not None and (
                    origin == "null" or urlsplit(origin).netloc.lower() != host.lower()):
                # "null" is what sandboxed iframes, data: pages and redirects send: foreign
                await send_error(send, 403, "cross_origin",
                                 f"requests from origin {origin!r} are not accepted; "
                                 "use the API from the server's own page or without a "
                                 "browser")
                return
            if method not in _SAFE_METHODS and self.token is None and not preflighted(scope):
                await send_error(send, 403, "cross_site_request",
                                 f"{method} {path} needs Content-Type: application/json or "
                                 f"the header {CUSTOM_HEADER}: 1 (what a web page on another "
                                 "site cannot send without asking first)")
                return
        if method in _SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None:
            try:
                too_big = int(declared) > self.max_body
            except ValueError:
                await send_error(send, 400, "invalid_request", "Content-Length is not a number")
                return
            if too_big:
                await self._too_large(send)
                return
        # Read the body here (bounded) and replay it, so no handler ever sees more.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                await self._too_large(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return dict(await receive())

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send) -> None:
        await send_error(send, 413, "body_too_large",
                         f"request body larger than {self.max_body} bytes")
