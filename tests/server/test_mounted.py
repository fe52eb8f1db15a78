"""corral mounted in a web app: examples/fastapi_app (a FastAPI app with its own users)
serves corral under /corral; its authentication decides who gets in, its lifespan runs
corral's drives, and AG-UI's HttpAgent works against the mounted endpoint."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

from corral.server import ServerConfig, create_app
from corral.testing import wait_until
from tests.server.conftest import Home, Server, ticker, uvicorn_server
from tests.server.test_agui_client import run_http_agent

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fastapi_app"
ALICE = "alice-token-0123456789"  # the example app's own user


@pytest.fixture
def mounted(home: Home) -> Iterator[Server]:
    """The example app under uvicorn; ``url`` is corral's prefix, the token alice's."""
    env = {**home.env, "CORRAL_STORE": f"sqlite:///{home.db}"}
    with uvicorn_server("app:app", env, "/corral", ALICE, app_dir=EXAMPLE) as server:
        yield server


def test_the_host_apps_authentication_guards_every_corral_route(mounted: Server) -> None:
    with httpx.Client(base_url=mounted.url, timeout=30) as anonymous:
        for method, path in [("GET", "/v1/runs"), ("POST", "/v1/runs"),
                             ("GET", "/v1/runs/x/events"), ("POST", "/v1/agui"), ("GET", "/"),
                             ("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/redoc")]:
            r = anonymous.request(method, path, json={})
            assert r.status_code == 401, (method, path, r.text)
        wrong = anonymous.get("/v1/runs", headers={"Authorization": "Bearer not-a-user"})
        assert wrong.status_code == 401
    with mounted.client() as c:
        assert c.get("/v1/runs").status_code == 200
        assert "/v1/runs" in c.get("/openapi.json").json()["paths"]
        for path in ("/docs", "/redoc"):
            page = c.get(path)
            assert page.status_code == 200 and "static/docs.js" in page.text
            assert "cdn" not in page.text.lower() and "https://" not in page.text


def test_the_api_reference_loads_offline_in_a_browser(mounted: Server, page_driver: Path,
                                                      screenshots: Path) -> None:
    """/docs and /redoc in headless Chromium: every operation of openapi.json shown, no
    request leaves the app's origin (the assets are bundled), readable on a phone."""
    with mounted.client() as c:
        spec = c.get("/openapi.json").json()
    expected = sum(len(item) for item in spec["paths"].values())
    done = subprocess.run(["node", "docs.mjs", mounted.url, ALICE, str(screenshots)],
                          capture_output=True, text=True, timeout=300, cwd=page_driver)
    assert done.returncode == 0, done.stderr + "".join(mounted.log)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["operations"] == expected == out["redocOperations"]
    assert "POST /v1/runs" in out["toc"] and "GET /v1/harnesses" in out["toc"]
    assert out["title"].startswith("corral ") and out["title"].endswith(" API reference")
    assert out["foreignRequests"] == [] and out["errors"] == [] and out["phoneErrors"] == []
    assert out["phoneOverflow"] is False
    assert (screenshots / "docs.png").stat().st_size > 0


def test_a_run_under_the_mount_is_driven_by_the_host_apps_lifespan(home: Home,
                                                                   mounted: Server) -> None:
    created = mounted.start(ticker(5, 0.01), thread_id="mt")
    # links point under the mount
    assert created["events_url"] == f"/corral/v1/runs/{created['run_id']}/events"
    wait_until(lambda: mounted.run(created["run_id"])["status"] == "completed",
               "the mounted app's drive to finish the run")
    with httpx.Client(base_url=mounted.url.removesuffix("/corral"), timeout=30,
                      headers=mounted.headers) as c:
        body = c.get(created["events_url"]).text
    streamed = [json.loads(line[len("data: "):]) for line in body.splitlines()
                if line.startswith("data: ")]
    assert streamed == home.log(created["run_id"])


def test_http_agent_against_the_mounted_agui_endpoint(home: Home, mounted: Server,
                                                      e2e: Path) -> None:
    events, result = run_http_agent(
        e2e, f"{mounted.url}/v1/agui", "mt-agui", "mt-agui-1", "unused",
        {"corral": {"command": ["echo", "from the mount"]}}, token=ALICE)
    assert events == home.log("mt-agui-1")
    said = [m for m in result["newMessages"] if m["role"] == "assistant"]
    assert "".join(m["content"] for m in said) == "from the mount\n"


@pytest.mark.anyio
async def test_a_mount_prefix_does_not_dodge_the_token() -> None:
    """The guard keys on ``/v1/``; a mounted app's path still starts with its prefix."""
    token = "a-token-that-is-long-enough"
    host = Starlette(routes=[Mount("/corral", create_app(config=ServerConfig(token=token)))])
    transport = httpx.ASGITransport(app=host)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        r = await c.get("/corral/v1/runs")
        assert r.status_code == 401, r.text
        r = await c.get("/corral/v1/runs/x/events", params={"token": "wrong"})
        assert r.status_code == 401, r.text
