"""Store conformance kit: the :class:`~corral.abc.Store` contract, as plain checks.

Every backend (memory, SQLite, and third-party ones) must pass it::

    from corral.testing import check_store

    async def make_store():
        return await open_my_store()      # closed with aclose() after each check

    report = await check_store(make_store)   # raises KitFailed naming each failed check

Each check gets a fresh, empty store from the factory. The checks cover run records
(create, resume, patch semantics, queries), ``list_runs``, driver claims (leases, epochs,
refusals: the fencing a takeover relies on), the event log (append under the epoch fence,
read/tail, close, snapshot), sandbox instance records, named locks, approval requests and
their answers (first answer wins), corral's shared secrets, deleting an ended run (and
refusing one that has not ended) and a thread's head in one read. They use anyio and
run on asyncio or trio. ``corral.testing.pytest_checks(STORE_KIT, ...)`` makes one pytest
test per check.
"""

from __future__ import annotations

from collections.abc import Iterable

from corral.stores._protocols import Store
from corral.testing._kit import Factory, Kit, KitReport
from corral.testing._store_approvals import APPROVAL_CHECKS
from corral.testing._store_claims import CLAIM_CHECKS
from corral.testing._store_events import EVENT_CHECKS
from corral.testing._store_instances import INSTANCE_CHECKS
from corral.testing._store_runs import RUN_CHECKS

__all__ = ["STORE_KIT", "check_store"]

STORE_KIT: Kit[Store] = Kit("store", (
    *RUN_CHECKS.checks, *CLAIM_CHECKS.checks, *EVENT_CHECKS.checks, *INSTANCE_CHECKS.checks,
    *APPROVAL_CHECKS.checks,
))
"""Every store check, one part (``_store_*``: a module per protocol) after another; the
subject is the store the factory makes."""


async def check_store(make_store: Factory, *, only: Iterable[str] | None = None) -> KitReport:
    """Run the store kit against stores made by ``make_store`` (one fresh store per check);
    raise :class:`~corral.testing.KitFailed` naming every failed check, else return the
    report. ``only`` names the checks to run (all by default)."""
    return await STORE_KIT.verify(make_store, only=only)
