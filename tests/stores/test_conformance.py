"""The shipped store and pipe kits, run against the memory and SQLite backends."""

from __future__ import annotations

from corral.testing import PIPE_KIT, STORE_KIT, pytest_checks
from tests.helpers import STORE_FACTORIES

pytest_checks(STORE_KIT, STORE_FACTORIES, globals())
pytest_checks(PIPE_KIT, STORE_FACTORIES, globals())
