"""Small helpers the test suites share (importable functions, not fixtures)."""

from __future__ import annotations

import base64
import json
import os
import secrets
import sqlite3
import subprocess
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from corral.stores import open_store
from corral.stores._protocols import Store
from corral.testing import wait_until, wait_until_async

__all__ = [
    "STORE_FACTORIES",
    "PG_ADMIN_URL",
    "HelloServer",
    "assert_secret_only_in_secrets_table",
    "memory_store",
    "one_line_refusal",
    "pg_database",
    "pg_log",
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


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        server = self.server
        assert isinstance(server, HelloServer)
        server.hits += 1
        body = f"hello from {server.server_address[1]}\n".encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: Any) -> None:
        pass


class HelloServer(ThreadingHTTPServer):
    """An HTTP service on ``host`` answering ``hello from <port>`` and counting requests
    (``hits``); serving once started, until :meth:`stop`."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        super().__init__((host, 0), _Hello)
        self.hits = 0
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


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


STORE_FACTORIES = {"memory": memory_store, "sqlite": sqlite_store}
"""Each shipped store backend by name, for ``pytest_checks``."""


PG_ADMIN_URL = os.environ.get("CORRAL_TEST_POSTGRES",
                              "postgresql://postgres@127.0.0.1:5432/postgres")
"""The PostgreSQL server the tests make their databases on (CI runs one on this address)."""


@contextmanager
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database for one test, dropped afterwards: its URL."""
    import psycopg

    name = f"corral_test_{secrets.token_hex(6)}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pg_log(url: str, run_id: str) -> list[dict[str, Any]]:
    """A run's events as a PostgreSQL store holds them, checked gap-free."""
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute('SELECT "offset", event FROM events WHERE run_id = %s '
                            'ORDER BY "offset"', (run_id,)).fetchall()
    assert [r[0] for r in rows] == list(range(1, len(rows) + 1)), "offsets must be gap-free"
    return [r[1] if isinstance(r[1], dict) else json.loads(r[1]) for r in rows]


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
