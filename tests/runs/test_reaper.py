"""The shipped reaper kit, run against the memory and SQLite backends."""

from __future__ import annotations

from corral.testing import REAPER_KIT, pytest_checks
from tests.helpers import STORE_FACTORIES

pytest_checks(REAPER_KIT, STORE_FACTORIES, globals())
