"""The store suites run on both anyio backends: the stores are anyio code, and a backend
that only works on asyncio would break every trio application embedding corral."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)
