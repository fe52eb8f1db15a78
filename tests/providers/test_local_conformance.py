"""The provider kit against the local provider."""

from __future__ import annotations

from corral.providers._local import LocalProvider
from corral.testing import PROVIDER_KIT, pytest_checks

pytest_checks(PROVIDER_KIT, LocalProvider, globals(), usefixtures=["corral_home"])
