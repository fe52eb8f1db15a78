"""Store fixtures for durable-run tests: every suite runs against memory and SQLite."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.runs.store import Store
from corral.stores import open_store


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    url = "memory://" if request.param == "memory" else f"sqlite://{tmp_path / 'corral.db'}"
    s = await open_store(url)
    try:
        yield s
    finally:
        await s.aclose()
