"""The shipped store and pipe kits, run against the memory and SQLite backends."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from corral.stores import open_store
from corral.stores._protocols import Store
from corral.testing import PIPE_KIT, STORE_KIT, pytest_checks


async def memory_store() -> Store:
    return await open_store("memory://")


@asynccontextmanager
async def sqlite_store() -> AsyncIterator[Store]:
    with tempfile.TemporaryDirectory(prefix="corral-kit-") as tmp:
        store = await open_store(f"sqlite://{Path(tmp) / 'corral.db'}")
        try:
            yield store
        finally:
            await store.aclose()


STORES = {"memory": memory_store, "sqlite": sqlite_store}

pytest_checks(STORE_KIT, STORES, globals())
pytest_checks(PIPE_KIT, STORES, globals())
