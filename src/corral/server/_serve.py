"""Running the app under uvicorn: bind, serve, and stop streams promptly on shutdown."""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Callable
from typing import Final

import anyio
import uvicorn

from corral._errors import ConfigError
from corral.server._app import create_app
from corral.server._config import ServerConfig
from corral.server._service import RunService
from corral.server._sse import encode_event
from corral.stores import open_store

GRACEFUL_SHUTDOWN: Final = 5

# The event stream also takes the API token as ?token= (EventSource cannot send headers):
# the access log must never write it.
_TOKEN_IN_QUERY: Final = re.compile(r"((?:^|[?&])token=)[^&#\s]*", re.IGNORECASE)


class _RedactTokens(logging.Filter):
    """Replaces a ``token=`` query value in uvicorn's access-log lines with ``***``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                _TOKEN_IN_QUERY.sub(r"\1***", a) if isinstance(a, str) else a for a in record.args
            )
        record.msg = _TOKEN_IN_QUERY.sub(r"\1***", str(record.msg))
        return True


_REDACT_TOKENS: Final = _RedactTokens()


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: any free port)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError(f"cannot resolve --host {host!r}: {exc}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


async def serve_async(
    config: ServerConfig,
    *,
    sock: socket.socket | None = None,
    ready: Callable[[str], None] | None = None,
    log_level: str = "warning",
    server_box: list[uvicorn.Server] | None = None,
) -> None:
    """Serve until the process is asked to stop (SIGINT/SIGTERM, or ``should_exit`` set on
    the server handed out through ``server_box``). ``ready(url)`` is called once the server
    accepts connections. uvicorn's loggers (``uvicorn.error``, and ``uvicorn.access`` at
    ``info`` or ``debug``: one line per request, tokens redacted) propagate to the process's
    own logging configuration, so every line has the host program's format."""
    config.validate()
    access = logging.getLogger("uvicorn.access")
    if _REDACT_TOKENS not in access.filters:
        access.addFilter(_REDACT_TOKENS)
    sock = sock or bind(config.host, config.port)
    store = await open_store(config.store_url)  # a bad URL fails here, as one clear line
    try:
        service = RunService(config, encode_event, store=store)
        uv = uvicorn.Config(
            create_app(service),
            lifespan="on",
            log_level=log_level,
            log_config=None,  # no handlers of uvicorn's own: one format, the host's
            access_log=log_level in ("debug", "info"),
            proxy_headers=False,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN,
        )
        server = uvicorn.Server(uv)
        if server_box is not None:
            server_box.append(server)
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                while not server.started:
                    if server.should_exit:
                        return
                    await anyio.sleep(0.02)
                if ready is not None:
                    ready(url_of(sock))
                while not server.should_exit:
                    await anyio.sleep(0.1)
                service.begin_shutdown()  # event streams end, so uvicorn need not wait

            tg.start_soon(watch)
            await server.serve(sockets=[sock])
            tg.cancel_scope.cancel()
        if not server.started:
            raise ConfigError("the server did not start; the log above says why")
    finally:
        with anyio.CancelScope(shield=True):
            await store.aclose()
        sock.close()
