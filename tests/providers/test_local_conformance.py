"""The provider conformance suite against the local provider."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.providers._local import LocalProvider
from corral.testing._providers import ProviderConformance


class TestLocalProvider(ProviderConformance):
    @pytest.fixture
    def provider(self, corral_home: Path) -> LocalProvider:
        return LocalProvider()
