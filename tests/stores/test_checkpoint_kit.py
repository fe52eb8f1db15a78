"""The checkpoint kit (#27) on the memory, SQLite and PostgreSQL stores, asyncio and trio."""

from __future__ import annotations

from corral.testing import CHECKPOINT_KIT, pytest_checks
from tests.helpers import STORE_FACTORIES

pytest_checks(CHECKPOINT_KIT, STORE_FACTORIES, globals())
