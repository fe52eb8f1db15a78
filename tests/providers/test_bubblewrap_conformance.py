"""The provider conformance suite against the bubblewrap provider."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.providers._bubblewrap import BubblewrapProvider
from corral.testing._providers import ProviderConformance


class TestBubblewrapProvider(ProviderConformance):
    @pytest.fixture
    def provider(self, corral_home: Path, need_bwrap: None) -> BubblewrapProvider:
        return BubblewrapProvider()
