"""SQLite store: the embedded default. One file, WAL, safe for many processes on one machine.

Each store object keeps two connections (one writer, one reader), each used by one worker
thread at a time through ``anyio.to_thread``. Writes run in ``BEGIN IMMEDIATE`` transactions:
fencing checks and the writes they guard commit together or not at all. A process killed
mid-append leaves the last transaction uncommitted in the WAL, which SQLite discards on the
next open, so the log always holds a clean prefix.

The short instance and lock operations (``ensure`` makes three per sandbox) run on the event
loop when that needs no waiting, on a third connection whose busy timeout is zero: when
SQLite cannot grant the transaction at once (another connection writes) or that connection
is in use, the operation goes through the worker thread as any other, nothing having been
written. A hop to a worker costs more than such a transaction: it wakes a thread, which
wakes the loop (taking a lock and reading the record: p50 ~150 µs through the thread, ~50 µs
here back to back; ~660 µs and ~350 µs after 15 ms idle, p90 2.4–2.9 ms and 0.4 ms, on a
2-vCPU VM at load ~5: ``bench/store_ensure_ops.py``). Only where a commit does not
``fsync`` (``synchronous`` off or normal); and the loop's connection never checkpoints (a
checkpoint does ``fsync``): one in :data:`_THREAD_EVERY` of its writes goes through the
writer's thread instead, whose commit checkpoints a WAL of 1000 pages or more.

``synchronous=NORMAL`` (the default) survives process crashes; a power loss can drop the last
transactions. Use ``sqlite:///path?synchronous=full`` to fsync every commit.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, Final, Self, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

from corral._log import library_logger
from corral._paths import storage_problem
from corral.stores._records import (
    CorruptRecord,
    RunRecord,
    RunStatus,
    is_terminal_status,
    record_from_json,
)
from corral.stores._protocols import (
    ApprovalAnswer,
    ApprovalExists,
    ApprovalRequest,
    InstanceRecord,
    LoggedEvent,
    LogTail,
    NewRun,
    RunActive,
    RunExists,
    SessionInfo,
    SessionLimits,
    StoredSession,
    StoreError,
    UnknownApproval,
    UnknownRun,
)
from corral.stores import _logic
from corral.stores._signal import NotifySignal
from corral.stores._checkpoints import ThreadHead, manifest_from_bytes
from corral.stores._sqlite_checkpoints import SQLiteCheckpoints
from corral.stores._sqlite_tables import (
    MIGRATIONS,
    SCHEMA_VERSION,
    latest_runs,
    records,
    runs_of_thread,
)

_T = TypeVar("_T")
log = library_logger("corral.stores._sqlite")


_UNATTENDED: Final = "COALESCE(detached_since, json_extract(doc, '$.claim_expires_at'))"
"""Since when nobody watches or drives a run (``RunRecord.unattended_since``), exactly as
the ``runs_unattended`` index spells it."""

_LOOP_SYNCHRONOUS: Final = frozenset({"OFF", "NORMAL"})
"""``synchronous`` settings under which a commit does not ``fsync``: the short operations
may then run on the event loop."""
_THREAD_EVERY: Final = 64
"""One in this many writes that could run on the event loop goes through the writer's
thread instead, whose commit checkpoints the WAL when it holds 1000 pages or more (the
loop's connection never checkpoints): so the WAL stays bounded."""

_READ_BATCH: Final = 1000
_FALLBACK_POLL: Final = 1.0
"""Seconds a tailer waits for a poke before re-checking the store anyway."""


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


class _Busy:
    """What :meth:`_Conn.transact_now` returns when it would have had to wait."""


_BUSY: Final = _Busy()


class _Conn:
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

    def transact_now(self, fn: Callable[[sqlite3.Connection], _T], begin: str) -> _T | _Busy:
        """:meth:`transact` on the calling thread, or :data:`_BUSY` (nothing written) when
        that would wait: the connection is in use, or SQLite does not grant the transaction
        at once (with a busy timeout of 0 it says SQLITE_BUSY instead of waiting). ``fn``
        may then run again elsewhere: it must do nothing but read and write the database."""
        if not self.lock.acquire(blocking=False):
            return _BUSY
        try:
            return self._transaction(fn, begin)
        except sqlite3.Error as exc:
            if exc.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                return _BUSY
            raise store_error(self.path, exc) from None
        finally:
            self.lock.release()

    def close(self) -> None:
        with self.lock:
            self.conn.close()


def _load(conn: sqlite3.Connection, run_id: str) -> RunRecord | None:
    row = conn.execute("SELECT doc FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None else record_from_json(row[0])


def _run_row(record: RunRecord) -> tuple[Any, ...]:
    """The indexed columns of ``record`` and its stored JSON, in the order of the
    ``UPDATE`` of :func:`_save` and the ``INSERT`` of :func:`_insert`."""
    return (
        record.thread_id,
        record.status.value,
        record.started_at,
        record.detached_since,
        record.driver_epoch,
        _logic.record_to_json(record),
    )


def _save(conn: sqlite3.Connection, record: RunRecord) -> None:
    conn.execute(
        "UPDATE runs SET thread_id = ?, status = ?, started_at = ?, detached_since = ?, "
        "driver_epoch = ?, doc = ? WHERE run_id = ?",
        (*_run_row(record), record.run_id),
    )


def _insert(conn: sqlite3.Connection, record: RunRecord) -> None:
    conn.execute(
        "INSERT INTO runs (thread_id, status, started_at, detached_since, driver_epoch, doc, "
        "run_id) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (*_run_row(record), record.run_id),
    )


def _fetch_after(
    run_id: str, position: int, conn: sqlite3.Connection
) -> tuple[list[Any], bool, int] | None:
    """Events after ``position`` plus the log's closed flag and last offset, at one instant."""
    row = conn.execute(
        "SELECT last_offset, log_closed FROM runs WHERE run_id = ?", (run_id,)
    ).fetchone()
    if row is None:
        return None
    rows = conn.execute(
        "SELECT offset, journal_offset, event FROM events "
        "WHERE run_id = ? AND offset > ? ORDER BY offset LIMIT ?",
        (run_id, position, _READ_BATCH),
    ).fetchall()
    return rows, bool(row[1]), int(row[0])




class SQLiteStore(_logic.RunTransitions, SQLiteCheckpoints):
    """All store protocols over one SQLite file (``sqlite:///path/to/file.db``)."""

    def __init__(
        self,
        path: Path,
        *,
        synchronous: str = "NORMAL",
        clock: Callable[[], float] = time.time,
        session_limits: SessionLimits | None = None,
    ) -> None:
        synchronous = synchronous.upper()
        if synchronous not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
            raise StoreError(
                f"sqlite synchronous must be one of off, normal, full, extra; got {synchronous!r}"
            )
        self.path = Path(path)
        self.url = f"sqlite://{self.path}"
        self.migrated_from: int | None = None
        """The schema version this object migrated the file from (0: it created the
        file's tables), ``None`` when the file was current."""
        self._clock = clock
        self.session_limits = session_limits or SessionLimits()
        self._secrets: dict[str, bytes] = {}
        """Shared secrets read so far: a stored secret never changes (insert-if-absent),
        so each is read once per store object, not once per use (every ensure uses one)."""
        try:
            self._writer = _Conn(self.path, synchronous)
        except sqlite3.Error as exc:
            raise store_error(self.path, exc, "cannot open") from None
        self._init_schema()
        try:
            self._reader = _Conn(self.path, synchronous)
        except sqlite3.Error as exc:
            self._writer.close()
            raise store_error(self.path, exc, "cannot open") from None
        self._soon: _Conn | None = None
        """The event loop's connection (:meth:`_write_soon`); None where commits fsync."""
        if synchronous in _LOOP_SYNCHRONOUS:
            try:
                self._soon = _Conn(self.path, synchronous, wait=False)
            except sqlite3.Error as exc:
                self._writer.close()
                self._reader.close()
                raise store_error(self.path, exc, "cannot open") from None
        self._soon_writes = 0
        self._signal = NotifySignal(Path(str(self.path) + ".notify"))

    def _init_schema(self) -> None:
        conn = self._writer.conn
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"SQLite store {self.path}: WAL mode unavailable (got {mode})")
            version = self._check_version(conn)
            if version < SCHEMA_VERSION:
                self.migrated_from = self._migrate(conn)
        except (sqlite3.DatabaseError, StoreError) as exc:
            self._writer.close()
            if isinstance(exc, StoreError):
                raise
            if storage_problem(self.path) is not None or not _writable(self.path):
                raise store_error(self.path, exc, "cannot open") from None
            raise StoreError(f"{self.path} is not a usable SQLite store: {exc}") from None

    def _check_version(self, conn: sqlite3.Connection) -> int:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"SQLite store {self.path} has schema version {version}, newer than this "
                f"corral understands ({SCHEMA_VERSION}); upgrade corral"
            )
        return version

    def _migrate(self, conn: sqlite3.Connection) -> int | None:
        """Bring the file to :data:`SCHEMA_VERSION` in one ``BEGIN IMMEDIATE`` transaction:
        of several processes opening an old file at once, the first migrates and the others
        find the new version when they get the lock. Returns the version migrated from,
        ``None`` when another process had done it."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = self._check_version(conn)  # again, under the lock
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
            log.info("SQLite store %s: schema migrated from version %d to %d", self.path,
                     version, SCHEMA_VERSION)
        return version

    async def _write(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        return await anyio.to_thread.run_sync(self._writer.transact, fn, "BEGIN IMMEDIATE")

    async def _read(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        return await anyio.to_thread.run_sync(self._reader.transact, fn, "BEGIN")

    async def _write_soon(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """:meth:`_write` of a short transaction, on the event loop when it needs no waiting
        (module doc). ``fn`` must only read and write the database: it may run twice."""
        await anyio.lowlevel.checkpoint()  # a cancellation point, as the thread's hop is
        if self._soon is not None:
            self._soon_writes += 1
            if self._soon_writes % _THREAD_EVERY:
                done = self._soon.transact_now(fn, "BEGIN IMMEDIATE")
                if not isinstance(done, _Busy):
                    return done
        return await self._write(fn)

    async def _read_soon(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """:meth:`_read` of a short query, on the event loop when it needs no waiting."""
        await anyio.lowlevel.checkpoint()
        if self._soon is not None:
            done = self._soon.transact_now(fn, "BEGIN")
            if not isinstance(done, _Busy):
                return done
        return await self._read(fn)

    async def _transition(
        self, run_id: str, step: Callable[[RunRecord | None], tuple[RunRecord | None, _T]]
    ) -> tuple[RunRecord | None, _T]:
        def op(conn: sqlite3.Connection) -> tuple[RunRecord | None, _T]:
            old = _load(conn, run_id)
            new, rest = step(old)
            if new is not None and new is not old:
                _save(conn, new)
            return new, rest

        return await self._write(op)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def diagnose(self) -> str:
        """The file, SQLite's version and the schema version (read from the file)."""

        def look() -> int:
            with contextlib.closing(sqlite3.connect(self.path)) as conn:
                return int(conn.execute("PRAGMA user_version").fetchone()[0])

        version = await anyio.to_thread.run_sync(look)
        return (f"SQLite {sqlite3.sqlite_version} at {self.path}, schema version {version}; "
                "one machine only (use PostgreSQL for several hosts)")

    async def aclose(self) -> None:
        """Close both connections and stop listening for pokes."""
        if self._signal.sock is not None:
            anyio.notify_closing(self._signal.sock)  # tailers parked on it get an error, not a hang
        self._signal.close()
        if self._soon is not None:
            self._soon.close()
        self._writer.close()
        self._reader.close()

    # ------------------------------------------------------------------ runs

    async def create(self, new: NewRun, *, now: float | None = None) -> RunRecord:
        record = new.record(self._now(now))

        def op(conn: sqlite3.Connection) -> RunRecord:
            if _load(conn, new.run_id) is not None:
                raise RunExists(new.run_id)
            _insert(conn, record)
            return record

        return await self._write(op)

    async def create_or_resume(self, new: NewRun, *, now: float | None = None) -> RunRecord:
        record = new.record(self._now(now))

        def op(conn: sqlite3.Connection) -> RunRecord:
            existing = _load(conn, new.run_id)
            if existing is not None:
                return existing
            _insert(conn, record)
            return record

        return await self._write(op)

    async def get(self, run_id: str) -> RunRecord | None:
        return await self._read(lambda conn: _load(conn, run_id))

    async def find_active_run(self, thread_id: str) -> RunRecord | None:
        def op(conn: sqlite3.Connection) -> RunRecord | None:
            rows = conn.execute(
                "SELECT doc FROM runs WHERE thread_id = ? AND status = 'running' "
                "ORDER BY started_at DESC, seq DESC LIMIT 1",
                (thread_id,),
            ).fetchall()
            found = records(rows)
            return found[0] if found else None

        return await self._read(op)

    async def delete_run(self, run_id: str) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            row = conn.execute("SELECT status FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if row is None:
                return False
            if not is_terminal_status(row[0]):
                raise RunActive(run_id, str(row[0]))
            conn.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
            conn.execute("DELETE FROM events WHERE run_id = ?", (run_id,))
            conn.execute("DELETE FROM approvals WHERE run_id = ?", (run_id,))
            return True

        deleted = await self._write(op)
        if deleted:
            self._signal.poke()  # a tailer of its log looks again, and finds it gone
        return deleted

    async def thread_head(self, thread_id: str, *, but: str | None = None) -> ThreadHead:
        def op(conn: sqlite3.Connection) -> tuple[Any, Any]:
            row = conn.execute(
                "SELECT (SELECT doc FROM runs WHERE thread_id = ?1 AND run_id IS NOT ?2 "
                "ORDER BY started_at DESC, seq DESC LIMIT 1), "
                "(SELECT manifest FROM checkpoints WHERE thread_id = ?1 "
                "ORDER BY created_at DESC, seq DESC LIMIT 1)", (thread_id, but)).fetchone()
            return row[0], row[1]

        doc, manifest = await self._read_soon(op)
        return ThreadHead(None if manifest is None else manifest_from_bytes(bytes(manifest)),
                          None if doc is None else record_from_json(doc))

    async def list_by_thread(self, thread_id: str) -> list[RunRecord]:
        return await self._read(partial(runs_of_thread, thread_id=thread_id))

    async def list_runs(
        self, *, status: RunStatus | None = None, limit: int = 100
    ) -> list[RunRecord]:
        limit = _logic.check_limit(limit)
        return await self._read(partial(latest_runs, status=status, limit=limit))

    async def list_reclaimable(
        self, now: float, ttl: float, *, limit: int | None = None
    ) -> list[RunRecord]:
        cutoff = now - ttl
        count = _logic.check_cap(limit)
        # RunRecord.unattended_since in SQL. Walks the runs_unattended expression index in
        # order (the expression must match it exactly); seq is the rowid, which every
        # SQLite index carries, so the tie-break needs no sort and LIMIT stops the scan.
        return await self._read(
            lambda conn: records(
                conn.execute(
                    f"SELECT doc FROM runs WHERE status = 'running' AND {_UNATTENDED} <= ? "
                    f"ORDER BY {_UNATTENDED}, seq LIMIT ?",
                    (cutoff, -1 if count is None else count),
                ).fetchall()
            )
        )

    # ------------------------------------------------------------------ event log

    async def _append(self, run_id: str, encoded: list[tuple[str, int]], epoch: int) -> int:
        def op(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "SELECT driver_epoch, last_offset, log_closed FROM runs WHERE run_id = ?",
                (run_id,),
            ).fetchone()
            _logic.append_check(
                None if row is None else int(row[0]), run_id, epoch, bool(row and row[2])
            )
            first = int(row[1]) + 1
            if not encoded:
                return first
            conn.executemany(
                "INSERT INTO events (run_id, offset, journal_offset, event) VALUES (?, ?, ?, ?)",
                [
                    (run_id, first + i, journal_offset, text)
                    for i, (text, journal_offset) in enumerate(encoded)
                ],
            )
            # The highest journal offset, not the last one: an out-of-band event (an
            # approval request, a file event) logged at a stale offset must not make a
            # successor re-read journal lines that are already in the log.
            conn.execute(
                "UPDATE runs SET last_offset = ?, "
                "last_journal_offset = MAX(COALESCE(last_journal_offset, 0), ?) "
                "WHERE run_id = ?",
                (first + len(encoded) - 1, max(jo for _t, jo in encoded), run_id),
            )
            return first

        first = await self._write(op)
        if encoded:
            self._signal.poke()
        return first

    async def read(self, run_id: str, after: int = 0) -> AsyncIterator[LoggedEvent]:
        # Listen before the first query so a poke between query and wait is not lost.
        self._signal.listen()

        def mark() -> Callable[[], Awaitable[None]]:
            return partial(self._signal.wait, self._signal.generation, _FALLBACK_POLL)

        def fetch(position: int) -> Awaitable[_logic.Fetched | None]:
            return self._read(partial(_fetch_after, run_id, position))

        async with contextlib.aclosing(_logic.follow_log(run_id, after, fetch, mark)) as events:
            async for event in events:
                yield event

    async def close(self, run_id: str, *, epoch: int | None = None) -> bool:
        def op(conn: sqlite3.Connection) -> tuple[bool, bool]:
            row = conn.execute(
                "SELECT driver_epoch, log_closed FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            if not _logic.close_allowed(None if row is None else int(row[0]), epoch):
                return False, False
            if row[1]:
                return True, False
            conn.execute("UPDATE runs SET log_closed = 1 WHERE run_id = ?", (run_id,))
            return True, True

        closed, changed = await self._write(op)
        if changed:
            self._signal.poke()
        return closed

    async def snapshot(self, run_id: str) -> list[LoggedEvent]:
        rows = await self._read(
            lambda conn: conn.execute(
                "SELECT offset, journal_offset, event FROM events WHERE run_id = ? "
                "ORDER BY offset",
                (run_id,),
            ).fetchall()
        )
        return [LoggedEvent(int(o), int(j), _logic.decode_event(t)) for o, j, t in rows]

    async def tail(self, run_id: str) -> LogTail:
        row = await self._read(
            lambda conn: conn.execute(
                "SELECT last_offset, last_journal_offset, log_closed FROM runs WHERE run_id = ?",
                (run_id,),
            ).fetchone()
        )
        if row is None:
            raise UnknownRun(run_id)
        return LogTail(int(row[0]), None if row[1] is None else int(row[1]), bool(row[2]))

    # ------------------------------------------------------------------ instances

    async def get_instance(self, key: str) -> InstanceRecord | None:
        row = await self._read_soon(
            lambda conn: conn.execute("SELECT doc FROM instances WHERE key = ?", (key,)).fetchone()
        )
        if row is None:
            return None
        return InstanceRecord.from_dict(_logic.decode_event(row[0]))

    async def upsert_instance(self, record: InstanceRecord) -> None:
        doc = _logic.json_text(record.to_dict())
        await self._write_soon(
            lambda conn: conn.execute(
                "INSERT OR REPLACE INTO instances (key, expires_at, doc) VALUES (?, ?, ?)",
                (record.key, record.expires_at, doc),
            )
        )

    async def delete_instance(self, key: str) -> None:
        await self._write_soon(lambda conn: conn.execute("DELETE FROM instances WHERE key = ?", (key,)))

    async def list_expired_instances(self, now: float) -> list[InstanceRecord]:
        rows = await self._read(
            lambda conn: conn.execute(
                "SELECT doc FROM instances WHERE expires_at IS NOT NULL AND expires_at <= ? "
                "ORDER BY expires_at",
                (now,),
            ).fetchall()
        )
        return [InstanceRecord.from_dict(_logic.decode_event(row[0])) for row in rows]

    # ------------------------------------------------------------------ named locks

    async def try_lock(
        self, name: str, owner: str, ttl: float, *, now: float | None = None
    ) -> bool:
        ttl = _logic.check_ttl(ttl)
        at = self._now(now)

        def op(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                "SELECT owner, expires_at FROM locks WHERE name = ?", (name,)
            ).fetchone()
            if row is not None and row[0] != owner and float(row[1]) > at:
                return False
            conn.execute(
                "INSERT OR REPLACE INTO locks (name, owner, expires_at) VALUES (?, ?, ?)",
                (name, owner, at + ttl),
            )
            return True

        return await self._write_soon(op)

    async def try_lock_reading_instance(
        self, name: str, owner: str, ttl: float, key: str, *, now: float | None = None
    ) -> tuple[bool, InstanceRecord | None]:
        """:meth:`try_lock`, and when it is taken, the instance record ``key`` as it is
        under the lock, in the same transaction (one round trip for ``ensure``)."""
        ttl = _logic.check_ttl(ttl)
        at = self._now(now)

        def op(conn: sqlite3.Connection) -> tuple[bool, Any]:
            row = conn.execute(
                "SELECT owner, expires_at FROM locks WHERE name = ?", (name,)
            ).fetchone()
            if row is not None and row[0] != owner and float(row[1]) > at:
                return False, None
            conn.execute(
                "INSERT OR REPLACE INTO locks (name, owner, expires_at) VALUES (?, ?, ?)",
                (name, owner, at + ttl),
            )
            return True, conn.execute(
                "SELECT doc FROM instances WHERE key = ?", (key,)).fetchone()

        taken, row = await self._write_soon(op)
        if not taken or row is None:
            return taken, None
        return True, InstanceRecord.from_dict(_logic.decode_event(row[0]))

    async def upsert_instance_unlocking(self, record: InstanceRecord, name: str,
                                        owner: str) -> None:
        """:meth:`upsert_instance` then :meth:`unlock`, in one transaction (``ensure``'s
        last record and the release of the key's lock: one round trip)."""
        doc = _logic.json_text(record.to_dict())

        def op(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO instances (key, expires_at, doc) VALUES (?, ?, ?)",
                (record.key, record.expires_at, doc),
            )
            conn.execute("DELETE FROM locks WHERE name = ? AND owner = ?", (name, owner))

        await self._write_soon(op)

    async def unlock(self, name: str, owner: str) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            cur = conn.execute("DELETE FROM locks WHERE name = ? AND owner = ?", (name, owner))
            return cur.rowcount > 0

        return await self._write_soon(op)

    # ------------------------------------------------------------------ approvals

    async def add_approval(self, request: ApprovalRequest) -> None:
        text = _logic.approval_to_json(request)

        def op(conn: sqlite3.Connection) -> None:
            key = (request.run_id, request.approval_id)
            if conn.execute("SELECT 1 FROM approvals WHERE run_id = ? AND approval_id = ?",
                            key).fetchone() is not None:
                raise ApprovalExists(*key)
            conn.execute(
                "INSERT INTO approvals (run_id, approval_id, seq, created_at, request) "
                "VALUES (?, ?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM approvals "
                "WHERE run_id = ?), ?, ?)",
                (*key, request.run_id, request.created_at, text),
            )

        await self._write(op)

    async def answer_approval(
        self, run_id: str, approval_id: str, answer: ApprovalAnswer
    ) -> ApprovalAnswer:
        def op(conn: sqlite3.Connection) -> ApprovalAnswer:
            row = conn.execute(
                "SELECT decision, reason, answered_at FROM approvals "
                "WHERE run_id = ? AND approval_id = ?", (run_id, approval_id)).fetchone()
            if row is None:
                raise UnknownApproval(run_id, approval_id)
            prior = _logic.answer_from_columns(*row)
            if prior is not None:  # the first answer stands
                return prior
            conn.execute(
                "UPDATE approvals SET decision = ?, reason = ?, answered_at = ? "
                "WHERE run_id = ? AND approval_id = ?",
                (answer.decision, answer.reason, answer.answered_at, run_id, approval_id),
            )
            return answer

        return await self._write(op)

    async def get_approval(
        self, run_id: str, approval_id: str
    ) -> tuple[ApprovalRequest, ApprovalAnswer | None] | None:
        row = await self._read(
            lambda conn: conn.execute(
                "SELECT created_at, request, decision, reason, answered_at FROM approvals "
                "WHERE run_id = ? AND approval_id = ?", (run_id, approval_id)).fetchone()
        )
        if row is None:
            return None
        request = _logic.approval_from_json(run_id, approval_id, row[0], row[1])
        return request, _logic.answer_from_columns(row[2], row[3], row[4])

    async def list_pending_approvals(self, run_id: str) -> list[ApprovalRequest]:
        rows = await self._read(
            lambda conn: conn.execute(
                "SELECT approval_id, created_at, request FROM approvals "
                "WHERE run_id = ? AND decision IS NULL ORDER BY created_at, seq",
                (run_id,)).fetchall()
        )
        return [_logic.approval_from_json(run_id, aid, at, text) for aid, at, text in rows]

    # ------------------------------------------------------------------ secrets

    async def shared_secret(self, name: str) -> bytes:
        _logic.check_secret_name(name)
        known = self._secrets.get(name)
        if known is not None:
            return known
        fresh = secrets.token_bytes(_logic.SECRET_BYTES)

        def op(conn: sqlite3.Connection) -> Any:
            # insert-if-absent, then read, in one transaction: every first caller (any
            # process) ends up with the one value that was stored first
            conn.execute("INSERT OR IGNORE INTO secrets (name, value) VALUES (?, ?)",
                         (name, fresh))
            return conn.execute("SELECT value FROM secrets WHERE name = ?",
                                (name,)).fetchone()[0]

        value = await self._write(op)
        if not isinstance(value, bytes) or len(value) != _logic.SECRET_BYTES:
            raise CorruptRecord(f"SQLite store {self.path}: the stored secret {name!r} is not "
                                f"{_logic.SECRET_BYTES} bytes; the store is corrupt")
        self._secrets[name] = value
        return value

    # ------------------------------------------------------------------ saved sessions

    async def put_session(self, session: StoredSession) -> SessionInfo:
        stored = _logic.checked_session(session, self.session_limits)
        info = stored.info()
        key = (stored.thread_id, stored.harness)

        def op(conn: sqlite3.Connection) -> None:
            # one BEGIN IMMEDIATE transaction: readers see the old session or this one
            conn.execute("DELETE FROM session_files WHERE thread_id = ? AND harness = ?", key)
            conn.executemany(
                "INSERT INTO session_files (thread_id, harness, path, data) VALUES (?, ?, ?, ?)",
                [(*key, path, data) for path, data in stored.files.items()])
            conn.execute(
                "INSERT OR REPLACE INTO sessions (thread_id, harness, session_id, saved_at, "
                "run_id, size, files) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (*key, info.session_id, info.saved_at, info.run_id, info.size, info.files))

        await self._write(op)
        return info

    async def get_session(self, thread_id: str, harness: str) -> StoredSession | None:
        key = (thread_id, harness)

        def op(conn: sqlite3.Connection) -> tuple[Any, list[Any]] | None:
            head = conn.execute(
                "SELECT session_id, saved_at, run_id FROM sessions "
                "WHERE thread_id = ? AND harness = ?", key).fetchone()
            if head is None:
                return None
            return head, conn.execute(
                "SELECT path, data FROM session_files WHERE thread_id = ? AND harness = ?",
                key).fetchall()

        found = await self._read(op)  # one read transaction: one instant
        if found is None:
            return None
        (session_id, saved_at, run_id), files = found
        return _logic.session_from_rows(thread_id, harness, session_id, saved_at, run_id,
                                        files)

    async def list_sessions(self, thread_id: str) -> list[SessionInfo]:
        rows = await self._read(lambda conn: conn.execute(
            "SELECT harness, session_id, size, files, saved_at, run_id FROM sessions "
            "WHERE thread_id = ? ORDER BY harness", (thread_id,)).fetchall())
        return [SessionInfo(thread_id, h, sid, int(size), int(n), float(at), rid)
                for h, sid, size, n, at, rid in rows]

    async def delete_sessions(self, thread_id: str, harness: str | None = None) -> int:
        where = "thread_id = ?" + ("" if harness is None else " AND harness = ?")
        args = (thread_id,) if harness is None else (thread_id, harness)

        def op(conn: sqlite3.Connection) -> int:
            conn.execute(f"DELETE FROM session_files WHERE {where}", args)
            return int(conn.execute(f"DELETE FROM sessions WHERE {where}", args).rowcount)

        return await self._write(op)
