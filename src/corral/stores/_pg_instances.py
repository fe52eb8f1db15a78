"""The PostgreSQL store's sandbox instance records and named locks
(:class:`~corral.abc.InstanceStore`, :class:`~corral.abc.LockStore`), a mixin: each one
statement."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final, TypeVar

from corral.stores import _logic
from corral.stores._protocols import InstanceRecord

if TYPE_CHECKING:
    from corral.stores._pg_calls import Conn

__all__ = ["INSTANCE_SQL", "PostgresInstances"]

_T = TypeVar("_T")

INSTANCE_SQL: Final = {
    "get_instance": "SELECT doc FROM {s}.instances WHERE key = %s",
    "upsert_instance": (
        "INSERT INTO {s}.instances (key, expires_at, doc) VALUES (%s, %s, %s) "
        "ON CONFLICT (key) DO UPDATE SET expires_at = EXCLUDED.expires_at, doc = EXCLUDED.doc"
    ),
    "delete_instance": "DELETE FROM {s}.instances WHERE key = %s",
    "expired_instances": (
        "SELECT doc FROM {s}.instances WHERE expires_at IS NOT NULL AND expires_at <= %s "
        "ORDER BY expires_at, key"
    ),
    # Taken when free, lapsed (inclusive) or already ours: one statement, so two hosts
    # racing for a free lock cannot both win.
    "try_lock": (
        "INSERT INTO {s}.locks AS l (name, owner, expires_at) VALUES (%s, %s, %s) "
        "ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, "
        "expires_at = EXCLUDED.expires_at WHERE l.owner = EXCLUDED.owner OR l.expires_at <= %s "
        "RETURNING 1"
    ),
    "unlock": "DELETE FROM {s}.locks WHERE name = %s AND owner = %s",
}
"""Statements of this mixin, ``{s}`` for the schema (the store qualifies them once)."""


class PostgresInstances:
    """Instances and locks in the store's PostgreSQL schema (mixed into
    :class:`~corral.stores.PostgresStore`)."""

    _sql: dict[str, str]

    if TYPE_CHECKING:  # the host class provides these
        def _now(self, now: float | None) -> float: ...

        async def _tx(self, fn: Callable[[Conn], _T]) -> _T: ...

        async def _stmt(self, fn: Callable[[Conn], _T]) -> _T: ...

    async def get_instance(self, key: str) -> InstanceRecord | None:
        sql = self._sql["get_instance"]
        row = await self._stmt(lambda conn: conn.execute(sql, (key,)).fetchone())
        if row is None:
            return None
        return InstanceRecord.from_dict(_logic.decode_event(row[0]))

    async def upsert_instance(self, record: InstanceRecord) -> None:
        doc = _logic.json_text(record.to_dict())
        sql = self._sql["upsert_instance"]
        await self._stmt(lambda conn: conn.execute(sql, (record.key, record.expires_at, doc)))

    async def delete_instance(self, key: str) -> None:
        sql = self._sql["delete_instance"]
        await self._stmt(lambda conn: conn.execute(sql, (key,)))

    async def list_expired_instances(self, now: float) -> list[InstanceRecord]:
        sql = self._sql["expired_instances"]
        rows = await self._stmt(lambda conn: conn.execute(sql, (float(now),)).fetchall())
        return [InstanceRecord.from_dict(_logic.decode_event(row[0])) for row in rows]

    async def try_lock(
        self, name: str, owner: str, ttl: float, *, now: float | None = None
    ) -> bool:
        ttl = _logic.check_ttl(ttl)
        at = self._now(now)
        sql = self._sql["try_lock"]
        row = await self._stmt(
            lambda conn: conn.execute(sql, (name, owner, at + ttl, at)).fetchone())
        return row is not None

    async def unlock(self, name: str, owner: str) -> bool:
        sql = self._sql["unlock"]
        return await self._tx(lambda conn: conn.execute(sql, (name, owner)).rowcount > 0)
