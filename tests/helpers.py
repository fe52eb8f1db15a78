"""Small helpers the test suites share (importable functions, not fixtures)."""

from __future__ import annotations

import atexit
import contextlib
import base64
import os
import sqlite3
import subprocess
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from corral.stores import open_store
from corral.testing._hello import LoopbackHello
from corral.stores._protocols import Store
from corral.testing import wait_until, wait_until_async

__all__ = [
    "POSTGRES_ADMIN_URL",
    "STORE_FACTORIES",
    "HelloServer",
    "assert_secret_only_in_secrets_table",
    "drop_postgres_database",
    "drop_postgres_schema",
    "memory_store",
    "one_line_refusal",
    "pg_opened",
    "pg_schema_url",
    "pg_sql",
    "pg_log",
    "postgres_database_url",
    "postgres_schema",
    "postgres_store",
    "sqlite_store",
    "wait_until",
    "wait_until_async",
]


def one_line_refusal(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    """A user mistake's answer: non-zero exit, one line on stderr holding every needle,
    never a traceback."""
    assert r.returncode != 0, r.stdout
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for needle in needles:
        assert needle in r.stderr, r.stderr


def trusted(workspace: Path) -> tuple[str, str]:
    """``--config`` for the workspace's own corral.toml: the user's explicit trust, which a
    file that loosens the default policy (an allow rule, ``default = "allow"``) needs."""
    return "--config", str(workspace / "corral.toml")


# the harness kit's, one copy
HelloServer = LoopbackHello


async def memory_store() -> Store:
    """A fresh memory store (a store kit factory)."""
    return await open_store("memory://")


@asynccontextmanager
async def sqlite_store() -> AsyncIterator[Store]:
    """A fresh SQLite store in a temporary directory (a store kit factory)."""
    with tempfile.TemporaryDirectory(prefix="corral-kit-") as tmp:
        store = await open_store(f"sqlite://{Path(tmp) / 'corral.db'}")
        try:
            yield store
        finally:
            await store.aclose()


POSTGRES_ADMIN_URL = os.environ.get(
    "CORRAL_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
"""A PostgreSQL URL whose user may create databases; the tests create one database
``corral_test_<random>`` per test process and drop it at the end, with a schema per store
inside it (measured: ~56 ms to make, open and drop a store's schema, ~176 ms for a database
per store). Unreachable, the tests fail: CI has a server."""

_pg_lock = threading.Lock()
_pg_database: str | None = None


def postgres_database_url() -> str:
    """The URL of this test process's own database, created on first use."""
    global _pg_database
    import psycopg

    with _pg_lock:
        if _pg_database is None:
            name = f"corral_test_{uuid.uuid4().hex[:12]}"
            try:
                with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True,
                                     connect_timeout=10) as c:
                    c.execute(f'CREATE DATABASE "{name}"')
            except psycopg.Error as exc:
                from corral.stores._pg_url import mask_url

                raise RuntimeError(
                    f"the PostgreSQL tests need a server: {mask_url(POSTGRES_ADMIN_URL)} "
                    f"(CORRAL_TEST_POSTGRES) failed: {exc}") from None
            _pg_database = name
            atexit.register(drop_postgres_database)
        base = POSTGRES_ADMIN_URL.partition("?")[0].rpartition("/")[0]
        return f"{base}/{_pg_database}"


def drop_postgres_database() -> None:
    """Drop this process's test database, if it made one (its connections are ended)."""
    global _pg_database
    import psycopg

    with _pg_lock:
        name, _pg_database = _pg_database, None
    if name is not None:
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=10) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def postgres_schema() -> tuple[str, str]:
    """A fresh schema name in the test database and the store URL using it."""
    schema = f"t_{uuid.uuid4().hex[:16]}"
    return schema, f"{postgres_database_url()}?schema={schema}"


def drop_postgres_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(postgres_database_url(), autocommit=True, connect_timeout=10) as c:
        c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@asynccontextmanager
async def postgres_store() -> AsyncIterator[Store]:
    """A fresh PostgreSQL store in its own schema, dropped afterwards (a store kit factory)."""
    import anyio.to_thread

    schema, url = await anyio.to_thread.run_sync(postgres_schema)
    try:
        store = await open_store(url)
        try:
            yield store
        finally:
            await store.aclose()
    finally:
        await anyio.to_thread.run_sync(drop_postgres_schema, schema)


STORE_FACTORIES = {"memory": memory_store, "sqlite": sqlite_store, "postgres": postgres_store}
"""Each shipped store backend by name, for ``pytest_checks``."""


@contextmanager
def pg_schema_url() -> Iterator[str]:
    """A store URL for a fresh schema in this test process's database, dropped afterwards."""
    schema, url = postgres_schema()
    try:
        yield url
    finally:
        drop_postgres_schema(schema)


def pg_log(url: str, run_id: str) -> list[dict[str, Any]]:
    """A run's events as the store at ``url`` holds them (read through the store's own
    API), checked gap-free."""
    import anyio

    async def read() -> list[Any]:
        store = await open_store(url)
        try:
            return await store.snapshot(run_id)
        finally:
            await store.aclose()

    logged = anyio.run(read)
    assert [e.offset for e in logged] == list(range(1, len(logged) + 1)), "offsets gap-free"
    return [e.event for e in logged]



def assert_secret_only_in_secrets_table(db: Path, secret: bytes, *texts: str) -> None:
    """corral's key (raw, hex or base64) is in no table of the SQLite store ``db`` but
    ``secrets``, nor in any of ``texts`` (logs, CLI output)."""
    forms = [secret.hex(), base64.b64encode(secret).decode().rstrip("="),
             base64.urlsafe_b64encode(secret).decode().rstrip("=")]
    conn = sqlite3.connect(db)
    try:
        tables = [t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = "
                                            "'table' AND name NOT LIKE 'sqlite_%'")]
        assert "secrets" in tables and {"runs", "events", "approvals"} <= set(tables)
        stored = conn.execute("SELECT value FROM secrets WHERE name = 'approvals'").fetchone()
        assert stored is not None and stored[0] == secret  # what is looked for is stored
        for table in tables:
            if table == "secrets":
                continue
            for row in conn.execute(f"SELECT * FROM {table}"):  # noqa: S608 (our names)
                for value in row:
                    raw = value if isinstance(value, bytes) else str(value).encode()
                    assert secret not in raw, f"the key is in table {table}"
                    assert not any(f.encode() in raw for f in forms), \
                        f"the key is in table {table}"
    finally:
        conn.close()
    for text in texts:
        assert not any(f in text for f in forms), "the key is in a log or output"


@asynccontextmanager
async def pg_opened(url: str, **kw: Any) -> AsyncIterator[Any]:
    """A :class:`~corral.stores.PostgresStore` on ``url``, closed afterwards."""
    from corral.stores._postgres import PostgresStore

    store = await PostgresStore.open(url, **kw)
    try:
        yield store
    finally:
        await store.aclose()


def pg_sql(query: str, *args: Any) -> list[tuple[Any, ...]]:
    """One statement on this test process's PostgreSQL database (autocommit): its rows."""
    import psycopg

    with psycopg.connect(postgres_database_url(), autocommit=True) as conn:
        cur = conn.execute(query, args or None)
        return cur.fetchall() if cur.description else []



def agent_resident(dirs: Sequence[str]) -> set[int]:
    """The host pids of a bubblewrap sandbox's agent in its cgroups (``dirs``): the agent
    (a ``corral-agent`` whose parent is ``bwrap``) and that ``bwrap``, which live as long
    as the sandbox; every other member is a command's (corral.providers._bwrap_agent)."""
    from corral.providers import _cgroups as cgroups

    def read(pid: int, name: str) -> str:
        with open(f"/proc/{pid}/{name}") as fh:
            return fh.read()

    found: set[int] = set()
    for pid in cgroups.members(list(dirs)):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if read(pid, "comm").strip() != "corral-agent":
                continue
            parent = int(read(pid, "stat").rsplit(")", 1)[1].split()[1])
            if read(parent, "comm").strip() == "bwrap":
                found |= {pid, parent}
    return found


def idle_spare(dirs: Sequence[str]) -> set[int]:
    """The host pids of a bubblewrap agent's idle warm spare in its cgroups (``dirs``): a
    ``corral-spare`` (the next command's process, waiting for it) and its parent (that
    command's init), two pids once it is made; while it is being made, the init alone is
    the ``corral-spare``. With :func:`agent_resident`, what stays between commands."""
    from corral.providers import _cgroups as cgroups

    def read(pid: int, name: str) -> str:
        with open(f"/proc/{pid}/{name}") as fh:
            return fh.read()

    def parent(pid: int) -> int:
        return int(read(pid, "stat").rsplit(")", 1)[1].split()[1])

    found: set[int] = set()
    for pid in cgroups.members(list(dirs)):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if read(pid, "comm").strip() != "corral-spare":
                continue
            found.add(pid)
            up = parent(pid)
            if read(up, "comm").strip() == "corral-agent" and \
                    read(parent(up), "comm").strip() != "bwrap":  # not the agent itself
                found.add(up)
    return found
