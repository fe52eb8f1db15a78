"""The SQLite store's saved CLI sessions (:class:`~corral.abc.SessionStore`), a mixin: a
header row per (thread, harness) and a row per file, put whole in one ``BEGIN IMMEDIATE``
transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from corral.stores import _logic
from corral.stores._protocols import SessionInfo, SessionLimits, StoredSession

__all__ = ["SQLiteSessions"]

_T = TypeVar("_T")


class SQLiteSessions:
    """Saved sessions in the store's SQLite file (mixed into
    :class:`~corral.stores.SQLiteStore`)."""

    session_limits: SessionLimits

    if TYPE_CHECKING:  # the host class provides these
        async def _write(self, fn: Callable[[sqlite3.Connection], _T]) -> _T: ...

        async def _read(self, fn: Callable[[sqlite3.Connection], _T]) -> _T: ...

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
