"""The provider kit against the bubblewrap provider."""

from __future__ import annotations

import pytest

from corral.providers._bubblewrap import BubblewrapProvider
from corral.testing import PROVIDER_KIT, pytest_checks

pytest_checks(PROVIDER_KIT, BubblewrapProvider, globals(),
              usefixtures=["corral_home", "need_bwrap"])


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Both anyio backends: the kit and the code under it are anyio code."""
    return str(request.param)
