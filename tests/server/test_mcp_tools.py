"""corral's MCP tools driven by the MCP SDK's own client (``mcp.client``): over stdio
(``corral mcp`` as a subprocess) and over Streamable HTTP (``/mcp`` under a real ``corral
serve``, with a token and without one). Each session starts a run, reads it to its end page
by page, starts another, cancels it, and lists runs and threads."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from tests.server.conftest import TOKEN, Home, ticker, ticker_text

pytestmark = pytest.mark.timeout(180)

Opener = Callable[[], AbstractAsyncContextManager[ClientSession]]


async def call(session: ClientSession, tool: str, **args: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, args)
    assert not result.is_error, result.content
    value = result.structured_content
    assert isinstance(value, dict)
    # the same answer as text, for clients that read only content
    assert json.loads(result.content[0].text) == value  # type: ignore[union-attr]
    return value


async def refused(session: ClientSession, tool: str, **args: Any) -> str:
    result = await session.call_tool(tool, args)
    assert result.is_error, result
    text: str = result.content[0].text  # type: ignore[union-attr]
    return text


async def exercise(open_session: Opener, home: Home) -> None:
    """What every transport must do: list the tools; start a run and read it to its end
    in pages; start a thread turn; cancel a long run; list runs and threads."""
    async with open_session() as session:
        await session.initialize()
        names = {t.name for t in (await session.list_tools()).tools}
        assert names == {"start_run", "run_events", "get_run", "list_runs", "list_threads",
                         "list_approvals", "approve", "cancel_run"}

        started = await call(session, "start_run", command=ticker(12, 0.02), thread_id="th")
        run_id = started["run_id"]
        assert started["thread_id"] == "th"
        events: list[dict[str, Any]] = []
        after, pages = 0, 0
        while True:
            page = await call(session, "run_events", run_id=run_id, after=after, limit=5,
                              wait=5)
            pages += 1
            assert [e["offset"] for e in page["events"]] == list(
                range(after + 1, page["next"] + 1))
            events += [e["event"] for e in page["events"]]
            after = page["next"]
            if page["done"]:
                break
            assert pages < 500
        assert pages > 1  # paged, not one answer
        assert page["status"] == "completed"
        assert events == home.log(run_id)
        said = "".join(e.get("delta", "") for e in events
                       if e["type"] == "TEXT_MESSAGE_CONTENT")
        assert said == ticker_text(12)

        # a second turn of the same thread, and a long one to cancel
        turn = await call(session, "start_run", command=["echo", "again"], thread_id="th")
        long = await call(session, "start_run", command=ticker(2000, 0.05))
        cancelled = await call(session, "cancel_run", run_id=long["run_id"])
        assert cancelled["status"] == "aborted"
        tail = await call(session, "run_events", run_id=long["run_id"], after=0, limit=1000)
        assert tail["done"] and tail["events"][-1]["event"]["type"] == "RUN_ERROR"

        listed = await call(session, "list_runs", thread_id="th")
        assert {r["run_id"] for r in listed["runs"]} == {run_id, turn["run_id"]}
        threads = (await call(session, "list_threads"))["threads"]
        by_id = {t["thread_id"]: t for t in threads}
        assert by_id["th"]["runs"] == 2 and by_id["th"]["latest_run_id"] == turn["run_id"]
        assert long["thread_id"] in by_id
        assert (await call(session, "get_run", run_id=run_id))["status"] == "completed"

        # bad input: one clear message, no traceback, nothing started
        assert "no run" in await refused(session, "get_run", run_id="run-nope")
        assert "command" in await refused(session, "start_run")
        assert "shell" in await refused(session, "start_run", command=["true"], shell="x")
        assert "limit" in await refused(session, "run_events", run_id=run_id, limit=0)
        assert "not valid for run" in await refused(
            session, "approve", run_id=run_id, approval_id="forged.id", decision="allow")
        assert "workspace" in await refused(session, "start_run", command=["true"],
                                            sandbox={"workspace": "/etc"})


def test_mcp_over_stdio(home: Home, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()

    @asynccontextmanager
    async def open_session() -> AsyncIterator[ClientSession]:
        params = StdioServerParameters(command=sys.executable, args=["-m", "corral", "mcp"],
                                       env=home.env, cwd=str(work))
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            yield s

    anyio.run(exercise, open_session, home)


@pytest.mark.parametrize("token", [TOKEN, None], ids=["token", "loopback"])
def test_mcp_over_http(home: Home, token: str | None) -> None:
    with home.server(token=token) as server:
        headers = {"Authorization": f"Bearer {token}"} if token else {}

        @asynccontextmanager
        async def open_session() -> AsyncIterator[ClientSession]:
            async with httpx2.AsyncClient(headers=headers, timeout=60) as http, \
                    streamable_http_client(f"{server.url}/mcp", http_client=http) as (
                        read, write), ClientSession(read, write) as s:
                yield s

        anyio.run(exercise, open_session, home)


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "probe", "version": "1"}}}
ACCEPT = {"Accept": "application/json, text/event-stream"}


def test_mcp_over_http_is_behind_the_token(home: Home) -> None:
    with home.server(token=TOKEN) as server, httpx.Client(base_url=server.url,
                                                          timeout=30) as c:
        for auth in ({}, {"Authorization": "Bearer wrong-token-0123456789"}):
            r = c.post("/mcp", json=INIT, headers={**ACCEPT, **auth})
            assert r.status_code == 401, r.text
            assert r.json()["error"]["code"] == "unauthorized"
        ok = c.post("/mcp", json=INIT, headers={**ACCEPT, "Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200, ok.text


def test_mcp_over_http_refuses_cross_site_requests(home: Home) -> None:
    """Without a token the endpoint answers loopback only, and a web page cannot reach it:
    a foreign Origin, a non-JSON body (a form or text/plain post needs no preflight) and a
    rebinding Host are refused before the MCP layer sees the request."""
    with home.server() as server, httpx.Client(base_url=server.url, timeout=30) as c:
        foreign = c.post("/mcp", json=INIT, headers={**ACCEPT, "Origin": "http://evil.test"})
        assert foreign.status_code == 403 and foreign.json()["error"]["code"] == "cross_origin"
        text = c.post("/mcp", content=json.dumps(INIT),
                      headers={**ACCEPT, "Content-Type": "text/plain"})
        assert text.status_code == 403, text.text
        assert text.json()["error"]["code"] == "cross_site_request"
        rebound = c.post("/mcp", json=INIT, headers={**ACCEPT, "Host": "evil.test"})
        assert rebound.status_code == 403
        assert rebound.json()["error"]["code"] == "forbidden_host"
        ok = c.post("/mcp", json=INIT, headers=ACCEPT)
        assert ok.status_code == 200, ok.text
