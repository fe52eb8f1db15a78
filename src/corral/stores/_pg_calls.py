"""How the PostgreSQL store runs a call: one transaction (or one autocommit statement) on a
connection borrowed from its pool, in a worker thread, or the append's one statement from the
event loop (:mod:`corral.stores._pg_direct`); waiting out an outage with backoff, trying
again once a call that surely did not run (a dead connection found before anything was
written), never one that may have committed; and a failure as one line, password masked."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import psycopg
import psycopg_pool

from corral._errors import ConfigError
from corral._log import library_logger
from corral.stores._pg_direct import LoopStatement, MaybeRun, NotRun, Row
from corral.stores._pg_url import PgTarget
from corral.stores._protocols import InvalidEvent, StoreError, StoreUnavailable

__all__ = ["Conn", "PgCalls", "connect_error"]

log = library_logger("corral.stores._postgres")

_T = TypeVar("_T")
Conn = psycopg.Connection[tuple[Any, ...]]


class _CommitLost(StoreError):
    """The connection died during COMMIT: the write may or may not have landed."""


class _PoolTimedOut(StoreError):
    """No pooled connection was handed out within ``pool_wait``."""


class _Outage:
    """How a call waits out an outage: while the server cannot be reached at all (nothing
    was written), retry with backoff for up to ``outage_wait`` seconds, then fail with
    :class:`StoreUnavailable`. So a driver pauses through a database restart instead of
    failing its run."""

    def __init__(self, target: PgTarget) -> None:
        self.target = target
        self.started: float | None = None
        self.delay = 0.1

    def next_wait(self) -> float:
        """Seconds to wait before the next try; raises once the budget is spent."""
        now = time.monotonic()
        if self.started is None:
            self.started = now
            log.warning("PostgreSQL at %s cannot be reached; waiting up to %d s for it",
                        self.target.where, self.target.outage_wait)
        if now - self.started >= self.target.outage_wait:
            raise StoreUnavailable(
                f"PostgreSQL at {self.target.where} could not be reached for "
                f"{self.target.outage_wait} s; nothing was written, try again once it is back")
        wait, self.delay = self.delay, min(self.delay * 2, 2.0)
        return wait


class _Broken(Exception):
    """A connection failed before the transaction could commit: nothing was written."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


def connect_error(target: PgTarget, exc: BaseException) -> StoreError | ConfigError:
    """One line for a failed connection attempt: where, why, and what to do. A value libpq
    refuses (``port=99999``, ``sslmode=nonsense``) is the URL's fault: a ConfigError."""
    text = target.scrub(str(exc)).strip()
    lower = text.lower()
    if "connection refused" in lower:
        return StoreError(f"cannot reach PostgreSQL at {target.where}: connection refused; "
                          "is the server running?")
    reason = text.splitlines()[0].strip() if text else type(exc).__name__
    if reason.startswith("connection is bad: invalid"):
        return ConfigError(f"store URL {target.url}: {reason.removeprefix('connection is bad: ')}")
    reason = reason.rpartition(" failed: ")[2] if " failed: " in reason else reason
    reason = reason.removeprefix("FATAL:").strip()
    hint = ""
    if "does not exist" in lower and "database" in lower:
        hint = "; create it first (createdb) or fix the URL"
    elif "authentication failed" in lower or "password" in lower:
        hint = "; check the user and password"
    elif "timeout" in lower or "resolve host" in lower or "translate host" in lower:
        hint = "; check the host name and port, and that the server is reachable"
    return StoreError(f"cannot open PostgreSQL store {target.where}: {reason}{hint}")


class PgCalls:
    """The store's calls on its pool (mixed into :class:`~corral.stores.PostgresStore`)."""

    target: PgTarget
    _pool: psycopg_pool.ConnectionPool[Conn]
    _closed: bool

    def _error(self, exc: BaseException) -> StoreError:
        if isinstance(exc, psycopg_pool.PoolTimeout):
            return _PoolTimedOut(
                f"PostgreSQL store {self.target.where}: all {self.target.pool_max} connections "
                f"stayed busy for {self.target.pool_wait} s; raise pool_max in the store URL")
        if isinstance(exc, psycopg_pool.PoolClosed) or self._closed:
            return StoreError(f"PostgreSQL store {self.target.where} is closed")
        if isinstance(exc, psycopg.OperationalError):
            return StoreError(f"lost the connection to PostgreSQL at {self.target.where}: "
                              f"{self.target.scrub(_first_line(exc))}")
        return StoreError(f"PostgreSQL store {self.target.where}: "
                          f"{self.target.scrub(_first_line(exc))}")

    def _attempt(self, fn: Callable[[Conn], _T], write: bool) -> _T:
        with self._pool.connection() as conn:
            if not write:
                try:
                    return fn(conn)
                except psycopg.OperationalError as exc:
                    if conn.broken:
                        raise _Broken() from exc
                    raise
            body_done = False
            try:
                with conn.transaction():
                    result = fn(conn)
                    body_done = True
            except psycopg.OperationalError as exc:
                if conn.broken and not body_done:
                    # before COMMIT: the server rolls back what it got, a retry is safe
                    raise _Broken() from exc
                if conn.broken:
                    raise _CommitLost(
                        f"lost the connection to PostgreSQL at {self.target.where} while "
                        "committing: the write may or may not have been applied") from None
                raise
            return result

    def _run(self, fn: Callable[[Conn], _T], write: bool) -> _T:
        """:meth:`_run_once`, waiting out an outage (:class:`_Outage`)."""
        outage = _Outage(self.target)
        while True:
            try:
                return self._run_once(fn, write)
            except StoreError as exc:
                if self._closed or not self._unreachable(exc):
                    raise
                time.sleep(outage.next_wait())

    def _unreachable(self, exc: StoreError) -> bool:
        """Whether ``exc`` is an outage (no connection to the server can be made now) rather
        than a busy pool or a failed statement: a fresh connection attempt decides."""
        if isinstance(exc, StoreUnavailable | _CommitLost):
            return False  # (a lost COMMIT is never retried: it may have landed)
        if isinstance(exc, _PoolTimedOut):
            # Fewer connections than pool_max yet none handed out: the pool cannot (re)make
            # them, an outage (or its tail: the pool reconnects with its own backoff).
            if self._pool.get_stats().get("pool_size", 0) < self.target.pool_max:
                return True
        try:
            with psycopg.connect(self.target.dsn(connect_timeout=2), autocommit=True):
                return False
        except psycopg.Error:
            return True

    def _run_once(self, fn: Callable[[Conn], _T], write: bool) -> _T:
        """Run ``fn`` in one transaction (one statement, autocommit, when it only reads).
        A connection that turns out dead before anything was written (a restarted server
        leaves the whole pool dead) is replaced and the operation tried once more."""
        try:
            try:
                return self._attempt(fn, write)
            except _Broken:
                self._pool.check()  # drop the pool's other dead connections too
                try:
                    return self._attempt(fn, write)
                except _Broken as again:
                    assert again.__cause__ is not None
                    raise again.__cause__ from None
        except (psycopg.Error, psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed) as exc:
            raise self._error(exc) from None
        except UnicodeEncodeError as exc:
            # a lone surrogate in a string: not representable in UTF-8 (nor in SQLite)
            raise InvalidEvent(f"a value is not valid Unicode text: {exc.reason}") from None

    async def _tx(self, fn: Callable[[Conn], _T]) -> _T:
        """``fn`` in one transaction, in a worker thread."""
        return await anyio.to_thread.run_sync(self._run, fn, True)

    async def _direct(self, statement: LoopStatement, params: Sequence[str | None]) -> Row:
        """:meth:`_direct_once`, waiting out an outage (:class:`_Outage`)."""
        outage = _Outage(self.target)
        while True:
            try:
                return await self._direct_once(statement, params)
            except StoreError as exc:
                if self._closed or not await anyio.to_thread.run_sync(self._unreachable, exc):
                    raise
                await anyio.sleep(outage.next_wait())

    async def _direct_once(self, statement: LoopStatement, params: Sequence[str | None]) -> Row:
        """``statement`` in autocommit mode from the event loop (no worker thread): its
        first row. A connection found dead before the statement ran (a restarted server
        leaves the whole pool dead) is replaced and the statement tried once more; one lost
        after it was sent is a :class:`StoreError` saying the write may or may not have been
        applied."""
        try:
            try:
                return await statement.first_row(self._pool, params)
            except NotRun:
                await anyio.to_thread.run_sync(self._pool.check)
                try:
                    return await statement.first_row(self._pool, params)
                except NotRun as again:
                    assert again.__cause__ is not None
                    raise again.__cause__ from None
        except MaybeRun:
            raise _CommitLost(
                f"lost the connection to PostgreSQL at {self.target.where} while "
                "committing: the write may or may not have been applied") from None
        except (psycopg.Error, psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed) as exc:
            raise self._error(exc) from None
        except UnicodeEncodeError as exc:
            raise InvalidEvent(f"a value is not valid Unicode text: {exc.reason}") from None

    async def _stmt(self, fn: Callable[[Conn], _T]) -> _T:
        """``fn`` in autocommit mode, for reads and for single statements that may run twice
        (no BEGIN/COMMIT round trips): after a lost connection it may be retried whether
        or not the server ran it."""
        return await anyio.to_thread.run_sync(self._run, fn, False)
