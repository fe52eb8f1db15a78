"""The host tool endpoints' front door: bearer token and body size checked before any
application code runs, and serving an ASGI app on a unix socket under uvicorn.

The guard answers 401 for a missing or wrong token (compared in constant time with
:func:`hmac.compare_digest`) and 413 for a body over the limit (declared or streamed),
so a refused request never reaches a tool.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import socket
import stat
from collections.abc import Awaitable, Callable, Generator, MutableMapping
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import uvicorn

from corral._errors import ConfigError
from corral._paths import apply_socket_access

__all__ = ["ASGIApp", "RequestGuard", "json_error", "serve_unix"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def json_error(send: Send, status: int, message: str,
                      headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"error": {"message": message}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


class RequestGuard:
    """ASGI middleware: bearer token (401) and request body limit (413) before ``app``.

    ``refused`` counts refused requests (for metrics and tests)."""

    def __init__(self, app: ASGIApp, *, token: str, max_body: int = 1 << 20) -> None:
        if len(token) < 16:
            raise ConfigError("the host tool token must be at least 16 characters")
        self.app = app
        self._expected = f"Bearer {token}".encode()
        self.max_body = max_body
        self.refused = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # no websockets
            return
        auth = b""
        length: int | None = None
        for k, v in scope.get("headers", []):
            if k == b"authorization":
                auth = v
            elif k == b"content-length":
                try:
                    length = int(v)
                except ValueError:
                    length = None
        if not hmac.compare_digest(auth, self._expected):
            self.refused += 1
            await json_error(send, 401, "missing or wrong bearer token",
                              [(b"www-authenticate", b"Bearer")])
            return
        if length is not None and length > self.max_body:
            self.refused += 1
            await json_error(send, 413, f"request body over {self.max_body} bytes")
            return
        # Read the whole body first: a chunked body over the limit is refused before the
        # application sees any of it.
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                self.refused += 1
                await json_error(send, 413, f"request body over {self.max_body} bytes")
                return
            chunks.append(chunk)
            more = bool(msg.get("more_body", False))
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its signal handlers: the host process owns SIGINT/SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def _bind(path: Path) -> socket.socket:
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise ConfigError(f"{path} exists and is not a socket; remove it")
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        # Before it listens (nobody connects in between): the directory decides who may
        # reach it (a run's socket directory admits the sandbox's ids only).
        apply_socket_access(path)
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


async def serve_unix(app: ASGIApp, path: str | os.PathLike[str], *,
                     task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                     ) -> None:
    """Serve ``app`` on a unix socket until cancelled. ``task_status.started()`` once the
    socket listens (connections made from then on are queued, never refused). The socket
    file is removed on exit."""
    sock_path = Path(path)
    sock = _bind(sock_path)
    config = uvicorn.Config(app, lifespan="on", log_config=None, log_level="warning",
                            access_log=False, proxy_headers=False,
                            timeout_graceful_shutdown=1)
    server = _EmbeddedServer(config)
    try:
        async with anyio.create_task_group() as tg:
            async def run() -> None:
                # Shielded: on cancellation uvicorn is told to exit and shuts down
                # (bounded to a second) instead of being torn mid-request.
                with anyio.CancelScope(shield=True):
                    await server.serve(sockets=[sock])
                tg.cancel_scope.cancel()  # stopped by itself: so does this task

            tg.start_soon(run)
            task_status.started()
            try:
                await anyio.sleep_forever()
            finally:
                server.should_exit = True
    finally:
        sock.close()
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.lstat(sock_path).st_mode):
                os.unlink(sock_path)
