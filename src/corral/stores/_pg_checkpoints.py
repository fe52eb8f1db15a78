"""The PostgreSQL store's checkpoints (:class:`~corral.abc.CheckpointStore`), a mixin.

Many hosts write at once, so the collector and ``put_checkpoint`` serialize on an
advisory lock of the schema's chunks: ``put_checkpoint`` takes it shared (writers run in
parallel), ``collect_chunks`` exclusive. Under it, a manifest's check that its chunks are
present and its insertion are one step the collector cannot split. Touching (``put_chunks``,
``missing_chunks``) updates rows the collector deletes only when untouched: whichever
commits first, the other sees it (a touched row is re-checked by the waiting DELETE and
kept; a deleted one is reported missing and put again). Rows are locked in digest order,
so concurrent writers of overlapping chunks never deadlock.
"""

from __future__ import annotations

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
from corral.stores._pg_schema import LOCK_CLASS, qualify

if TYPE_CHECKING:
    import psycopg

    Conn = psycopg.Connection[tuple[Any, ...]]

__all__ = ["PostgresCheckpoints"]

_T = TypeVar("_T")

_SQL: Final = {
    "lock_shared": "SELECT pg_advisory_xact_lock_shared(%s, hashtext(%s))",
    "lock": "SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
    # chunks arrive by binary COPY into a table of the transaction, then one INSERT:
    # 4-5x faster than bytea arrays in an INSERT (measured: docs/benchmarks.md, #27)
    "put_chunks_table": "CREATE TEMP TABLE corral_chunks_in (d text, b bytea) ON COMMIT DROP",
    "put_chunks_copy": "COPY pg_temp.corral_chunks_in (d, b) FROM STDIN (FORMAT BINARY)",
    "put_chunks": (
        "INSERT INTO {s}.chunks (digest, size, touched_at, data) "
        "SELECT d, length(b), %s, b FROM pg_temp.corral_chunks_in "
        "ORDER BY d ON CONFLICT (digest) DO UPDATE SET touched_at = EXCLUDED.touched_at"
    ),
    "touch": (
        "UPDATE {s}.chunks c SET touched_at = %s FROM ("
        " SELECT digest FROM {s}.chunks WHERE digest = ANY(%s) ORDER BY digest FOR UPDATE"
        ") l WHERE c.digest = l.digest RETURNING c.digest"
    ),
    "get_chunks": "SELECT digest, data FROM {s}.chunks WHERE digest = ANY(%s)",
    "exists": "SELECT 1 FROM {s}.checkpoints WHERE checkpoint_id = %s",
    "held": "SELECT digest FROM {s}.chunks WHERE digest = ANY(%s)",
    "insert": (
        "INSERT INTO {s}.checkpoints (checkpoint_id, thread_id, created_at, manifest) "
        "VALUES (%s, %s, %s, %s) ON CONFLICT (checkpoint_id) DO NOTHING RETURNING seq"
    ),
    "refs": "INSERT INTO {s}.checkpoint_chunks (checkpoint_seq, digest) "
            "SELECT %s, unnest(%s::text[])",
    "get": "SELECT manifest FROM {s}.checkpoints WHERE checkpoint_id = %s",
    "list": "SELECT manifest FROM {s}.checkpoints WHERE thread_id = %s ORDER BY created_at, seq",
    "delete": "DELETE FROM {s}.checkpoints WHERE checkpoint_id = %s RETURNING seq",
    "unref": "DELETE FROM {s}.checkpoint_chunks WHERE checkpoint_seq = %s",
    "collect": (
        "DELETE FROM {s}.chunks c WHERE c.touched_at < %s AND NOT EXISTS "
        "(SELECT 1 FROM {s}.checkpoint_chunks r WHERE r.digest = c.digest)"
    ),
    "stats": "SELECT count(*), coalesce(sum(size), 0) FROM {s}.chunks",
}


class PostgresCheckpoints:
    """Checkpoints in the store's PostgreSQL schema (mixed into
    :class:`~corral.stores.PostgresStore`)."""

    schema: str

    if TYPE_CHECKING:  # the host class provides these
        def _now(self, now: float | None) -> float: ...

        async def _tx(self, fn: Callable[[Conn], _T]) -> _T: ...

        async def _stmt(self, fn: Callable[[Conn], _T]) -> _T: ...

    def _q(self, name: str) -> str:
        return qualify(_SQL[name], self.schema)

    def _chunk_lock(self) -> tuple[int, str]:
        return (LOCK_CLASS, f"{self.schema}/chunks")

    async def put_chunks(self, chunks: Mapping[str, bytes], *, now: float | None = None
                         ) -> None:
        check_chunks(chunks)
        if not chunks:
            return
        at = self._now(now)
        items = sorted((d, bytes(data)) for d, data in chunks.items())
        table, copy, sql = (self._q(n) for n in ("put_chunks_table", "put_chunks_copy",
                                                 "put_chunks"))

        def op(conn: Conn) -> None:
            conn.execute(table)
            with conn.cursor().copy(copy) as rows:
                rows.set_types(["text", "bytea"])
                for item in items:
                    rows.write_row(item)
            conn.execute(sql, (at,))

        await self._tx(op)

    async def missing_chunks(self, digests: Collection[str], *, now: float | None = None
                             ) -> set[str]:
        wanted = sorted({check_digest(d) for d in digests})
        if not wanted:
            return set()
        at = self._now(now)
        sql = self._q("touch")

        def op(conn: Conn) -> set[str]:
            return {row[0] for row in conn.execute(sql, (at, wanted)).fetchall()}

        return set(wanted) - await self._tx(op)

    async def get_chunks(self, digests: Collection[str]) -> dict[str, bytes]:
        wanted = sorted(set(digests))
        if not wanted:
            return {}
        sql = self._q("get_chunks")

        def op(conn: Conn) -> dict[str, bytes]:
            # binary results: bytea in text form is hex, twice the bytes and a decode
            with conn.cursor(binary=True) as cur:
                return {d: bytes(b) for d, b in cur.execute(sql, (wanted,)).fetchall()}

        return await self._stmt(op)

    async def put_checkpoint(self, checkpoint: Checkpoint, *, now: float | None = None
                             ) -> None:
        stored = manifest_to_bytes(checkpoint)
        digests = sorted(checkpoint.digests())
        cid = checkpoint.checkpoint_id
        lock = self._chunk_lock()
        q = {n: self._q(n) for n in ("lock_shared", "exists", "held", "insert", "refs")}

        def op(conn: Conn) -> None:
            conn.execute(q["lock_shared"], lock)
            if conn.execute(q["exists"], (cid,)).fetchone() is not None:
                raise CheckpointExists(cid)
            held = {row[0] for row in conn.execute(q["held"], (digests,)).fetchall()}
            if len(held) != len(digests):
                raise MissingChunks(cid, set(digests) - held)
            row = conn.execute(q["insert"], (cid, checkpoint.thread_id, checkpoint.created_at,
                                             stored)).fetchone()
            if row is None:  # a concurrent writer of the same id committed first
                raise CheckpointExists(cid)
            conn.execute(q["refs"], (row[0], digests))

        await self._tx(op)

    async def get_checkpoint(self, checkpoint_id: str) -> Checkpoint | None:
        sql = self._q("get")
        row = await self._stmt(lambda conn: conn.execute(sql, (checkpoint_id,)).fetchone())
        return None if row is None else manifest_from_bytes(bytes(row[0]))

    async def list_checkpoints(self, thread_id: str) -> list[CheckpointInfo]:
        sql = self._q("list")
        rows = await self._stmt(lambda conn: conn.execute(sql, (thread_id,)).fetchall())
        return [manifest_from_bytes(bytes(row[0])).info() for row in rows]

    async def delete_checkpoint(self, checkpoint_id: str) -> bool:
        delete, unref = self._q("delete"), self._q("unref")

        def op(conn: Conn) -> bool:
            row = conn.execute(delete, (checkpoint_id,)).fetchone()
            if row is None:
                return False
            conn.execute(unref, (row[0],))
            return True

        return await self._tx(op)

    async def collect_chunks(self, *, grace: float = CHUNK_GRACE, now: float | None = None
                             ) -> int:
        cutoff = self._now(now) - grace
        lock, collect = self._q("lock"), self._q("collect")
        args = self._chunk_lock()

        def op(conn: Conn) -> int:
            conn.execute(lock, args)
            return conn.execute(collect, (cutoff,)).rowcount

        return await self._tx(op)

    async def chunk_stats(self) -> ChunkStats:
        sql = self._q("stats")
        row = await self._stmt(lambda conn: conn.execute(sql).fetchone())
        assert row is not None
        return ChunkStats(int(row[0]), int(row[1]))
