"""The agent page test's server: corral mounted under ``/corral`` in a Starlette app whose
runner offers agents one host tool that waits for a human's approval (``deploy``), so the
page's Allow / Deny buttons answer a real Claude Code run's tool call.

    CORRAL_STORE=sqlite:///tmp/x.db CORRAL_API_TOKEN=... python -m uvicorn tests.agents.page_app:app
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.types import ASGIApp, Receive, Scope, Send

from corral.runs import Runner
from corral.server import ServerConfig, create_app
from corral.stores import open_store
from corral.tools import Toolset, tool


@tool(approval=True)
def deploy(env: str) -> str:
    """Deploy to an environment (a human approves first)."""
    return f"deployed to {env}"


class _Later:
    """The corral app, made in the lifespan (its runner needs the opened store)."""

    app: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert self.app is not None
        await self.app(scope, receive, send)


corral = _Later()


@asynccontextmanager
async def lifespan(_: Starlette) -> AsyncIterator[None]:
    store = await open_store(os.environ["CORRAL_STORE"])
    try:
        app = create_app(runner=Runner(store, tools=Toolset([deploy]), approval_timeout=120),
                         config=ServerConfig(token=os.environ["CORRAL_API_TOKEN"]))
        corral.app = app
        async with app.running():
            yield
    finally:
        await store.aclose()


app = Starlette(lifespan=lifespan, routes=[Mount("/corral", app=corral)])
