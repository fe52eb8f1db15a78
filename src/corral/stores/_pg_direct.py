"""One statement on a pooled PostgreSQL connection, driven from the event loop.

The store's other operations run sync psycopg in a worker thread (psycopg's async API is
asyncio-only). For its hottest statement, the append, the hop is too dear: the event loop
wakes a worker, the worker waits on the socket, then wakes the loop (the same one-statement
append measured ~540 µs through ``anyio.to_thread``, ~350 µs from the loop, on a 2-vCPU
VM). A :class:`LoopStatement` instead sends the statement with libpq's non-blocking calls
(``psycopg.pq``) and waits for the answer with :func:`anyio.wait_readable`, so it works on
asyncio and trio alike. The statement is prepared
once per connection (~50 µs a call less than parsing it each time).

Connections come from the store's sync pool: taken on the loop when one is idle (no
waiting), through a worker thread when the pool must wait or grow.

What a failure means. Every statement here runs in autocommit mode: it is its own
transaction, committed when the server processes the protocol's Sync. Its result rows are
queued before that commit, and the server reports any later error (even a terminating one)
after them, so:

- a connection found closed before sending, or an error the server sent (it has a SQLSTATE)
  with no result rows before it: the statement did not commit. :class:`NotRun`, or the
  server's error when the connection survived; the caller may retry on another connection.
- a connection lost any other way once the statement was sent: it may or may not have
  committed (:class:`MaybeRun`); nobody can tell, so it must not be retried blindly.
"""

from __future__ import annotations

import select
import weakref
from collections.abc import Sequence
from typing import Any, Final

import anyio
import anyio.to_thread
import psycopg
import psycopg_pool
from psycopg import pq

__all__ = ["LoopStatement", "MaybeRun", "NotRun", "Row", "int_array", "text_array"]

Conn = psycopg.Connection[tuple[Any, ...]]
Row = tuple[bytes | None, ...]

_NO_STATEMENT: Final = "26000"
"""SQLSTATE invalid_sql_statement_name: the prepared statement does not exist."""
_TAKE_IDLE: Final = 0.001
"""Seconds :meth:`psycopg_pool.ConnectionPool.getconn` may block the loop when the pool said
a connection was idle (another thread can take it first; then the thread path waits)."""


class NotRun(Exception):
    """The statement did not run (its connection was dead, or the server refused it before
    running it, then closed the connection): safe to retry on another connection. The
    connection's error is the ``__cause__``."""


class MaybeRun(Exception):
    """The connection was lost after the statement was sent: it may or may not have
    committed."""


def text_array(values: Sequence[str]) -> str:
    """A ``text[]`` literal holding ``values`` exactly: every element double-quoted, with
    ``\\`` and ``"`` escaped (nothing else is special inside quotes)."""
    quoted = (v.replace("\\", "\\\\").replace('"', '\\"') for v in values)
    return "{" + ",".join(f'"{v}"' for v in quoted) + "}"


def int_array(values: Sequence[int]) -> str:
    """A ``bigint[]`` literal of ``values``."""
    return "{" + ",".join(str(int(v)) for v in values) + "}"


class LoopStatement:
    """One SQL statement, prepared once per pooled connection (``name`` must be unique
    among the statements run through this class on one pool)."""

    def __init__(self, name: str, sql: str) -> None:
        self.name = name.encode()
        self.sql = sql.encode()
        self._prepared: weakref.WeakSet[Conn] = weakref.WeakSet()

    async def first_row(
        self, pool: psycopg_pool.ConnectionPool[Conn], params: Sequence[str | None]
    ) -> Row:
        """The statement's first result row (text format), run with ``params`` (text).

        Raises :class:`NotRun`, :class:`MaybeRun`, a psycopg error the server answered with,
        the pool's errors, or (nothing sent) :class:`UnicodeEncodeError` for a parameter the
        connection's encoding cannot carry and :class:`psycopg.DataError` for one holding a
        NUL. Not cancellable once started, like a worker thread: a cancelled caller finds out
        after the statement ended and the connection is back in the pool."""
        with anyio.CancelScope(shield=True):
            conn = await _checkout(pool)
            try:
                row = await self._run(conn, params)
            finally:
                pool.putconn(conn)
        return row

    async def _run(self, conn: Conn, params: Sequence[str | None]) -> Row:
        encoding = conn.info.encoding
        values = [None if p is None else _text(p, encoding) for p in params]
        pg = conn.pgconn
        _probe(pg)
        for _attempt in range(2):
            if conn not in self._prepared:
                await self._prepare(pg, encoding)
                self._prepared.add(conn)
            try:
                pg.send_query_prepared(self.name, values)
            except psycopg.OperationalError as exc:
                raise NotRun() from exc  # nothing reached the server
            outcome = _Outcome(await _results(pg), pg, encoding)
            if outcome.error is None:
                if outcome.row is None:
                    raise psycopg.ProgrammingError("the statement returned no row")
                return outcome.row
            if outcome.lost:
                if outcome.refused_before_rows:
                    raise NotRun() from outcome.error
                raise MaybeRun() from outcome.error
            if not (outcome.refused_before_rows and outcome.error.sqlstate == _NO_STATEMENT):
                raise outcome.error  # the server refused it (at commit, too): rolled back
            # psycopg deallocates every prepared statement of a connection after a rollback
            # (DEALLOCATE ALL, its own included): prepare ours again
            self._prepared.discard(conn)
        raise psycopg.ProgrammingError(f"prepared statement {self.name.decode()!r} vanished")

    async def _prepare(self, pg: pq.abc.PGconn, encoding: str) -> None:
        try:
            pg.send_prepare(self.name, self.sql)
        except psycopg.OperationalError as exc:
            raise NotRun() from exc
        outcome = _Outcome(await _results(pg), pg, encoding)
        if outcome.error is not None:
            # PREPARE changes no data: a lost connection here needs no "maybe"
            if outcome.lost:
                raise NotRun() from outcome.error
            raise outcome.error


def _text(value: str, encoding: str) -> bytes:
    """A text parameter: libpq reads one up to its first NUL byte, so ``"r\\0x"`` would
    name run ``"r"``; refused like psycopg refuses it."""
    if "\0" in value:
        raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
    return value.encode(encoding)


class _Outcome:
    """What the results of one statement say: its first row, the first error, whether the
    server itself sent that error before any row, and whether the connection is gone."""

    def __init__(self, results: Sequence[pq.abc.PGresult], pg: pq.abc.PGconn,
                 encoding: str) -> None:
        self.row: Row | None = None
        self.error: psycopg.Error | None = None
        self.refused_before_rows = False
        self.lost = pg.status == pq.ConnStatus.BAD
        for result in results:
            if result.status == pq.ExecStatus.FATAL_ERROR:
                state = result.error_field(pq.DiagnosticField.SQLSTATE)
                message = result.get_error_message(encoding)
                if state is None:  # libpq's own error: the connection failed
                    self.error = psycopg.OperationalError(message)
                else:
                    self.error = _server_error(state.decode(), message)
                    self.refused_before_rows = self.row is None
                return
            if result.status == pq.ExecStatus.TUPLES_OK and self.row is None:
                self.row = (tuple(result.get_value(0, i) for i in range(result.nfields))
                            if result.ntuples else ())


def _server_error(state: str, message: str) -> psycopg.Error:
    try:
        cls = psycopg.errors.lookup(state)
    except KeyError:
        cls = psycopg.DatabaseError
    return cls(message)


async def _checkout(pool: psycopg_pool.ConnectionPool[Conn]) -> Conn:
    """A connection: taken on the loop when the pool has an idle one, else through a
    worker thread (the pool may wait up to its timeout, or open a connection)."""
    if pool.get_stats().get("pool_available", 0) > 0:
        try:
            return pool.getconn(_TAKE_IDLE)
        except psycopg_pool.PoolTimeout:
            pass  # another thread took it first
    return await anyio.to_thread.run_sync(pool.getconn)


def _probe(pg: pq.abc.PGconn) -> None:
    """Raise :class:`NotRun` when an idle connection is already gone: a terminated backend
    has sent its goodbye and closed, so the socket reads (without blocking)."""
    if pg.status == pq.ConnStatus.BAD:
        raise NotRun() from psycopg.OperationalError("the connection is closed")
    readable, _w, _x = select.select([pg.socket], [], [], 0)
    if not readable:
        return
    try:
        pg.consume_input()
    except psycopg.OperationalError as exc:
        raise NotRun() from exc
    if pg.status == pq.ConnStatus.BAD:
        raise NotRun() from psycopg.OperationalError("the server closed the connection")


def _consume(pg: pq.abc.PGconn) -> None:
    try:
        pg.consume_input()
    except psycopg.OperationalError:
        pass  # the connection is gone: get_result reports what arrived and the loss


async def _results(pg: pq.abc.PGconn) -> list[pq.abc.PGresult]:
    """Flush what was sent and collect every result of it."""
    fd = pg.socket
    try:
        while pg.flush():  # 1: the socket's buffer is full, more to send
            await anyio.wait_writable(fd)
    except psycopg.OperationalError as exc:
        # not all of it left: the server never got the Sync that would commit it
        raise NotRun() from exc
    results: list[pq.abc.PGresult] = []
    while True:
        _consume(pg)
        while pg.is_busy():  # false once the connection is bad: get_result won't block
            await anyio.wait_readable(fd)
            _consume(pg)
        result = pg.get_result()
        if result is None:
            return results
        results.append(result)
