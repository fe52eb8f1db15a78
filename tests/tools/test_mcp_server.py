"""The per-run MCP server, through a unix socket, with the SDK's own client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import MCPError

from corral.tools import ToolContext, Toolset, tool
from corral.tools._mcp_server import HostToolServer

from .mcp_client import mcp_client

pytestmark = pytest.mark.anyio

ran: list[str] = []


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    ran.append("add")
    return a + b


@tool
def who(ctx: ToolContext, x: str) -> dict[str, str | None]:
    ran.append("who")
    return {"run": ctx.run_id, "x": x}


@tool
async def slow() -> str:
    ran.append("slow")
    await anyio.sleep(30)
    return "late"


@tool
def crash() -> None:
    raise ValueError("nope")


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[HostToolServer, str]]:
    ran.clear()
    srv = HostToolServer(Toolset([add, who, slow, crash]), run_id="run-1", call_timeout=0.5,
                         max_body=4096)
    sock = tmp_path / "tools.sock"
    async with anyio.create_task_group() as tg:
        await tg.start(srv.serve, sock)
        yield srv, str(sock)
        tg.cancel_scope.cancel()
    assert not sock.exists()


async def test_list_and_call(server: tuple[HostToolServer, str]) -> None:
    srv, sock = server
    with anyio.fail_after(30):
        async with mcp_client(sock, srv.token) as c:
            assert c.server_info is not None and c.server_info.name == "corral"
            listed = {t.name: t for t in (await c.list_tools()).tools}
            assert set(listed) == {"add", "who", "slow", "crash"}
            assert listed["add"].description == "Add two integers."
            assert listed["add"].input_schema["required"] == ["a", "b"]
            r = await c.call_tool("add", {"a": 2, "b": 40})
            assert not r.is_error and r.content[0].text == "42"  # type: ignore[union-attr]
            r = await c.call_tool("who", {"x": "y"})
            assert r.content[0].text == '{"run": "run-1", "x": "y"}'  # type: ignore[union-attr]
            bad = await c.call_tool("add", {"a": "two", "b": 1})
            assert bad.is_error and "a:" in bad.content[0].text  # type: ignore[union-attr]
            err = await c.call_tool("crash", {})
            assert err.is_error
            assert "ValueError: nope" in err.content[0].text  # type: ignore[union-attr]
            unknown = await c.call_tool("nope", {})
            assert unknown.is_error and "unknown host tool" in unknown.content[0].text  # type: ignore[union-attr]
    assert ran == ["add", "who"]
    assert srv.calls == 2


async def test_modern_protocol_client_works_too(server: tuple[HostToolServer, str]) -> None:
    srv, sock = server
    with anyio.fail_after(30):
        async with mcp_client(sock, srv.token, mode="auto") as c:
            r = await c.call_tool("add", {"a": 1, "b": 1})
            assert r.content[0].text == "2"  # type: ignore[union-attr]


@pytest.mark.parametrize("token", [None, "wrong-token-wrong-token-wrong"])
async def test_refused_without_the_token(server: tuple[HostToolServer, str],
                                         token: str | None) -> None:
    srv, sock = server
    with anyio.fail_after(30), pytest.raises(Exception) as e:  # noqa: B017, PT011
        async with mcp_client(sock, token) as c:
            await c.call_tool("add", {"a": 1, "b": 2})
    assert _has_mcp_error(e.value)
    assert ran == [] and srv.calls == 0
    assert srv.refused >= 1


def _has_mcp_error(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return any(_has_mcp_error(x) for x in exc.exceptions)
    return isinstance(exc, MCPError)


CALL = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "add", "arguments": {"a": 1, "b": 2}}}


async def test_refusals_on_the_wire(server: tuple[HostToolServer, str]) -> None:
    srv, sock = server
    headers = {"accept": "application/json, text/event-stream",
               "mcp-protocol-version": "2025-06-18"}
    async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=sock),
                                 base_url="http://127.0.0.1", timeout=20) as http:
        r = await http.post("/mcp", json=CALL, headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        r = await http.post("/mcp", json=CALL, headers={
            **headers, "authorization": "Bearer " + srv.token[:-1] + "x"})
        assert r.status_code == 401
        r = await http.post("/mcp", headers={**headers, "authorization": "bearer " + srv.token},
                            json=CALL)
        assert r.status_code == 401  # exact scheme and token only
        big = {**CALL, "params": {"name": "add", "arguments": {"a": 1, "b": 2,
                                                              "pad": "x" * 5000}}}
        auth = {**headers, "authorization": "Bearer " + srv.token}
        r = await http.post("/mcp", json=big, headers=auth)
        assert r.status_code == 413

        async def chunked() -> AsyncIterator[bytes]:  # no content-length: streamed limit
            for _ in range(10):
                yield b" " * 1000

        r = await http.post("/mcp", content=chunked(), headers=auth)
        assert r.status_code == 413
    assert ran == [] and srv.calls == 0
    assert srv.refused == 5


async def test_oversized_body_is_refused(server: tuple[HostToolServer, str]) -> None:
    srv, sock = server
    with anyio.fail_after(30):
        async with mcp_client(sock, srv.token) as c:
            before = srv.refused
            with pytest.raises(MCPError):
                await c.call_tool("who", {"x": "z" * 10_000})
            assert srv.refused == before + 1
            assert ran == [] and srv.calls == 0
            r = await c.call_tool("who", {"x": "small"})  # the connection still works
            assert not r.is_error


async def test_slow_tool_times_out(server: tuple[HostToolServer, str]) -> None:
    srv, sock = server
    with anyio.fail_after(30):
        async with mcp_client(sock, srv.token) as c:
            r = await c.call_tool("slow", {})
            assert r.is_error
            assert "longer than its 0.5s timeout" in r.content[0].text  # type: ignore[union-attr]
    assert ran == ["slow"] and srv.calls == 0
