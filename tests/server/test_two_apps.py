"""Two corral apps in one process share nothing (``create_app``'s promise): the routers are
module-level, but each app answers from its own service (``app.state``), store, guard, host
``auth``, MCP endpoint and OpenAPI schema. A run started through one app is invisible
through the other, over the API and over ``/mcp``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import Request

from corral.server import ServerConfig, create_app
from corral.testing import wait_until_async

pytestmark = pytest.mark.timeout(120)

TOKEN_A = "app-a-token-0123456789abcdef"


def only_bob(request: Request) -> bool:
    """App B's host authentication: the user is in a header the host app trusts."""
    return request.headers.get("x-user") == "bob"


async def mcp_runs(client: httpx.AsyncClient) -> list[str]:
    """The run ids ``list_runs`` answers over the app's ``/mcp``."""
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "list_runs", "arguments": {}}}
    r = await client.post("/mcp", json=call,
                          headers={"Accept": "application/json, text/event-stream"})
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()["result"]
    assert not result.get("isError"), result
    return [run["run_id"] for run in json.loads(result["content"][0]["text"])["runs"]]


@pytest.mark.anyio
async def test_two_apps_in_one_process_share_nothing(tmp_path: Path,
                                                     need_bwrap_runs: None) -> None:
    a = create_app(config=ServerConfig(store_url=f"sqlite://{tmp_path / 'a.db'}",
                                       token=TOKEN_A))
    b = create_app(config=ServerConfig(store_url=f"sqlite://{tmp_path / 'b.db'}"),
                   auth=only_bob)
    as_a = {"Authorization": f"Bearer {TOKEN_A}", "X-Corral-Request": "1"}
    as_bob = {"X-User": "bob", "X-Corral-Request": "1"}
    async with a.running(), b.running(), \
            httpx.AsyncClient(transport=httpx.ASGITransport(app=a), headers=as_a,
                              base_url="http://127.0.0.1", timeout=30) as ca, \
            httpx.AsyncClient(transport=httpx.ASGITransport(app=b), headers=as_bob,
                              base_url="http://127.0.0.1", timeout=30) as cb:
        created = await ca.post("/v1/runs", json={"thread_id": "t", "command": ["echo", "a"]})
        assert created.status_code == 201, created.text
        run_id = created.json()["run_id"]

        async def ended() -> bool:
            return bool((await ca.get(f"/v1/runs/{run_id}")).json()["status"] == "completed")

        await wait_until_async(ended, "app A's drive to finish its run")
        assert [r["run_id"] for r in (await ca.get("/v1/runs")).json()["runs"]] == [run_id]
        assert await mcp_runs(ca) == [run_id]

        # app B: its own store, so none of A's run, thread or events
        missing = await cb.get(f"/v1/runs/{run_id}")
        assert missing.status_code == 404, missing.text
        assert missing.json()["error"]["code"] == "run_not_found"
        assert (await cb.get(f"/v1/runs/{run_id}/events")).status_code == 404
        assert (await cb.get("/v1/threads/t/active")).status_code == 404
        assert (await cb.get("/v1/runs")).json() == {"runs": []}
        assert (await cb.get("/v1/threads")).json() == {"threads": []}
        assert await mcp_runs(cb) == []

        # each app its own guard: A's token does not open B, nor B's user A
        assert (await cb.get("/v1/runs", headers={"X-User": "eve"})).status_code == 401
        assert (await ca.get("/v1/runs", headers={"Authorization": ""})).status_code == 401
        foreign = await cb.get("/v1/runs", headers={"X-User": "", **{
            "Authorization": f"Bearer {TOKEN_A}"}})
        assert foreign.status_code == 401, foreign.text

        # and its own schema: the bearer scheme is A's only
        schema_a = (await ca.get("/openapi.json")).json()
        schema_b = (await cb.get("/openapi.json")).json()
        assert "bearer" in schema_a["components"]["securitySchemes"]
        assert "securitySchemes" not in schema_b["components"]
        assert schema_a["paths"].keys() == schema_b["paths"].keys()
