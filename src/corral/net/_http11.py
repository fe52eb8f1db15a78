"""A small HTTP/1.1 server over anyio byte streams (h11), for the host-side proxies.

Requests are read whole (bodies up to ``max_body`` bytes); responses stream: a handler
returns a :class:`Response` whose ``body`` is bytes or an async iterator of chunks, sent
as they come (no buffering; chunked framing unless the handler gives a length). A
``CONNECT`` handler may return a response with ``tunnel`` set: after a 2xx is sent, the
raw client stream (and any bytes the client already sent) is handed to it.

Connections are kept alive between requests; the client sees a 400 for a malformed
request and a 413 for a body that is too large. Every connection is one task.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import anyio.abc
import h11

from corral._errors import ConfigError
from corral._paths import apply_socket_access

__all__ = ["Handler", "Request", "Response", "bind_unix_listener", "serve_connection",
           "serve_listener", "serve_unix"]

MAX_BODY = 64 << 20
MAX_HEAD = 64 << 10


@dataclass(slots=True)
class Request:
    """A request read in full."""

    method: str
    target: str
    headers: list[tuple[str, str]]
    """Names lower-cased, in order."""
    body: bytes
    http_version: str = "1.1"

    def header(self, name: str) -> str | None:
        name = name.lower()
        for k, v in self.headers:
            if k == name:
                return v
        return None


Tunnel = Callable[[anyio.abc.ByteStream, bytes], Awaitable[None]]


@dataclass(slots=True)
class Response:
    """A response to send. ``body`` chunks are sent as the iterator yields them."""

    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes | AsyncIterator[bytes] = b""
    tunnel: Tunnel | None = None
    """For ``CONNECT``: called with the client stream after a 2xx response."""


Handler = Callable[[Request], Awaitable[Response]]


def text_response(status: int, text: str, content_type: str = "text/plain; charset=utf-8"
                  ) -> Response:
    """A small fixed response."""
    data = text.encode()
    return Response(status, [("content-type", content_type),
                             ("content-length", str(len(data)))], data)


async def _send(stream: anyio.abc.ByteStream, data: bytes | None) -> None:
    if data:
        await stream.send(data)


async def serve_connection(stream: anyio.abc.ByteStream, handler: Handler, *,
                           max_body: int = MAX_BODY) -> None:
    """Serve HTTP/1.1 requests on one connection until it closes."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    try:
        while True:
            request = await _read_request(stream, conn, max_body)
            if request is None:
                return
            if isinstance(request, Response):  # a protocol error answer
                await _respond(stream, conn, request, head_only=False)
                return
            try:
                response = await handler(request)
            except Exception as exc:  # noqa: BLE001 - a handler bug must not kill the server
                response = text_response(502, f"corral proxy: internal error: {exc!r}")
            await _respond(stream, conn, response, head_only=request.method == "HEAD")
            if response.tunnel is not None and 200 <= response.status < 300:
                trailing, _closed = conn.trailing_data
                await response.tunnel(stream, bytes(trailing))
                return
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                return
            if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
                conn.start_next_cycle()
            else:
                return
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream,
            ConnectionError, h11.LocalProtocolError):
        return
    finally:
        with contextlib.suppress(Exception):
            await stream.aclose()


async def _read_request(stream: anyio.abc.ByteStream, conn: h11.Connection, max_body: int
                        ) -> Request | Response | None:
    head: h11.Request | None = None
    body = bytearray()
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            return text_response(exc.error_status_hint, f"bad request: {exc}")
        if event is h11.NEED_DATA:
            try:
                data = await stream.receive(65536)
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
                data = b""
            conn.receive_data(data)
            continue
        if isinstance(event, h11.Request):
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > max_body:
                return text_response(413, f"request body larger than {max_body} bytes")
        elif isinstance(event, h11.EndOfMessage):
            assert head is not None
            return Request(
                method=head.method.decode("ascii", "replace"),
                target=head.target.decode("ascii", "replace"),
                headers=[(k.decode("latin-1").lower(), v.decode("latin-1"))
                         for k, v in head.headers],
                body=bytes(body),
                http_version=head.http_version.decode("ascii", "replace"),
            )
        else:  # ConnectionClosed, PAUSED
            return None


async def _respond(stream: anyio.abc.ByteStream, conn: h11.Connection, response: Response,
                   *, head_only: bool) -> None:
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers]
    await _send(stream, conn.send(h11.Response(status_code=response.status, headers=headers)))
    if response.tunnel is not None and 200 <= response.status < 300:
        return  # the connection is the tunnel's now
    body = response.body
    if isinstance(body, bytes):
        if body and not head_only:
            await _send(stream, conn.send(h11.Data(data=body)))
    else:
        try:
            async for chunk in body:
                if chunk and not head_only:
                    await _send(stream, conn.send(h11.Data(data=chunk)))
        finally:
            aclose = getattr(body, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()
    await _send(stream, conn.send(h11.EndOfMessage()))


async def serve_listener(listener: anyio.abc.Listener[anyio.abc.SocketStream], handler: Handler,
                         *, max_body: int = MAX_BODY) -> None:
    """Serve every connection of ``listener`` (one task each) until cancelled."""

    async def one(stream: anyio.abc.SocketStream) -> None:
        await serve_connection(stream, handler, max_body=max_body)

    await listener.serve(one)


async def bind_unix_listener(socket_path: str | os.PathLike[str]
                             ) -> anyio.abc.Listener[anyio.abc.SocketStream]:
    """Bind a unix socket that only those its directory admits can connect to
    (:func:`corral._paths.socket_access`: a run's socket directory admits the sandbox's
    ids). The socket listens under a temporary name first and takes its path only once
    its mode and group are set, so nobody connects in between; a stale socket at the path
    is replaced, any other file there is an error."""
    path = os.fspath(socket_path)
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(path)
        if not stat.S_ISSOCK(st.st_mode):
            raise ConfigError(f"{path} exists and is not a socket; remove it")
    # short: a socket path has at most 107 bytes
    tmp = os.path.join(os.path.dirname(path), f".b{secrets.token_hex(4)}")
    listener = await anyio.create_unix_listener(tmp, mode=0o600)
    try:
        apply_socket_access(tmp)
        os.replace(tmp, path)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await listener.aclose()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return listener


async def serve_unix(socket_path: str | os.PathLike[str], handler: Handler, *,
                     task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
                     max_body: int = MAX_BODY) -> None:
    """Serve ``handler`` on a unix socket until cancelled (``task_status.started()`` once
    bound); the socket file goes when it stops."""
    listener = await bind_unix_listener(socket_path)
    try:
        task_status.started()
        await serve_listener(listener, handler, max_body=max_body)
    finally:
        with anyio.CancelScope(shield=True):
            await listener.aclose()
            with contextlib.suppress(OSError):
                os.unlink(socket_path)
