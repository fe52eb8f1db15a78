"""The PostgreSQL store's append: one call of the schema's ``append_events`` function, sent
from the event loop (no worker thread).

Its fencing condition is written in SQL but the rule is ``_logic.append_check``: the property
test below checks that they agree on every state a run can be in. The rest checks what the
one-round-trip path must keep from the four-round-trip transaction it replaced: the events'
JSON text byte for byte, stores made before the function existed, and what a lost
connection means (retried when the append cannot have run, reported when it may have).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import anyio.from_thread
import anyio.to_thread
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.stores import _logic, _pg_schema
from corral.stores._postgres import PostgresStore
from corral.stores._protocols import ClaimRefused, InvalidEvent, NewRun, StoreError
from tests.helpers import (
    postgres_database_url,
    wait_until_async,
)
from tests.helpers import pg_opened as opened
from tests.helpers import pg_sql as _sql


pytestmark = pytest.mark.anyio
DEADLINE = 30.0


def _blocked_appends() -> list[int]:
    """pids of this database's backends waiting for a lock inside ``append_events``."""
    rows = _sql("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE '%append_events%'")
    return [int(r[0]) for r in rows]


class RowLock:
    """Holds a run's row lock, as a claimer's transaction would, until :meth:`release`."""

    def __init__(self, schema: str, run_id: str) -> None:
        self.conn = psycopg.connect(postgres_database_url())
        self.conn.execute(f'SELECT 1 FROM "{schema}".runs WHERE run_id = %s FOR UPDATE',
                          (run_id,))

    def release(self) -> None:
        if not self.conn.closed:
            self.conn.rollback()
            self.conn.close()


@contextmanager
def row_locked(schema: str, run_id: str) -> Iterator[RowLock]:
    lock = RowLock(schema, run_id)
    try:
        yield lock
    finally:
        lock.release()


# ------------------------------------------------------------------ the fencing rule

EPOCHS = st.integers(-2, 4) | st.sampled_from([2**63 - 1, 2**63, -(2**63) - 1, 2**80])


async def test_append_function_and_append_check_agree_on_every_state(pg_url: str) -> None:
    """Whatever the run's state (exists, driver_epoch, closed) and the writer's epoch, the
    store appends exactly when ``_logic.append_check`` allows it, and otherwise raises what
    ``append_check`` raises, with nothing written."""
    async with opened(pg_url) as store:
        await store.create(NewRun("r", "t"))
        schema = store.schema

        @settings(max_examples=150, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(exists=st.booleans(), current=st.integers(0, 3), closed=st.booleans(),
               epoch=EPOCHS, count=st.integers(0, 3))
        def agree(exists: bool, current: int, closed: bool, epoch: int, count: int) -> None:
            _sql(f'UPDATE "{schema}".runs SET driver_epoch = %s, log_closed = %s '
                 "WHERE run_id = 'r'", current, closed)
            run_id = "r" if exists else "missing"
            (before,) = _sql(f'SELECT last_offset FROM "{schema}".runs WHERE run_id = %s', "r")
            logged = len(_sql(f'SELECT 1 FROM "{schema}".events'))
            expected: StoreError | None = None
            try:
                _logic.append_check(current if exists else None, run_id, epoch, closed)
            except StoreError as exc:
                expected = exc
            events = [({"type": "X", "i": i}, i) for i in range(count)]
            try:
                got = anyio.from_thread.run(_append, store, run_id, events, epoch)
            except StoreError as exc:
                assert expected is not None, f"refused what append_check allows: {exc!r}"
                assert (type(exc), exc.args, str(exc)) == (
                    type(expected), expected.args, str(expected))
                assert len(_sql(f'SELECT 1 FROM "{schema}".events')) == logged
                return
            assert expected is None, f"appended what append_check refuses ({expected!r})"
            first = before[0] + 1
            assert got == list(range(first, first + count))
            assert len(_sql(f'SELECT 1 FROM "{schema}".events')) == logged + count

        await anyio.to_thread.run_sync(agree)


async def _append(store: PostgresStore, run_id: str, events: Any, epoch: int) -> list[int]:
    return await store.append(run_id, events, epoch=epoch)


# ------------------------------------------------------------------ the stored text

JSON_TEXT = st.text(st.characters(codec="utf-8"), max_size=40) | st.sampled_from(
    ['"', "\\", '\\"', "{", "}", ",", "NULL", " padded ", "a\nb", '{"x","y"}', "\u2028", "é"])
EVENTS = st.dictionaries(JSON_TEXT, JSON_TEXT | st.integers() | st.lists(JSON_TEXT, max_size=3),
                         max_size=4)


async def test_events_are_stored_as_the_same_json_text(pg_url: str) -> None:
    """Each event's stored text is exactly the JSON text the other backends store (what the
    four-round-trip append stored): quotes, backslashes, braces and any Unicode survive the
    array literal the events travel in."""
    async with opened(pg_url) as store:
        await store.create(NewRun("r", "t"))
        claim = await store.acquire_claim("r", "me", 600)
        schema = store.schema

        @settings(max_examples=60, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(batch=st.lists(EVENTS, min_size=1, max_size=4))
        def same(batch: list[dict[str, Any]]) -> None:
            items = [({"type": "X", **event}, 7) for event in batch]
            texts = [text for text, _jo in _logic.encode_events(items)]
            offsets = anyio.from_thread.run(_append, store, "r", items, claim.epoch)
            rows = _sql(f'SELECT e.event FROM "{schema}".events e JOIN "{schema}".runs r '
                        "ON e.run_seq = r.seq WHERE r.run_id = 'r' AND e.log_offset >= %s "
                        "ORDER BY e.log_offset", offsets[0])
            assert [row[0] for row in rows] == texts
            assert texts == [json.dumps(e, separators=(",", ":"), ensure_ascii=False)
                             for e, _jo in items]

        await anyio.to_thread.run_sync(same)
        snap = await store.snapshot("r")
        assert [e.offset for e in snap] == list(range(1, len(snap) + 1))


async def test_refused_batches_land_nothing_and_leave_the_connection_usable(
    pg_url: str,
) -> None:
    """Text the connection cannot carry (a lone surrogate, a NUL in the run id) is refused
    before anything is sent; a value the server refuses (a journal offset past bigint) rolls
    the statement back. Either way nothing lands and the one pooled connection serves the
    next append."""
    async with opened(pg_url + "&pool_min=1&pool_max=1") as store:
        await store.create(NewRun("r", "t"))
        claim = await store.acquire_claim("r", "me", 600)
        with pytest.raises(InvalidEvent, match="not valid Unicode text"):
            await store.append("r", [({"s": "ok"}, 1), ({"s": "\ud800"}, 2)], epoch=claim.epoch)
        with pytest.raises(StoreError, match="out of range for type bigint"):
            await store.append("r", [({"s": "ok"}, 1), ({"s": "big"}, 2**63)], epoch=claim.epoch)
        # libpq would read a text parameter up to its NUL: this one would name run "r"
        with pytest.raises(StoreError, match="cannot contain NUL"):
            await store.append("r\0x", [({"s": "ok"}, 1)], epoch=claim.epoch)
        assert await store.snapshot("r") == []
        assert await store.append("r", [({"s": "ok"}, 1)], epoch=claim.epoch) == [1]


# ------------------------------------------------------------------ schema version 1


async def test_a_store_made_before_the_function_gets_it_and_keeps_its_log(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store at schema version 1 (events appended by the four-round-trip transaction) is
    migrated when opened: its log continues gap-free, old and new events read alike."""
    with monkeypatch.context() as patch:
        patch.setattr(_pg_schema, "MIGRATIONS", _pg_schema.MIGRATIONS[:1])
        async with opened(pg_url) as old:
            await old.create(NewRun("r", "t"))
            claim = await old.acquire_claim("r", "me", 600)
            schema = old.schema
    assert _sql(f'SELECT max(version) FROM "{schema}".corral_schema') == [(1,)]
    assert _sql("SELECT to_regproc(%s)", f'"{schema}".append_events') == [(None,)]
    # what version 1's append wrote: the events, then the run's offsets
    old_text = '{"type":"X","i":1,"s":"é \\"q\\""}'
    _sql(f'INSERT INTO "{schema}".events SELECT seq, 1, 4, %s FROM "{schema}".runs', old_text)
    _sql(f'UPDATE "{schema}".runs SET last_offset = 1, last_journal_offset = 4')
    async with opened(pg_url) as store:
        assert _sql(f'SELECT max(version) FROM "{schema}".corral_schema') == [
            (_pg_schema.latest_version(),)]
        assert await store.append("r", [({"type": "X", "i": 2}, 5)], epoch=claim.epoch) == [2]
        snap = await store.snapshot("r")
        assert [(e.offset, e.journal_offset, e.event) for e in snap] == [
            (1, 4, json.loads(old_text)), (2, 5, {"type": "X", "i": 2})]


# ------------------------------------------------------------------ lost connections


async def test_an_append_whose_backend_is_terminated_before_it_ran_is_retried_once(
    pg_url: str,
) -> None:
    """Terminated while waiting for the run's row lock, the append's transaction never
    committed (the server says so before any result): the store runs it again on a fresh
    connection, and the batch lands once."""
    async with opened(pg_url + "&pool_min=1&pool_max=1") as store:
        await store.create(NewRun("r", "t"))
        claim = await store.acquire_claim("r", "me", 600)
        got: list[int] = []

        async def append() -> None:
            got.extend(await store.append("r", [({"type": "X"}, 1)], epoch=claim.epoch))

        async with anyio.create_task_group() as tg:
            with row_locked(store.schema, "r"):  # released before the task group waits
                tg.start_soon(append)
                await wait_until_async(lambda: len(_blocked_appends()) == 1,
                                       "the append to wait for the row lock", timeout=DEADLINE)
                (first,) = _blocked_appends()
                _sql("SELECT pg_terminate_backend(%s)", first)
                await wait_until_async(lambda: [p for p in _blocked_appends() if p != first],
                                       "the append to wait again, on a new connection",
                                       timeout=DEADLINE)
                assert not got
        assert got == [1]
        assert [e.offset for e in await store.snapshot("r")] == [1]


class CuttableProxy:
    """A TCP proxy to PostgreSQL whose :meth:`cut` drops every connection at once, without
    a word from the server (as a dead network or host would)."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.socks: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with suppress(OSError):
            while True:
                client, _addr = self.listener.accept()
                server = socket.create_connection(self.upstream)
                with self.lock:
                    self.socks += [client, server]
                for a, b in ((client, server), (server, client)):
                    threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)

    def cut(self) -> None:
        with self.lock:
            socks, self.socks = self.socks, []
        for sock in socks:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.listener.close()
        self.cut()


async def test_a_connection_lost_after_the_append_was_sent_is_reported_not_retried(
    pg_url: str,
) -> None:
    """The connection dies silently while the append waits on the server: it may commit or
    not, so the store says so (and does not run it again). It usually commits once the row
    lock is free: a blind retry would then have logged the batch twice."""
    parts = urlsplit(pg_url)
    proxy = CuttableProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    via_proxy = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}"))
    try:
        async with opened(via_proxy + "&pool_min=1&pool_max=1") as store:
            await store.create(NewRun("r", "t"))
            claim = await store.acquire_claim("r", "me", 600)
            errors: list[StoreError] = []

            async def append() -> None:
                try:
                    await store.append("r", [({"type": "X"}, 1)], epoch=claim.epoch)
                except StoreError as exc:
                    errors.append(exc)

            async with anyio.create_task_group() as tg:
                with row_locked(store.schema, "r"):  # released before the task group waits
                    tg.start_soon(append)
                    await wait_until_async(lambda: len(_blocked_appends()) == 1,
                                           "the append to wait for the row lock",
                                           timeout=DEADLINE)
                    proxy.cut()
                    # reported while the statement still waits: not retried behind our back
                    await wait_until_async(lambda: errors, "the append to fail",
                                           timeout=DEADLINE)
                    assert _blocked_appends()
            assert [str(e) for e in errors] == [
                f"lost the connection to PostgreSQL at {store.target.where} while committing: "
                "the write may or may not have been applied"]
            await wait_until_async(lambda: not _blocked_appends(), "the orphaned append to end",
                                   timeout=DEADLINE)
        async with opened(pg_url) as store:
            snap = await store.snapshot("r")
            # applied or rolled back (the server may notice the dead client first): once at
            # most, never twice
            assert [(e.offset, e.event) for e in snap] in ([], [(1, {"type": "X"})])
    finally:
        proxy.close()


async def test_a_pooled_connection_dropped_silently_is_noticed_before_sending(
    pg_url: str,
) -> None:
    """A pooled connection cut without a word from the server (nothing says why, unlike a
    terminated backend) reads as closed before the append is sent: the append runs on a
    fresh connection instead of being reported as maybe-applied."""
    parts = urlsplit(pg_url)
    proxy = CuttableProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    via_proxy = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}"))
    try:
        async with opened(via_proxy + "&pool_min=1&pool_max=1") as store:
            await store.create(NewRun("r", "t"))
            claim = await store.acquire_claim("r", "me", 600)
            assert await store.append("r", [({"i": 1}, 1)], epoch=claim.epoch) == [1]
            proxy.cut()
            assert await store.append("r", [({"i": 2}, 2)], epoch=claim.epoch) == [2]
            assert [e.event["i"] for e in await store.snapshot("r")] == [1, 2]
    finally:
        proxy.close()


# ------------------------------------------------------------------ the event loop


async def test_a_cancelled_append_finishes_its_statement(pg_url: str) -> None:
    """Like a call in a worker thread, an append sent is not abandoned when its caller is
    cancelled: it returns its offsets, and the connection goes back to the pool clean."""
    async with opened(pg_url + "&pool_min=1&pool_max=1") as store:
        await store.create(NewRun("r", "t"))
        claim = await store.acquire_claim("r", "me", 600)
        got: list[int] = []
        scopes: list[anyio.CancelScope] = []

        async def append() -> None:
            with anyio.CancelScope() as scope:
                scopes.append(scope)
                got.extend(await store.append("r", [({"type": "X"}, 1)], epoch=claim.epoch))

        async with anyio.create_task_group() as tg:
            with row_locked(store.schema, "r"):  # released before the task group waits
                tg.start_soon(append)
                await wait_until_async(lambda: len(_blocked_appends()) == 1,
                                       "the append to wait for the row lock", timeout=DEADLINE)
                scopes[0].cancel()
        assert got == [1]
        assert await store.append("r", [({"type": "X"}, 2)], epoch=claim.epoch) == [2]


async def test_appends_survive_psycopg_deallocating_every_prepared_statement(
    pg_url: str,
) -> None:
    """psycopg answers a rollback on a connection where it prepared statements with
    ``DEALLOCATE ALL``, the append's own statement included: the next append on that
    connection prepares it again."""
    async with opened(pg_url + "&pool_min=1&pool_max=1") as store:
        await store.create(NewRun("r", "t"))
        claim = await store.acquire_claim("r", "me", 600)
        assert await store.append("r", [({"i": 1}, 1)], epoch=claim.epoch) == [1]
        for _ in range(6):  # psycopg prepares a statement run five times
            await store.get("r")
        with pytest.raises(ClaimRefused):  # its transaction rolls back
            await store.acquire_claim("r", "other", 600)
        assert await store.append("r", [({"i": 2}, 2)], epoch=claim.epoch) == [2]


async def test_appenders_share_a_pool_smaller_than_their_number(pg_url: str) -> None:
    """More appenders than pooled connections: those that find none idle wait for one in a
    worker thread; every append lands, gap-free per run."""
    async with opened(pg_url + "&pool_min=1&pool_max=2") as store:
        runs = [f"r{i}" for i in range(6)]
        epochs = {}
        for run_id in runs:
            await store.create(NewRun(run_id, "t"))
            epochs[run_id] = (await store.acquire_claim(run_id, "me", 600)).epoch

        async def appender(run_id: str) -> None:
            for i in range(20):
                got = await store.append(run_id, [({"i": i}, i)], epoch=epochs[run_id])
                assert got == [i + 1]

        with anyio.fail_after(DEADLINE):
            async with anyio.create_task_group() as tg:
                for run_id in runs:
                    tg.start_soon(appender, run_id)
        for run_id in runs:
            snap = await store.snapshot(run_id)
            assert [e.event["i"] for e in snap] == list(range(20))
