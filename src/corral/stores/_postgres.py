"""PostgreSQL store: many hosts share runs (``postgresql://user@host:5432/dbname``).

Each operation but the append is one transaction on a connection borrowed from a sync
psycopg pool, run in a worker thread (``anyio.to_thread``): psycopg's async API is
asyncio-only and corral runs on trio too. Fenced writes lock the run's row (``SELECT … FOR
UPDATE``), decide with the shared rules of :mod:`corral.stores._logic` and write in the same
transaction, so concurrent appenders and claimers on any number of hosts serialize on the
row: offsets stay gap-free and nothing from a superseded epoch lands.

An append is one round trip, run from the event loop without a worker thread
(:mod:`corral.stores._pg_direct`): one autocommit call of the schema's ``append_events``
function, which locks the run's row, writes only when the fencing rule allows it, and inserts
the batch, bumps the offsets and notifies in that one transaction. The rule stays
:func:`corral.stores._logic.append_check`: when the function wrote nothing it returns what it
saw, and the store asks ``append_check`` which error to raise. A connection lost after the
call was sent leaves the append undecided (it may have committed): that is reported, never
retried; a connection found dead before, or a call the server refused before running it, is
retried once on a fresh connection.

How a call runs on the pool and waits out an outage is :mod:`corral.stores._pg_calls`'s; the
instance records, locks and saved sessions are mixins of their own (``_pg_instances``,
``_pg_sessions``), as the checkpoints are (``_pg_checkpoints``).

Tails wait for ``LISTEN/NOTIFY`` wake-ups through one listening connection per process
(:mod:`corral.stores._pg_listen`) and re-read every ``fallback`` seconds regardless.

Times: methods default ``now`` to this host's ``time.time()``, like the SQLite store, and
not to the database's clock. corral compares instants from several places (a reaper passes
its own ``now``, drivers stamp ``detached_since`` and ``finished_at``), so one clock for all
of them means the hosts' clocks; keep them synchronized (NTP). Skew never breaks fencing (the
epoch decides who may write); it only moves when another host sees a lapsed lease as lapsed.

Durability is PostgreSQL's: ``synchronous_commit`` as the server (or the URL's libpq
``options``) sets it.
"""

from __future__ import annotations

import json
import secrets as _secrets
import threading
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing
from functools import partial
from typing import Any, Final, Self, TypeVar

import anyio
import anyio.to_thread
import psycopg
import psycopg_pool

from corral.stores import _logic
from corral.stores._pg_direct import LoopStatement, int_array, text_array
from corral.stores._pg_listen import CHANNEL, LISTEN_NAME, Hub, RunWakeups, payload
from corral.stores._pg_listen import subscribe, unsubscribe
from corral.stores._pg_calls import Conn, PgCalls, connect_error
from corral.stores._pg_checkpoints import PostgresCheckpoints
from corral.stores._pg_instances import INSTANCE_SQL, PostgresInstances
from corral.stores._pg_sessions import SESSION_SQL, PostgresSessions
from corral.stores._pg_schema import ensure_schema, qualify
from corral.stores._pg_url import PgTarget, parse_postgres_url
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
from corral.stores._checkpoints import ThreadHead, manifest_from_bytes
from corral.stores._records import (
    RunRecord,
    RunStatus,
    is_terminal_status,
    record_from_json,
)

# While the server is down the pool logs a warning per reconnect attempt, several a second;
# the LISTEN thread already says once that PostgreSQL is unreachable. An application that
# set this logger's level itself keeps its choice.
if logging.getLogger("psycopg.pool").level == logging.NOTSET:
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)

__all__ = ["PostgresStore"]

_T = TypeVar("_T")

_READ_BATCH: Final = 1000
FALLBACK_POLL: Final = 5.0
"""Seconds a tailer waits for a notification before re-reading anyway."""
_BIGINT: Final = (-(2**63), 2**63 - 1)
_APPEND: Final = (
    "SELECT o_exists, o_epoch, o_closed, o_first "
    "FROM {s}.append_events($1, $2::bigint, $3::bigint[], $4::text[], $5, $6)"
)


def _load(conn: Conn, sql: Mapping[str, str], run_id: str) -> tuple[int, RunRecord] | None:
    row = conn.execute(sql["lock_doc"], (run_id,)).fetchone()
    return None if row is None else (int(row[0]), record_from_json(row[1]))


def _records(rows: Sequence[tuple[Any, ...]]) -> list[RunRecord]:
    return [record_from_json(row[0]) for row in rows]


def _json(value: Any, what: str) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{what} is not JSON-serializable: {exc}") from None


_SQL: Final = {
    "lock_doc": "SELECT seq, doc FROM {s}.runs WHERE run_id = %s FOR UPDATE",
    "doc": "SELECT doc FROM {s}.runs WHERE run_id = %s",
    "insert_run": (
        "INSERT INTO {s}.runs (run_id, thread_id, status, started_at, unattended_since, "
        "driver_epoch, doc) VALUES (%s, %s, %s, %s, %s, %s, %s) "
        "ON CONFLICT (run_id) DO NOTHING RETURNING seq"
    ),
    "save_run": (
        "UPDATE {s}.runs SET thread_id = %s, status = %s, started_at = %s, "
        "unattended_since = %s, driver_epoch = %s, doc = %s WHERE seq = %s"
    ),
    "active": (
        "SELECT doc FROM {s}.runs WHERE thread_id = %s AND status = 'running' "
        "ORDER BY started_at DESC, seq DESC LIMIT 1"
    ),
    "by_thread": "SELECT doc FROM {s}.runs WHERE thread_id = %s ORDER BY started_at, seq",
    "lock_status": "SELECT seq, status FROM {s}.runs WHERE run_id = %s FOR UPDATE",
    "delete_events": "DELETE FROM {s}.events WHERE run_seq = %s",
    "delete_approvals": "DELETE FROM {s}.approvals WHERE run_id = %s",
    "delete_run": "DELETE FROM {s}.runs WHERE seq = %s",
    # one statement, one snapshot: the thread's newest run (but one) and newest checkpoint
    "thread_head": (
        "SELECT (SELECT doc FROM {s}.runs WHERE thread_id = %(t)s "
        "AND run_id IS DISTINCT FROM %(but)s::text ORDER BY started_at DESC, seq DESC LIMIT 1), "
        "(SELECT manifest FROM {s}.checkpoints WHERE thread_id = %(t)s "
        "ORDER BY created_at DESC, seq DESC LIMIT 1)"
    ),
    "newest": "SELECT doc FROM {s}.runs ORDER BY started_at DESC, seq DESC LIMIT %s",
    "newest_status": (
        "SELECT doc FROM {s}.runs WHERE status = %s ORDER BY started_at DESC, seq DESC LIMIT %s"
    ),
    # Walks the partial index runs_unattended in order: LIMIT stops the scan.
    "reclaimable": (
        "SELECT doc FROM {s}.runs WHERE status = 'running' AND unattended_since IS NOT NULL "
        "AND unattended_since <= %s ORDER BY unattended_since, seq LIMIT %s"
    ),
    "lock_log": (
        "SELECT seq, driver_epoch, last_offset, log_closed FROM {s}.runs WHERE run_id = %s "
        "FOR UPDATE"
    ),
    "notify": "SELECT pg_notify(%s, %s)",
    "close_log": (
        "WITH done AS (UPDATE {s}.runs SET log_closed = true WHERE seq = %s) "
        "SELECT pg_notify(%s, %s)"
    ),
    "fetch_after": (
        "SELECT r.last_offset, r.log_closed, e.log_offset, e.journal_offset, e.event "
        "FROM {s}.runs r LEFT JOIN LATERAL ("
        " SELECT log_offset, journal_offset, event FROM {s}.events"
        " WHERE run_seq = r.seq AND log_offset > %s ORDER BY log_offset LIMIT %s"
        ") e ON true WHERE r.run_id = %s ORDER BY e.log_offset"
    ),
    "snapshot": (
        "SELECT e.log_offset, e.journal_offset, e.event FROM {s}.events e "
        "JOIN {s}.runs r ON e.run_seq = r.seq WHERE r.run_id = %s ORDER BY e.log_offset"
    ),
    "tail": "SELECT last_offset, last_journal_offset, log_closed FROM {s}.runs WHERE run_id = %s",
    "add_approval": (
        "INSERT INTO {s}.approvals (run_id, approval_id, tool, args, call_id, created_at, "
        "expires_at) VALUES (%s, %s, %s, %s, %s, %s, %s) "
        "ON CONFLICT (run_id, approval_id) DO NOTHING RETURNING 1"
    ),
    "answer_approval": (
        "UPDATE {s}.approvals SET decision = %s, reason = %s, answered_at = %s "
        "WHERE run_id = %s AND approval_id = %s AND decision IS NULL RETURNING 1"
    ),
    "get_approval": (
        "SELECT tool, args, call_id, created_at, expires_at, decision, reason, answered_at "
        "FROM {s}.approvals WHERE run_id = %s AND approval_id = %s"
    ),
    "pending_approvals": (
        "SELECT approval_id, tool, args, call_id, created_at, expires_at "
        "FROM {s}.approvals WHERE run_id = %s AND decision IS NULL ORDER BY created_at, seq"
    ),
    "add_secret": (
        "INSERT INTO {s}.secrets (name, value) VALUES (%s, %s) ON CONFLICT (name) DO NOTHING"
    ),
    "get_secret": "SELECT value FROM {s}.secrets WHERE name = %s",
}


def _run_row(record: RunRecord) -> tuple[Any, ...]:
    """The indexed columns of ``record`` (its ``unattended_since`` is what
    ``list_reclaimable`` orders by) and its stored JSON."""
    return (
        record.thread_id,
        record.status.value,
        record.started_at,
        record.unattended_since,
        record.driver_epoch,
        _logic.record_to_json(record),
    )


class PostgresStore(_logic.RunTransitions, PgCalls, PostgresInstances, PostgresSessions,
                    PostgresCheckpoints):
    """All store protocols over one PostgreSQL database (``postgresql://…``).

    Open with :meth:`open` (or :func:`corral.stores.open_store`); ``fallback`` is how many
    seconds a tailer waits for a notification before re-reading anyway.
    """

    def __init__(
        self,
        target: PgTarget,
        pool: psycopg_pool.ConnectionPool[Conn],
        *,
        clock: Callable[[], float] = time.time,
        fallback: float = FALLBACK_POLL,
    ) -> None:
        self.target = target
        self.url = target.url
        self.session_limits = SessionLimits()
        self.schema = target.schema
        self._pool = pool
        self._clock = clock
        self._fallback = fallback
        self._sql = {name: qualify(text, target.schema)
                     for name, text in (_SQL | INSTANCE_SQL | SESSION_SQL).items()}
        self._secrets: dict[str, bytes] = {}  # read so far: a stored secret never changes
        self._append_statement = LoopStatement("corral_append", qualify(_APPEND, target.schema))
        self._wakeups = RunWakeups(target.schema)
        self._hub: Hub | None = None
        self._hub_lock = threading.Lock()
        self._closed = False

    @classmethod
    async def open(
        cls,
        url: str | PgTarget,
        *,
        clock: Callable[[], float] = time.time,
        fallback: float = FALLBACK_POLL,
    ) -> PostgresStore:
        """Connect, create or migrate the schema, and open the pool. Raises
        :class:`~corral.ConfigError` for a bad URL and :class:`StoreError` (one line,
        password masked) when the server cannot be reached or the store is too new."""
        target = parse_postgres_url(url) if isinstance(url, str) else url
        pool = await anyio.to_thread.run_sync(cls._connect, target, clock())
        return cls(target, pool, clock=clock, fallback=fallback)

    @staticmethod
    def _connect(target: PgTarget, now: float) -> psycopg_pool.ConnectionPool[Conn]:
        try:
            with psycopg.connect(target.dsn(), autocommit=True) as conn:
                ensure_schema(conn, target.schema, target.where, now)
        except psycopg.Error as exc:
            raise connect_error(target, exc) from None
        pool: psycopg_pool.ConnectionPool[Conn] = psycopg_pool.ConnectionPool(
            target.dsn(),
            min_size=target.pool_min,
            max_size=target.pool_max,
            kwargs={"autocommit": True},
            open=False,
            name=f"corral:{target.schema}",
            timeout=target.pool_wait,
        )
        try:
            pool.open(wait=True, timeout=30.0)
        except psycopg_pool.PoolTimeout:
            pool.close()
            raise StoreError(f"cannot reach PostgreSQL at {target.where}: the connection pool "
                             "could not open its connections within 30 s") from None
        return pool

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the pool and stop listening (the last store of a database out stops the
        process's listening connection)."""
        if self._closed:
            return
        self._closed = True
        self._wakeups.close()
        with self._hub_lock:
            hub, self._hub = self._hub, None
        thread = unsubscribe(hub, self._wakeups) if hub is not None else None
        await anyio.to_thread.run_sync(self._pool.close, 10.0)
        if thread is not None and thread.is_alive():
            await anyio.to_thread.run_sync(thread.join, 10.0)

    def _insert(self, conn: Conn, record: RunRecord) -> bool:
        row = conn.execute(self._sql["insert_run"], (record.run_id, *_run_row(record))).fetchone()
        return row is not None

    def _save(self, conn: Conn, seq: int, record: RunRecord) -> None:
        conn.execute(self._sql["save_run"], (*_run_row(record), seq))

    def _load(self, conn: Conn, run_id: str) -> tuple[int, RunRecord | None]:
        found = _load(conn, self._sql, run_id)
        return (0, None) if found is None else found

    async def _transition(
        self, run_id: str, step: Callable[[RunRecord | None], tuple[RunRecord | None, _T]]
    ) -> tuple[RunRecord | None, _T]:
        def op(conn: Conn) -> tuple[RunRecord | None, _T]:
            seq, old = self._load(conn, run_id)
            new, rest = step(old)
            if new is not None and new is not old:
                self._save(conn, seq, new)
            return new, rest

        return await self._tx(op)

    async def diagnose(self, timeout: float = 5.0) -> str:
        """One line for ``corral doctor``: the server, the schema version, and that a
        notification reaches this process's listening connection (a NOTIFY sent now must
        come back within ``timeout`` seconds). Raises :class:`StoreError` naming what
        fails."""
        sql = qualify("SELECT current_setting('server_version'), "
                      "(SELECT max(version) FROM {s}.corral_schema)", self.schema)
        row = await self._stmt(lambda conn: conn.execute(sql).fetchone())
        assert row is not None
        server, version = str(row[0]).split()[0], row[1]
        self._listen()
        hub = self._hub
        assert hub is not None
        probe = f"corral-diagnose-{_secrets.token_hex(8)}"
        with anyio.move_on_after(timeout), self._wakeups.watch(probe):
            while not hub.listening.is_set():  # a threading.Event: look, don't block
                await anyio.sleep(0.02)
            note = payload(self.schema, probe)
            await self._stmt(lambda conn: conn.execute(self._sql["notify"], (CHANNEL, note)))
            while not self._wakeups.notified(probe) and not self._closed:  # the probe only
                await self._wakeups.wait(probe, self._wakeups.seen(probe), timeout)
            if self._wakeups.notified(probe):
                return (f"PostgreSQL {server} at {self.target.where} (schema {self.schema}), "
                        f"schema version {version}; LISTEN/NOTIFY works")
        raise StoreError(
            f"PostgreSQL store {self.target.where}: LISTEN/NOTIFY did not deliver a "
            f"notification within {timeout:g} s"
            + (f" (the listening connection: {hub.last_error})" if hub.last_error else "")
            + "; tails fall back to re-reading every few seconds")

    # ------------------------------------------------------------------ runs

    async def create(self, new: NewRun, *, now: float | None = None) -> RunRecord:
        record = new.record(self._now(now))
        _logic.record_to_json(record)  # refuse a non-JSON field before any I/O

        def op(conn: Conn) -> RunRecord:
            if not self._insert(conn, record):
                raise RunExists(new.run_id)
            return record

        # a transaction, not autocommit: a retry after a lost connection must not
        # answer RunExists for the run it created itself
        return await self._tx(op)

    async def create_or_resume(self, new: NewRun, *, now: float | None = None) -> RunRecord:
        record = new.record(self._now(now))
        _logic.record_to_json(record)

        def op(conn: Conn) -> RunRecord:
            if self._insert(conn, record):
                return record
            # Taken: a concurrent creator's row is committed by now (the insert waited).
            row = conn.execute(self._sql["doc"], (new.run_id,)).fetchone()
            if row is None:
                raise StoreError(f"run {new.run_id!r} vanished while being created; retry")
            return record_from_json(row[0])

        return await self._stmt(op)

    async def get(self, run_id: str) -> RunRecord | None:
        def op(conn: Conn) -> RunRecord | None:
            row = conn.execute(self._sql["doc"], (run_id,)).fetchone()
            return None if row is None else record_from_json(row[0])

        return await self._stmt(op)

    async def find_active_run(self, thread_id: str) -> RunRecord | None:
        def op(conn: Conn) -> RunRecord | None:
            found = _records(conn.execute(self._sql["active"], (thread_id,)).fetchall())
            return found[0] if found else None

        return await self._stmt(op)

    async def delete_run(self, run_id: str) -> bool:
        sql = self._sql
        note = payload(self.schema, run_id)

        def op(conn: Conn) -> bool:
            row = conn.execute(sql["lock_status"], (run_id,)).fetchone()
            if row is None:
                return False
            if not is_terminal_status(row[1]):
                raise RunActive(run_id, str(row[1]))
            conn.execute(sql["delete_events"], (row[0],))
            conn.execute(sql["delete_approvals"], (run_id,))
            conn.execute(sql["delete_run"], (row[0],))
            # a tailer of its log looks again (at commit), and finds it gone
            conn.execute(sql["notify"], (CHANNEL, note))
            return True

        return await self._tx(op)

    async def thread_head(self, thread_id: str, *, but: str | None = None) -> ThreadHead:
        sql = self._sql["thread_head"]

        def op(conn: Conn) -> tuple[Any, ...] | None:
            return conn.execute(sql, {"t": thread_id, "but": but}).fetchone()

        row = await self._stmt(op)
        doc, manifest = (None, None) if row is None else row
        return ThreadHead(None if manifest is None else manifest_from_bytes(bytes(manifest)),
                          None if doc is None else record_from_json(doc))

    async def list_by_thread(self, thread_id: str) -> list[RunRecord]:
        sql = self._sql["by_thread"]
        return await self._stmt(lambda conn: _records(conn.execute(sql, (thread_id,)).fetchall()))

    async def list_runs(
        self, *, status: RunStatus | None = None, limit: int = 100
    ) -> list[RunRecord]:
        limit = _logic.check_limit(limit)
        args: tuple[object, ...]
        if status is None:
            sql, args = self._sql["newest"], (limit,)
        else:
            sql, args = self._sql["newest_status"], (RunStatus(status).value, limit)
        return await self._stmt(lambda conn: _records(conn.execute(sql, args).fetchall()))

    async def list_reclaimable(
        self, now: float, ttl: float, *, limit: int | None = None
    ) -> list[RunRecord]:
        cutoff = float(now - ttl)
        count = _logic.check_cap(limit)
        sql = self._sql["reclaimable"]
        return await self._stmt(
            lambda conn: _records(conn.execute(sql, (cutoff, count)).fetchall()))

    # ------------------------------------------------------------------ event log

    async def _append(self, run_id: str, encoded: list[tuple[str, int]], epoch: int) -> int:
        # An epoch no bigint can hold matches no run: send one that never writes (< 1), and
        # let append_check judge the real one.
        sent = int(epoch) if isinstance(epoch, int) and _BIGINT[0] <= epoch <= _BIGINT[1] else 0
        params = (run_id, str(sent), int_array([jo for _t, jo in encoded]),
                  text_array([text for text, _jo in encoded]), CHANNEL,
                  payload(self.schema, run_id))
        exists, current, closed, first = await self._direct(self._append_statement, params)
        if first is None:
            # Nothing written: the rule says why, in the words of every other backend.
            _logic.append_check(None if exists != b"t" or current is None else int(current),
                                run_id, epoch, closed == b"t")
            raise StoreError(
                f"PostgreSQL store {self.target.where}: {self.schema}.append_events refused "
                f"an append to {run_id!r} at epoch {epoch} that _logic.append_check allows "
                "(a bug in corral: please report it)")
        return int(first)

    def _listen(self) -> None:
        """Subscribe this store to its process's listening connection (idempotent)."""
        if self._closed:
            raise StoreError(f"PostgreSQL store {self.target.where} is closed")
        with self._hub_lock:
            if self._hub is None:
                # TCP keepalives: a connection that dies silently is noticed in ~25 s
                dsn = self.target.dsn(application_name=LISTEN_NAME, keepalives=1,
                                      keepalives_idle=10, keepalives_interval=5,
                                      keepalives_count=3)
                self._hub = subscribe(dsn, self._wakeups)

    def _fetch_after(
        self, run_id: str, position: int, conn: Conn
    ) -> tuple[list[tuple[Any, ...]], bool, int] | None:
        rows = conn.execute(self._sql["fetch_after"], (position, _READ_BATCH, run_id)).fetchall()
        if not rows:
            return None
        events = [(r[2], r[3], r[4]) for r in rows if r[2] is not None]
        return events, bool(rows[0][1]), int(rows[0][0])

    async def read(self, run_id: str, after: int = 0) -> AsyncIterator[LoggedEvent]:
        self._listen()

        def mark() -> Callable[[], Awaitable[None]]:
            return partial(self._wakeups.wait, run_id, self._wakeups.seen(run_id), self._fallback)

        def fetch(position: int) -> Awaitable[_logic.Fetched | None]:
            return self._stmt(partial(self._fetch_after, run_id, position))

        with self._wakeups.watch(run_id):  # before the first query: no wake-up slips by
            async with aclosing(_logic.follow_log(run_id, after, fetch, mark)) as events:
                async for event in events:
                    yield event

    async def close(self, run_id: str, *, epoch: int | None = None) -> bool:
        note = payload(self.schema, run_id)
        sql = self._sql

        def op(conn: Conn) -> bool:
            row = conn.execute(sql["lock_log"], (run_id,)).fetchone()
            if not _logic.close_allowed(None if row is None else int(row[1]), epoch):
                return False
            assert row is not None
            if not row[3]:
                conn.execute(sql["close_log"], (int(row[0]), CHANNEL, note))
            return True

        return await self._tx(op)

    async def snapshot(self, run_id: str) -> list[LoggedEvent]:
        sql = self._sql["snapshot"]
        rows = await self._stmt(lambda conn: conn.execute(sql, (run_id,)).fetchall())
        return [LoggedEvent(int(o), int(j), _logic.decode_event(t)) for o, j, t in rows]

    async def tail(self, run_id: str) -> LogTail:
        sql = self._sql["tail"]
        row = await self._stmt(lambda conn: conn.execute(sql, (run_id,)).fetchone())
        if row is None:
            raise UnknownRun(run_id)
        return LogTail(int(row[0]), None if row[1] is None else int(row[1]), bool(row[2]))

    # ------------------------------------------------------------------ approvals

    async def add_approval(self, request: ApprovalRequest) -> None:
        args = _json(request.args, f"approval request {request.approval_id!r}: args")
        sql = self._sql["add_approval"]
        values = (request.run_id, request.approval_id, request.tool, args, request.call_id,
                  float(request.created_at), float(request.expires_at))
        row = await self._tx(lambda conn: conn.execute(sql, values).fetchone())
        if row is None:
            raise ApprovalExists(request.run_id, request.approval_id)

    async def answer_approval(
        self, run_id: str, approval_id: str, answer: ApprovalAnswer
    ) -> ApprovalAnswer:
        sql = self._sql

        def op(conn: Conn) -> ApprovalAnswer:
            # The UPDATE takes the row lock: of two concurrent answers the second finds the
            # first one committed (decision no longer NULL) and reads it back.
            done = conn.execute(sql["answer_approval"], (
                answer.decision, answer.reason, float(answer.answered_at), run_id,
                approval_id)).fetchone()
            if done is not None:
                return answer
            row = conn.execute(sql["get_approval"], (run_id, approval_id)).fetchone()
            if row is None:
                raise UnknownApproval(run_id, approval_id)
            return ApprovalAnswer(str(row[5]), row[6], float(row[7]))

        return await self._tx(op)

    async def get_approval(
        self, run_id: str, approval_id: str
    ) -> tuple[ApprovalRequest, ApprovalAnswer | None] | None:
        sql = self._sql["get_approval"]
        row = await self._stmt(lambda conn: conn.execute(sql, (run_id, approval_id)).fetchone())
        if row is None:
            return None
        tool, args, call_id, created, expires, decision, reason, answered = row
        request = ApprovalRequest(approval_id, run_id, tool, json.loads(args), float(created),
                                  float(expires), call_id)
        if decision is None:
            return request, None
        return request, ApprovalAnswer(str(decision), reason, float(answered))

    async def list_pending_approvals(self, run_id: str) -> list[ApprovalRequest]:
        sql = self._sql["pending_approvals"]
        rows = await self._stmt(lambda conn: conn.execute(sql, (run_id,)).fetchall())
        return [
            ApprovalRequest(aid, run_id, tool, json.loads(args), float(created), float(expires),
                            call_id)
            for aid, tool, args, call_id, created, expires in rows
        ]

    # ------------------------------------------------------------------ secrets

    async def shared_secret(self, name: str) -> bytes:
        if not isinstance(name, str) or not name:
            raise StoreError(f"a secret name must be a non-empty string, got {name!r}")
        known = self._secrets.get(name)
        if known is not None:
            return known
        fresh = _secrets.token_bytes(32)
        sql = self._sql

        def op(conn: Conn) -> bytes:
            # Insert-if-absent, then read: concurrent first callers on different hosts all
            # read the one value that won.
            conn.execute(sql["add_secret"], (name, fresh))
            row = conn.execute(sql["get_secret"], (name,)).fetchone()
            assert row is not None
            return bytes(row[0])

        value = await self._tx(op)
        self._secrets[name] = value
        return value
