"""The store suites run on both anyio backends: the stores are anyio code, and a backend
that only works on asyncio would break every trio application embedding corral."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A PostgreSQL store URL for a fresh schema, dropped afterwards."""
    from tests.helpers import pg_schema_url

    with pg_schema_url() as url:
        yield url
