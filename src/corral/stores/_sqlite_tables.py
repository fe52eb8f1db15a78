"""The SQLite store's tables: the schema migrations, and the run listings as plain
``sqlite3`` functions that need no store object. The store runs them on its connections;
``corral ls`` reads a current store file with them directly (:func:`peek_runs`), without
the event loop or the store's other machinery, which would be most of its start-up."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, Final

from corral.stores._records import RunRecord, RunStatus, record_from_json

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "latest_runs", "newest_of_thread", "peek_runs", "records",
           "runs_of_thread"]

MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    # 1: run records, event logs, sandbox instances, named locks
    (
        """CREATE TABLE IF NOT EXISTS runs (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id TEXT NOT NULL UNIQUE,
            thread_id TEXT NOT NULL,
            status TEXT NOT NULL,
            started_at REAL NOT NULL,
            detached_since REAL,
            driver_epoch INTEGER NOT NULL DEFAULT 0,
            doc TEXT NOT NULL,
            last_offset INTEGER NOT NULL DEFAULT 0,
            last_journal_offset INTEGER,
            log_closed INTEGER NOT NULL DEFAULT 0
        )""",
        "CREATE INDEX IF NOT EXISTS runs_thread ON runs (thread_id, started_at)",
        "CREATE INDEX IF NOT EXISTS runs_detached ON runs (status, detached_since)",
        """CREATE INDEX IF NOT EXISTS runs_unattended ON runs
            (status, COALESCE(detached_since, json_extract(doc, '$.claim_expires_at')))""",
        """CREATE TABLE IF NOT EXISTS events (
            run_id TEXT NOT NULL,
            offset INTEGER NOT NULL,
            journal_offset INTEGER NOT NULL,
            event TEXT NOT NULL,
            PRIMARY KEY (run_id, offset)
        ) WITHOUT ROWID""",
        """CREATE TABLE IF NOT EXISTS instances (
            key TEXT PRIMARY KEY,
            expires_at REAL,
            doc TEXT NOT NULL
        )""",
        """CREATE TABLE IF NOT EXISTS locks (
            name TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            expires_at REAL NOT NULL
        )""",
    ),
    # 2: approval requests and answers, corral's own secrets (everything a second host
    # needs lives in the store)
    (
        """CREATE TABLE IF NOT EXISTS approvals (
            run_id TEXT NOT NULL,
            approval_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            created_at REAL NOT NULL,
            request TEXT NOT NULL,
            decision TEXT,
            reason TEXT,
            answered_at REAL,
            PRIMARY KEY (run_id, approval_id)
        ) WITHOUT ROWID""",
        """CREATE INDEX IF NOT EXISTS approvals_pending ON approvals (run_id, created_at, seq)
            WHERE decision IS NULL""",
        """CREATE TABLE IF NOT EXISTS secrets (
            name TEXT PRIMARY KEY,
            value BLOB NOT NULL
        ) WITHOUT ROWID""",
    ),
    # 3: checkpoints (#27): content-addressed chunks shared by every checkpoint and thread,
    # the manifests (zlib JSON) per thread, and which manifest names which chunk (what the
    # collector keeps). A separate entry: the integrator may reorder it among others.
    (
        """CREATE TABLE IF NOT EXISTS chunks (
            digest TEXT NOT NULL UNIQUE,
            size INTEGER NOT NULL,
            touched_at REAL NOT NULL,
            data BLOB NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS chunks_touched ON chunks (touched_at)",
        """CREATE TABLE IF NOT EXISTS checkpoints (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            checkpoint_id TEXT NOT NULL UNIQUE,
            thread_id TEXT NOT NULL,
            created_at REAL NOT NULL,
            manifest BLOB NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS checkpoints_thread ON checkpoints (thread_id, created_at, seq)",
        """CREATE TABLE IF NOT EXISTS checkpoint_chunks (
            checkpoint_seq INTEGER NOT NULL,
            digest TEXT NOT NULL,
            PRIMARY KEY (checkpoint_seq, digest)
        ) WITHOUT ROWID""",
        "CREATE INDEX IF NOT EXISTS checkpoint_chunks_digest ON checkpoint_chunks (digest)",
    ),
    # 4: sessions (#27): agent CLIs' saved sessions, one per (thread, harness): a header row
    # and one row per file (plain BLOBs: a transcript is read and written whole, and a
    # rowid table keeps large rows out of the index's pages)
    (
        """CREATE TABLE IF NOT EXISTS sessions (
            thread_id TEXT NOT NULL,
            harness TEXT NOT NULL,
            session_id TEXT,
            saved_at REAL NOT NULL,
            run_id TEXT,
            size INTEGER NOT NULL,
            files INTEGER NOT NULL,
            PRIMARY KEY (thread_id, harness)
        ) WITHOUT ROWID""",
        """CREATE TABLE IF NOT EXISTS session_files (
            thread_id TEXT NOT NULL,
            harness TEXT NOT NULL,
            path TEXT NOT NULL,
            data BLOB NOT NULL
        )""",
        """CREATE UNIQUE INDEX IF NOT EXISTS session_files_key
            ON session_files (thread_id, harness, path)""",
    ),
)
"""Schema migrations in order: entry ``n`` takes a file from version ``n`` (``PRAGMA
user_version``; 0 is a new, empty file) to ``n + 1``. A new schema change is one more entry,
never an edit of a shipped one. The statements are idempotent, so a file whose version an
older corral rewrote (it sets its own version when it opens one) migrates again cleanly."""

SCHEMA_VERSION: Final = len(MIGRATIONS)


def records(rows: list[Any]) -> list[RunRecord]:
    """The run records of ``SELECT doc`` rows."""
    return [record_from_json(row[0]) for row in rows]


def runs_of_thread(conn: sqlite3.Connection, thread_id: str) -> list[RunRecord]:
    """A thread's runs, oldest first."""
    return records(conn.execute(
        "SELECT doc FROM runs WHERE thread_id = ? ORDER BY started_at, seq", (thread_id,)
    ).fetchall())


def latest_runs(conn: sqlite3.Connection, status: RunStatus | None, limit: int
                ) -> list[RunRecord]:
    """The ``limit`` newest runs (of ``status``), newest first."""
    if status is None:
        return records(conn.execute(
            "SELECT doc FROM runs ORDER BY started_at DESC, seq DESC LIMIT ?", (limit,)
        ).fetchall())
    return records(conn.execute(
        "SELECT doc FROM runs WHERE status = ? ORDER BY started_at DESC, seq DESC LIMIT ?",
        (RunStatus(status).value, limit),
    ).fetchall())


def newest_of_thread(runs: list[RunRecord], status: RunStatus | None, limit: int
                     ) -> list[RunRecord]:
    """``corral ls --thread``: a thread's runs (as listed, oldest first) newest first,
    filtered by ``status``, cut at ``limit``."""
    return [r for r in reversed(runs) if status is None or r.status is status][:limit]


def peek_runs(path: Path, *, thread: str | None, status: RunStatus | None, limit: int
              ) -> list[RunRecord] | None:
    """``corral ls`` of the store file at ``path``: a thread's runs newest first, or the
    latest runs, filtered by ``status`` and cut at ``limit``. ``None`` when the file
    cannot answer as it is (none yet, another schema version, not a store, locked past
    the wait): opening the store then migrates, creates or names the problem."""
    if not path.is_file():
        return None
    try:
        conn = sqlite3.connect(path, timeout=30.0, isolation_level=None)
    except sqlite3.Error:
        return None
    try:
        conn.execute("PRAGMA query_only = ON")
        if conn.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
            return None
        if thread is None:
            return latest_runs(conn, status, limit)
        return newest_of_thread(runs_of_thread(conn, thread), status, limit)
    except sqlite3.Error:
        return None
    finally:
        conn.close()
