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

The connections, and the schema's upgrade on open, are :mod:`corral.stores._sqlite_conn`'s;
the instance records and locks, and the saved sessions, are mixins of their own
(``_sqlite_instances``, ``_sqlite_sessions``), as the checkpoints are
(``_sqlite_checkpoints``).

``synchronous=NORMAL`` (the default) survives process crashes; a power loss can drop the last
transactions. Use ``sqlite:///path?synchronous=full`` to fsync every commit.
"""

from __future__ import annotations

import contextlib
import secrets
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, Final, Self, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

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
    LoggedEvent,
    LogTail,
    NewRun,
    RunActive,
    RunExists,
    SessionLimits,
    StoreError,
    UnknownApproval,
    UnknownRun,
)
from corral.stores import _logic
from corral.stores._signal import NotifySignal
from corral.stores._checkpoints import ThreadHead, manifest_from_bytes
from corral.stores._sqlite_checkpoints import SQLiteCheckpoints
from corral.stores._sqlite_conn import Busy, Conn, open_schema, store_error
from corral.stores._sqlite_instances import SQLiteInstances
from corral.stores._sqlite_sessions import SQLiteSessions
from corral.stores._sqlite_tables import (
    latest_runs,
    records,
    runs_of_thread,
)

_T = TypeVar("_T")


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




class SQLiteStore(_logic.RunTransitions, SQLiteInstances, SQLiteSessions, SQLiteCheckpoints):
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
            self._writer = Conn(self.path, synchronous)
        except sqlite3.Error as exc:
            raise store_error(self.path, exc, "cannot open") from None
        try:
            self.migrated_from = open_schema(self._writer.conn, self.path)
        except StoreError:
            self._writer.close()
            raise
        try:
            self._reader = Conn(self.path, synchronous)
        except sqlite3.Error as exc:
            self._writer.close()
            raise store_error(self.path, exc, "cannot open") from None
        self._soon: Conn | None = None
        """The event loop's connection (:meth:`_write_soon`); None where commits fsync."""
        if synchronous in _LOOP_SYNCHRONOUS:
            try:
                self._soon = Conn(self.path, synchronous, wait=False)
            except sqlite3.Error as exc:
                self._writer.close()
                self._reader.close()
                raise store_error(self.path, exc, "cannot open") from None
        self._soon_writes = 0
        self._signal = NotifySignal(Path(str(self.path) + ".notify"))

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
                if not isinstance(done, Busy):
                    return done
        return await self._write(fn)

    async def _read_soon(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """:meth:`_read` of a short query, on the event loop when it needs no waiting."""
        await anyio.lowlevel.checkpoint()
        if self._soon is not None:
            done = self._soon.transact_now(fn, "BEGIN")
            if not isinstance(done, Busy):
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
