"""A real MCP client (the SDK's) talking Streamable HTTP over a unix socket."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


@contextlib.asynccontextmanager
async def mcp_client(sock: str, token: str | None, *, mode: str = "legacy",
                     timeout: float = 20.0) -> AsyncIterator[Client]:
    headers = {"authorization": f"Bearer {token}"} if token is not None else {}
    http = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=sock),
                              headers=headers, timeout=timeout)
    async with http, Client(streamable_http_client("http://127.0.0.1/mcp", http_client=http),
                            mode=mode, read_timeout_seconds=timeout) as client:
        yield client
