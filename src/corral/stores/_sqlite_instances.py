"""The SQLite store's sandbox instance records and named locks
(:class:`~corral.abc.InstanceStore`, :class:`~corral.abc.LockStore` and the two one-round-trip
forms ``ensure`` uses), a mixin: short transactions, run on the event loop when they need no
waiting (:meth:`~corral.stores.SQLiteStore._write_soon`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from corral.stores import _logic
from corral.stores._protocols import InstanceRecord

__all__ = ["SQLiteInstances"]

_T = TypeVar("_T")


class SQLiteInstances:
    """Instances and locks in the store's SQLite file (mixed into
    :class:`~corral.stores.SQLiteStore`)."""

    if TYPE_CHECKING:  # the host class provides these
        def _now(self, now: float | None) -> float: ...

        async def _read(self, fn: Callable[[sqlite3.Connection], _T]) -> _T: ...

        async def _read_soon(self, fn: Callable[[sqlite3.Connection], _T]) -> _T: ...

        async def _write_soon(self, fn: Callable[[sqlite3.Connection], _T]) -> _T: ...

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
