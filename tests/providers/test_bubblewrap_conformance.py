"""The provider kit against the bubblewrap provider."""

from __future__ import annotations

from corral.providers._bubblewrap import BubblewrapProvider
from corral.testing import PROVIDER_KIT, pytest_checks

pytest_checks(PROVIDER_KIT, BubblewrapProvider, globals(),
              usefixtures=["corral_home", "need_bwrap"])
