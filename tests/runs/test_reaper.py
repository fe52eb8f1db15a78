"""The shipped reaper kit, run against the memory and SQLite backends."""

from __future__ import annotations

import pytest

from corral.testing import REAPER_KIT, pytest_checks
from tests.helpers import STORE_FACTORIES

pytest_checks(REAPER_KIT, STORE_FACTORIES, globals())


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Both anyio backends: the kit and the code under it are anyio code."""
    return str(request.param)
