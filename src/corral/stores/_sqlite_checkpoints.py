"""The SQLite store's checkpoints (:class:`~corral.abc.CheckpointStore`), a mixin.

Writes are ``BEGIN IMMEDIATE`` transactions on the store's one writer connection: SQLite
has one writer at a time across every process, so ``put_checkpoint`` (which checks that
its chunks are present) and ``collect_chunks`` (which deletes unnamed, untouched chunks)
never interleave.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, Final, TypeVar

from corral.stores._checkpoints import (
    CHUNK_GRACE,
    Checkpoint,
    CheckpointExists,
    CheckpointInfo,
    ChunkStats,
    MissingChunks,
    check_chunks,
    check_digest,
    manifest_from_bytes,
    manifest_to_bytes,
)

__all__ = ["SQLiteCheckpoints"]

_T = TypeVar("_T")
_BATCH: Final = 512
"""Digests per statement parameter (a JSON array through ``json_each``)."""


def _batches(items: list[str]) -> list[str]:
    return [json.dumps(items[i:i + _BATCH]) for i in range(0, len(items), _BATCH)]


class SQLiteCheckpoints:
    """Checkpoints in the store's SQLite file (mixed into
    :class:`~corral.stores.SQLiteStore`)."""

    if TYPE_CHECKING:  # the host class provides these
        def _now(self, now: float | None) -> float: ...

        async def _write(self, fn: Callable[[sqlite3.Connection], _T]) -> _T: ...

        async def _read(self, fn: Callable[[sqlite3.Connection], _T]) -> _T: ...

    async def put_chunks(self, chunks: Mapping[str, bytes], *, now: float | None = None
                         ) -> None:
        check_chunks(chunks)
        if not chunks:
            return
        at = self._now(now)
        rows = [(d, len(data), at, bytes(data)) for d, data in chunks.items()]

        def op(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO chunks (digest, size, touched_at, data) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (digest) DO UPDATE SET touched_at = excluded.touched_at", rows)

        await self._write(op)

    async def missing_chunks(self, digests: Collection[str], *, now: float | None = None
                             ) -> set[str]:
        wanted = sorted({check_digest(d) for d in digests})
        if not wanted:
            return set()
        at = self._now(now)

        def op(conn: sqlite3.Connection) -> set[str]:
            held: set[str] = set()
            for batch in _batches(wanted):
                held.update(d for (d,) in conn.execute(
                    "UPDATE chunks SET touched_at = ? WHERE digest IN "
                    "(SELECT value FROM json_each(?)) RETURNING digest", (at, batch)))
            return set(wanted) - held

        return await self._write(op)

    async def get_chunks(self, digests: Collection[str]) -> dict[str, bytes]:
        wanted = sorted(set(digests))

        def op(conn: sqlite3.Connection) -> dict[str, bytes]:
            out: dict[str, bytes] = {}
            for batch in _batches(wanted):
                out.update((d, bytes(data)) for d, data in conn.execute(
                    "SELECT digest, data FROM chunks WHERE digest IN "
                    "(SELECT value FROM json_each(?))", (batch,)))
            return out

        return await self._read(op)

    async def put_checkpoint(self, checkpoint: Checkpoint, *, now: float | None = None
                             ) -> None:
        stored = manifest_to_bytes(checkpoint)
        digests = sorted(checkpoint.digests())
        cid = checkpoint.checkpoint_id

        def op(conn: sqlite3.Connection) -> None:
            if conn.execute("SELECT 1 FROM checkpoints WHERE checkpoint_id = ?",
                            (cid,)).fetchone():
                raise CheckpointExists(cid)
            held: set[str] = set()
            for batch in _batches(digests):
                held.update(d for (d,) in conn.execute(
                    "SELECT digest FROM chunks WHERE digest IN (SELECT value FROM json_each(?))",
                    (batch,)))
            if len(held) != len(digests):
                raise MissingChunks(cid, set(digests) - held)
            seq = conn.execute(
                "INSERT INTO checkpoints (checkpoint_id, thread_id, created_at, manifest) "
                "VALUES (?, ?, ?, ?)",
                (cid, checkpoint.thread_id, checkpoint.created_at, stored)).lastrowid
            conn.executemany("INSERT INTO checkpoint_chunks (checkpoint_seq, digest) "
                             "VALUES (?, ?)", [(seq, d) for d in digests])

        await self._write(op)

    async def get_checkpoint(self, checkpoint_id: str) -> Checkpoint | None:
        def op(conn: sqlite3.Connection) -> Any:
            return conn.execute("SELECT manifest FROM checkpoints WHERE checkpoint_id = ?",
                                (checkpoint_id,)).fetchone()

        row = await self._read(op)
        return None if row is None else manifest_from_bytes(bytes(row[0]))

    async def list_checkpoints(self, thread_id: str) -> list[CheckpointInfo]:
        def op(conn: sqlite3.Connection) -> list[Any]:
            return conn.execute(
                "SELECT manifest FROM checkpoints WHERE thread_id = ? ORDER BY created_at, seq",
                (thread_id,)).fetchall()

        return [manifest_from_bytes(bytes(row[0])).info() for row in await self._read(op)]

    async def delete_checkpoint(self, checkpoint_id: str) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            row = conn.execute("DELETE FROM checkpoints WHERE checkpoint_id = ? RETURNING seq",
                               (checkpoint_id,)).fetchone()
            if row is None:
                return False
            conn.execute("DELETE FROM checkpoint_chunks WHERE checkpoint_seq = ?", (row[0],))
            return True

        return await self._write(op)

    async def collect_chunks(self, *, grace: float = CHUNK_GRACE, now: float | None = None
                             ) -> int:
        cutoff = self._now(now) - grace

        def op(conn: sqlite3.Connection) -> int:
            return conn.execute(
                "DELETE FROM chunks WHERE touched_at < ? AND NOT EXISTS "
                "(SELECT 1 FROM checkpoint_chunks r WHERE r.digest = chunks.digest)",
                (cutoff,)).rowcount

        return await self._write(op)

    async def chunk_stats(self) -> ChunkStats:
        def op(conn: sqlite3.Connection) -> Any:
            return conn.execute("SELECT count(*), coalesce(sum(size), 0) FROM chunks").fetchone()

        count, size = await self._read(op)
        return ChunkStats(int(count), int(size))
