"""The PostgreSQL store's saved CLI sessions (:class:`~corral.abc.SessionStore`), a mixin:
a header row per (thread, harness) and a row per file (bytea), put whole in one
transaction whose header upsert serializes writers."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

from corral.stores import _logic
from corral.stores._protocols import SessionInfo, SessionLimits, StoredSession

if TYPE_CHECKING:
    from corral.stores._pg_calls import Conn

__all__ = ["SESSION_SQL", "PostgresSessions"]

_T = TypeVar("_T")

SESSION_SQL: Final = {
    # The header's upsert comes first: its row lock serializes writers of one session, so
    # the DELETE that follows (a fresh snapshot under READ COMMITTED) sees the files of
    # whichever writer committed last, and no two writers' files ever mix.
    "put_session": (
        "INSERT INTO {s}.sessions AS h (thread_id, harness, session_id, saved_at, run_id, "
        "size, files) VALUES (%s, %s, %s, %s, %s, %s, %s) "
        "ON CONFLICT (thread_id, harness) DO UPDATE SET session_id = EXCLUDED.session_id, "
        "saved_at = EXCLUDED.saved_at, run_id = EXCLUDED.run_id, size = EXCLUDED.size, "
        "files = EXCLUDED.files"
    ),
    "clear_session_files": "DELETE FROM {s}.session_files WHERE thread_id = %s AND harness = %s",
    "put_session_file": (
        "INSERT INTO {s}.session_files (thread_id, harness, path, data) VALUES (%s, %s, %s, %s)"
    ),
    # one statement, so one snapshot: the header and files of one committed put
    "get_session": (
        "SELECT h.session_id, h.saved_at, h.run_id, f.path, f.data FROM {s}.sessions h "
        "LEFT JOIN {s}.session_files f ON f.thread_id = h.thread_id AND f.harness = h.harness "
        "WHERE h.thread_id = %s AND h.harness = %s"
    ),
    "list_sessions": (
        "SELECT harness, session_id, size, files, saved_at, run_id FROM {s}.sessions "
        "WHERE thread_id = %s ORDER BY harness"
    ),
    "delete_session_files": "DELETE FROM {s}.session_files WHERE thread_id = %s",
    "delete_sessions": "DELETE FROM {s}.sessions WHERE thread_id = %s",
}
"""Statements of this mixin, ``{s}`` for the schema (the store qualifies them once)."""


class PostgresSessions:
    """Saved sessions in the store's PostgreSQL schema (mixed into
    :class:`~corral.stores.PostgresStore`)."""

    _sql: dict[str, str]
    session_limits: SessionLimits

    if TYPE_CHECKING:  # the host class provides these
        async def _tx(self, fn: Callable[[Conn], _T]) -> _T: ...

        async def _stmt(self, fn: Callable[[Conn], _T]) -> _T: ...

    async def put_session(self, session: StoredSession) -> SessionInfo:
        stored = _logic.checked_session(session, self.session_limits)
        info = stored.info()
        key = (stored.thread_id, stored.harness)
        sql = self._sql

        def op(conn: Conn) -> None:
            conn.execute(sql["put_session"], (*key, info.session_id, info.saved_at,
                                              info.run_id, info.size, info.files))
            conn.execute(sql["clear_session_files"], key)
            with conn.cursor() as cur:
                cur.executemany(sql["put_session_file"],
                                [(*key, path, data) for path, data in stored.files.items()])

        await self._tx(op)
        return info

    async def get_session(self, thread_id: str, harness: str) -> StoredSession | None:
        sql = self._sql["get_session"]

        def op(conn: Conn) -> list[tuple[Any, ...]]:
            # binary results: the files come as they are, not as hex text twice their size
            with conn.cursor(binary=True) as cur:
                return cur.execute(sql, (thread_id, harness)).fetchall()

        rows = await self._stmt(op)
        if not rows:
            return None
        session_id, saved_at, run_id = rows[0][:3]
        files = [(path, data) for *_h, path, data in rows if path is not None]
        return _logic.session_from_rows(thread_id, harness, session_id, saved_at, run_id,
                                        files)

    async def list_sessions(self, thread_id: str) -> list[SessionInfo]:
        sql = self._sql["list_sessions"]
        rows = await self._stmt(lambda conn: conn.execute(sql, (thread_id,)).fetchall())
        return [SessionInfo(thread_id, h, sid, int(size), int(n), float(at), rid)
                for h, sid, size, n, at, rid in rows]

    async def delete_sessions(self, thread_id: str, harness: str | None = None) -> int:
        sql = self._sql
        extra = "" if harness is None else " AND harness = %s"
        args = (thread_id,) if harness is None else (thread_id, harness)

        def op(conn: Conn) -> int:
            # the headers first: their row locks wait out a put in flight, whose files the
            # next statement (a fresh snapshot) then sees and removes
            count = int(conn.execute(sql["delete_sessions"] + extra, args).rowcount)
            conn.execute(sql["delete_session_files"] + extra, args)
            return count

        return await self._tx(op)
