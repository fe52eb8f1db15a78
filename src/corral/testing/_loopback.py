"""A loopback TCP port piped to a unix socket: how an agent in a sandbox reaches a host
service (the in-sandbox entry does this inside the sandbox), for tests and benchmarks that
talk to a run's unix-socket servers from the host."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc

__all__ = ["tcp_to_unix"]


async def _pipe(src: anyio.abc.ByteStream, dst: anyio.abc.ByteStream) -> None:
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        try:
            async for chunk in src:
                await dst.send(chunk)
        finally:
            await dst.send_eof()


@asynccontextmanager
async def tcp_to_unix(sock: str | os.PathLike[str]) -> AsyncIterator[int]:
    """Listen on a free 127.0.0.1 port while the block runs, piping every connection to a
    new connection to ``sock``; yields the port. A connection when nothing serves ``sock``
    (or the service goes) is closed, as the in-sandbox entry does after its patience."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port: int = listener.extra(anyio.abc.SocketAttribute.local_port)

    async def forward(client: anyio.abc.SocketStream) -> None:
        async with client:
            try:
                upstream = await anyio.connect_unix(sock)
            except OSError:
                return
            async with upstream, anyio.create_task_group() as tg:
                tg.start_soon(_pipe, client, upstream)
                tg.start_soon(_pipe, upstream, client)

    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, forward)
        try:
            yield port
        finally:
            tg.cancel_scope.cancel()
