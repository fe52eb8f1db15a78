"""The provider conformance suite against the local provider."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.providers.local import LocalProvider
from corral.testkit.providers import ProviderConformance


class TestLocalProvider(ProviderConformance):
    @pytest.fixture
    def provider(self, corral_home: Path) -> LocalProvider:
        return LocalProvider()
