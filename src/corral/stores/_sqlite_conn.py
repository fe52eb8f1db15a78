"""A SQLite store file's connections: opening one (WAL mode, the schema brought to its
version), transactions on it, and a failure as one line naming the file and the fix."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final, TypeVar

from corral._log import library_logger
from corral._paths import storage_problem
from corral.stores._protocols import StoreError
from corral.stores._sqlite_tables import MIGRATIONS, SCHEMA_VERSION

__all__ = ["BUSY", "Busy", "Conn", "open_schema", "store_error"]

_T = TypeVar("_T")
log = library_logger("corral.stores._sqlite")


def store_error(path: Path, exc: sqlite3.Error, doing: str = "cannot use") -> StoreError:
    """One line for a SQLite failure: the file, SQLite's reason and, when the file system
    is read-only or full (SQLite's own words are vague: "disk I/O error", "unable to open
    database file"), that and the fix."""
    problem = storage_problem(path)
    if problem is None and not _writable(path):
        return StoreError(
            f"{doing} SQLite store {path}: permission denied ({exc}); fix the owner or mode "
            "of the file or its directory, or point CORRAL_STORE (or CORRAL_HOME) elsewhere"
        )
    if problem is None:
        return StoreError(f"{doing} SQLite store {path}: {exc}")
    return StoreError(
        f"{doing} SQLite store {path}: the file system is {problem} ({exc}); "
        + ("make it writable" if problem == "read-only" else "free some space")
        + " or point CORRAL_STORE (or CORRAL_HOME) elsewhere"
    )


def _writable(path: Path) -> bool:
    """Whether this process may write ``path`` (or create it in its nearest existing
    directory)."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    if p.is_dir():
        return os.access(p, os.W_OK | os.X_OK)
    return os.access(p, os.W_OK) and os.access(p.parent, os.W_OK | os.X_OK)


class Busy:
    """What :meth:`Conn.transact_now` returns when it would have had to wait."""


BUSY: Final = Busy()


class Conn:
    """One sqlite3 connection, used by one thread at a time."""

    def __init__(self, path: Path, synchronous: str, *, wait: bool = True) -> None:
        """``wait=False``: a connection for :meth:`transact_now` (busy timeout 0, never
        checkpoints)."""
        self.path = path
        self.conn = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False, timeout=30.0 if wait else 0.0
        )
        self.conn.execute(f"PRAGMA busy_timeout = {30000 if wait else 0}")
        self.conn.execute(f"PRAGMA synchronous = {synchronous}")
        if not wait:
            self.conn.execute("PRAGMA wal_autocheckpoint = 0")
        self.lock = threading.Lock()

    def _transaction(self, fn: Callable[[sqlite3.Connection], _T], begin: str) -> _T:
        self.conn.execute(begin)
        try:
            result = fn(self.conn)
            self.conn.execute("COMMIT")
        except BaseException:
            # also after a failed COMMIT (disk full): SQLite may have kept the
            # transaction open, and the next BEGIN would fail on it
            if self.conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self.conn.execute("ROLLBACK")
            raise
        return result

    def transact(self, fn: Callable[[sqlite3.Connection], _T], begin: str) -> _T:
        with self.lock:
            try:
                return self._transaction(fn, begin)
            except sqlite3.Error as exc:
                # nothing was written (the transaction rolled back); callers and the CLI
                # get one StoreError line instead of a sqlite3 traceback
                raise store_error(self.path, exc) from None

    def transact_now(self, fn: Callable[[sqlite3.Connection], _T], begin: str) -> _T | Busy:
        """:meth:`transact` on the calling thread, or :data:`BUSY` (nothing written) when
        that would wait: the connection is in use, or SQLite does not grant the transaction
        at once (with a busy timeout of 0 it says SQLITE_BUSY instead of waiting). ``fn``
        may then run again elsewhere: it must do nothing but read and write the database."""
        if not self.lock.acquire(blocking=False):
            return BUSY
        try:
            return self._transaction(fn, begin)
        except sqlite3.Error as exc:
            if exc.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                return BUSY
            raise store_error(self.path, exc) from None
        finally:
            self.lock.release()

    def close(self) -> None:
        with self.lock:
            self.conn.close()


def open_schema(conn: sqlite3.Connection, path: Path) -> int | None:
    """Put a store file's connection in WAL mode and bring its schema to
    :data:`SCHEMA_VERSION`. Returns the version migrated from (0: the file's tables were
    created), ``None`` when the file was current. Raises :class:`StoreError` (one line)."""
    try:
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreError(f"SQLite store {path}: WAL mode unavailable (got {mode})")
        if _check_version(conn, path) < SCHEMA_VERSION:
            return _migrate(conn, path)
        return None
    except sqlite3.DatabaseError as exc:
        if storage_problem(path) is not None or not _writable(path):
            raise store_error(path, exc, "cannot open") from None
        raise StoreError(f"{path} is not a usable SQLite store: {exc}") from None


def _check_version(conn: sqlite3.Connection, path: Path) -> int:
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"SQLite store {path} has schema version {version}, newer than this "
            f"corral understands ({SCHEMA_VERSION}); upgrade corral"
        )
    return version


def _migrate(conn: sqlite3.Connection, path: Path) -> int | None:
    """Bring the file to :data:`SCHEMA_VERSION` in one ``BEGIN IMMEDIATE`` transaction:
    of several processes opening an old file at once, the first migrates and the others
    find the new version when they get the lock. Returns the version migrated from,
    ``None`` when another process had done it."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = _check_version(conn, path)  # again, under the lock
        for step in range(version, SCHEMA_VERSION):
            for statement in MIGRATIONS[step]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {step + 1}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise
    if version == SCHEMA_VERSION:
        return None
    if version > 0:  # a new file is not news; an upgraded one is
        log.info("SQLite store %s: schema migrated from version %d to %d", path,
                 version, SCHEMA_VERSION)
    return version
