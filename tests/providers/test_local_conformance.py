"""The provider kit against the local provider."""

from __future__ import annotations

import pytest

from corral.providers._local import LocalProvider
from corral.testing import PROVIDER_KIT, pytest_checks

pytest_checks(PROVIDER_KIT, LocalProvider, globals(), usefixtures=["corral_home"])


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Both anyio backends: the kit and the code under it are anyio code."""
    return str(request.param)
