"""PostgreSQL-specific behaviour: URLs, many processes appending and tailing one run, the
listening connection (shared, reconnected), schema versions, the CLI.

Each test uses a fresh schema of this test process's database (``tests.helpers``); a
PostgreSQL server is required (``CORRAL_TEST_POSTGRES``): without one these tests fail.
"""

from __future__ import annotations

import contextlib
import json
import operator
import os
import socket
import subprocess
import sys
import textwrap
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import anyio.to_thread
import psycopg
import pytest
from anyio.streams.text import TextReceiveStream
from hypothesis import given, settings
from hypothesis import strategies as st

from corral._errors import ConfigError
from corral.stores import open_store
from corral.stores._pg_listen import LISTEN_NAME, Hub, hubs
from corral.stores._pg_schema import SchemaTooNew, latest_version
from corral.stores._pg_url import mask_url, parse_postgres_url
from corral.stores._postgres import PostgresStore
from corral.stores._protocols import (
    ApprovalAnswer,
    ApprovalExists,
    ApprovalRequest,
    NewRun,
    StoreError,
    UnknownApproval,
)
from tests.helpers import (
    drop_postgres_schema,
    one_line_refusal,
    postgres_database_url,
    postgres_schema,
    wait_until,
    wait_until_async,
)
from tests.helpers import pg_opened as opened
from tests.helpers import pg_sql as _sql

SRC = Path(__file__).resolve().parents[2] / "src"

pytestmark = pytest.mark.anyio
DEADLINE = 30.0
HOUR = 3600.0


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("CORRAL_STORE", None)
    env.update(extra)
    return env


def _own_ports() -> set[int]:
    """The local ports of this process's TCP sockets (the server sees them as its
    connections' ``client_port``)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _backends(application_name: str) -> list[int]:
    """pids of this process's connections to the test database named
    ``application_name`` (not another test process's: the server is shared)."""
    rows = _sql("SELECT pid, client_port FROM pg_stat_activity WHERE datname = "
                "current_database() AND application_name = %s", application_name)
    mine = _own_ports()
    return [int(r[0]) for r in rows if r[1] in mine]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------ URLs


async def test_urls_open_with_options_and_libpq_parameters(pg_url: str) -> None:
    schema = pg_url.rpartition("schema=")[2]
    for scheme in ("postgresql", "postgres"):
        url = (pg_url.replace("postgresql", scheme, 1)
               + "&pool_min=2&pool_max=3&sslmode=disable&connect_timeout=5")
        store = await open_store(url)
        try:
            assert isinstance(store, PostgresStore) and store.url == url
            assert store.schema == schema
            assert (store._pool.min_size, store._pool.max_size) == (2, 3)
            await store.create(NewRun(f"r-{scheme}", "t"))
        finally:
            await store.aclose()
    tables = _sql("SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                  schema)
    assert {"runs", "events", "instances", "locks", "approvals", "secrets",
            "corral_schema"} <= {t for (t,) in tables}
    # a libpq parameter reaches libpq: this server has no TLS, so requiring it fails
    with pytest.raises(StoreError, match="SSL"):
        await open_store(pg_url + "&sslmode=require")


@pytest.mark.parametrize(("url", "needle"), [
    ("postgresql://u:hunter22@h/db?bogus=1", "unknown option(s) bogus"),
    ("postgresql://u:hunter22@h/db?pool_min=x", "pool_min must be a whole number"),
    ("postgresql://u:hunter22@h/db?pool_max=0", "pool_max must be a whole number"),
    ("postgresql://u:hunter22@h/db?pool_min=5&pool_max=2", "pool_min (5) is larger"),
    ("postgresql://u:hunter22@h/db?schema=Bad-Name", "schema must be a lowercase name"),
    ("postgresql://u:hunter22@h/db?schema=pg_x", "schema must be a lowercase name"),
    ("postgresql://u:hunter22@h/db?schema=a&schema=b", "option schema is given twice"),
    ("postgresql://u:hunter22@[::1/db", "postgresql://u:***@"),
    ("postgresql://u:hunter22@127.0.0.1/db?password=hunter22&sslmode=nonsense",
     'invalid sslmode value: "nonsense"'),
    ("postgresql://u:hunter22@127.0.0.1:99999/db", 'invalid port number: "99999"'),
])
async def test_bad_urls_are_one_line_config_errors(url: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        await open_store(url)
    text = str(info.value)
    assert needle in text and "hunter22" not in text and "\n" not in text, text


async def test_unreachable_server_is_one_clear_line() -> None:
    port = _closed_port()
    with pytest.raises(StoreError) as info:
        await open_store(f"postgresql://postgres:hunter22@127.0.0.1:{port}/x")
    assert str(info.value) == (
        f"cannot reach PostgreSQL at postgresql://postgres:***@127.0.0.1:{port}/x: "
        "connection refused; is the server running?")
    base = postgres_database_url().rpartition("/")[0]
    with pytest.raises(StoreError, match='database "corral_no_such_db" does not exist; '
                                         "create it first"):
        await open_store(f"{base}/corral_no_such_db")


_PASSWORDS = st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1,
                     max_size=20).map(lambda s: "pw" + s)


@given(password=_PASSWORDS)
@settings(max_examples=200, deadline=None)
def test_passwords_reach_libpq_intact_and_never_a_message(password: str) -> None:
    """Property: whatever a password holds, libpq gets it exactly and the masked URL (the
    only form corral prints) holds none of it."""
    encoded = quote(password, safe="")
    url = (f"postgresql://user:{encoded}@db.example:5432/corral?schema=s&pool_max=4"
           f"&password={encoded}&sslmode=disable")
    target = parse_postgres_url(url)
    from psycopg.conninfo import conninfo_to_dict

    assert conninfo_to_dict(target.dsn())["password"] == password
    for shown in (target.url, target.where, mask_url(url)):
        assert encoded not in shown and "***" in shown
    assert target.scrub(f"libpq said {password}") == "libpq said ***"
    assert (target.schema, target.pool_max) == ("s", 4)


# ------------------------------------------------------------------ many processes

APPENDER = textwrap.dedent(
    """
    import json, sys, time, anyio
    from corral.stores import open_store
    from corral.stores._protocols import ClaimLost, ClaimRefused

    async def main(url, name, total):
        store = await open_store(url)
        sent = 0
        while sent < total:
            try:
                # a 20 ms lease: others take the run over as soon as it lapses
                claim = await store.acquire_claim("r", name, 0.02)
            except ClaimRefused:
                await anyio.sleep(0.005)
                continue
            while sent < total:
                size = min(1 + sent % 4, total - sent)
                batch = [({"w": name, "epoch": claim.epoch, "n": sent + k}, sent + k)
                         for k in range(size)]
                try:
                    await store.append("r", batch, epoch=claim.epoch)
                except ClaimLost:
                    print(json.dumps({"lost": claim.epoch}), flush=True)
                    break
                sent += size
                print(json.dumps({"acked": [e for e, _ in batch]}), flush=True)
                if sent % 20 < size:
                    # a stall past the lease, however fast appends are: others may take
                    # the run over, and this writer's next append is then fenced
                    await anyio.sleep(0.03)
        await store.aclose()

    anyio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]))
    """
)


async def test_appenders_in_many_processes_with_claims_changing_hands(pg_url: str) -> None:
    async with opened(pg_url) as store:
        await store.create(NewRun("r", "t"))
        writers = [f"w{i}" for i in range(4)]
        with anyio.fail_after(120):
            results = []
            async with anyio.create_task_group() as tg:

                async def run(name: str) -> None:
                    proc = await anyio.run_process(
                        [sys.executable, "-c", APPENDER, pg_url, name, "150"], env=_env(),
                        check=False)
                    assert proc.returncode == 0, proc.stderr.decode()
                    results.append(proc.stdout.decode())

                for name in writers:
                    tg.start_soon(run, name)
        acked: list[dict[str, Any]] = []
        lost = 0
        for out in results:
            for line in out.splitlines():
                item = json.loads(line)
                acked += item.get("acked", [])
                lost += "lost" in item
        snap = await store.snapshot("r")
        # gap-free and strictly increasing, whoever appended
        assert [e.offset for e in snap] == list(range(1, len(snap) + 1))
        logged = [e.event for e in snap]
        # every acknowledged event landed once; nothing unacknowledged (a fenced append) did
        assert sorted(map(json.dumps, logged)) == sorted(map(json.dumps, acked))
        assert len(logged) == 4 * 150
        epochs = [e["epoch"] for e in logged]
        assert epochs == sorted(epochs)  # once superseded, an epoch never lands again
        assert len(set(epochs)) >= 8 and lost >= 1, (len(set(epochs)), lost)
        for e in snap:  # each epoch belongs to one writer
            assert {x["w"] for x in logged if x["epoch"] == e.event["epoch"]} == {e.event["w"]}
        tail = await store.tail("r")
        assert tail.last_offset == len(snap)
        assert tail.last_journal_offset == max(e.journal_offset for e in snap)


READER = textwrap.dedent(
    """
    import json, sys, anyio
    from corral.stores._postgres import PostgresStore

    async def main(url, run_id):
        # a one-hour fallback poll: anything it sees sooner came through NOTIFY
        store = await PostgresStore.open(url, fallback=3600)
        print(json.dumps({"ready": True}), flush=True)
        async for e in store.read(run_id):
            print(json.dumps({"offset": e.offset, "i": e.event["i"]}), flush=True)
        print(json.dumps({"connects": store._hub.connects}), flush=True)
        await store.aclose()

    anyio.run(main, sys.argv[1], sys.argv[2])
    """
)


class Lines:
    """The JSON lines a child process prints, read as they come."""

    def __init__(self, stream: Any) -> None:
        self.stream = TextReceiveStream(stream)
        self.items: list[dict[str, Any]] = []
        self._buffer = ""

    async def pump(self) -> None:
        async for chunk in self.stream:
            *lines, self._buffer = (self._buffer + chunk).split("\n")
            self.items += [json.loads(line) for line in lines if line]


async def test_reader_in_another_process_is_woken_by_notify(pg_url: str) -> None:
    async with opened(pg_url) as store:
        await store.create(NewRun("r", "t"))
        claim = await store.acquire_claim("r", "me", 600)
        async with await anyio.open_process(
            [sys.executable, "-c", READER, pg_url, "r"], env=_env()
        ) as proc, anyio.create_task_group() as tg:
            assert proc.stdout is not None
            out = Lines(proc.stdout)
            tg.start_soon(out.pump)
            await wait_until_async(lambda: {"ready": True} in out.items, "the reader to start",
                                   timeout=DEADLINE)
            for i in range(1, 6):
                await store.append("r", [({"type": "X", "i": i}, i)], epoch=claim.epoch)
                # a fallback of an hour: only a notification can deliver it this soon
                await wait_until_async(partial(operator.contains, out.items, {"offset": i, "i": i}),
                                       f"the other process to see event {i}", timeout=DEADLINE)
            await store.close("r")
            await wait_until_async(lambda: any("connects" in x for x in out.items),
                                   "the reader to end", timeout=DEADLINE)
            assert await proc.wait() == 0
        assert [x["offset"] for x in out.items if "offset" in x] == [1, 2, 3, 4, 5]
        assert out.items[-1] == {"connects": 1}  # no reconnect woke it


# ------------------------------------------------------------------ the listening connection


async def test_dropped_listen_connection_reconnects_and_nothing_is_lost_or_repeated(
    pg_url: str,
) -> None:
    async with opened(pg_url, fallback=HOUR) as store:
        await store.create(NewRun("r", "t"))
        claim = await store.acquire_claim("r", "me", 600)
        got: list[int] = []

        async def append(first: int, last: int) -> None:
            for i in range(first, last + 1):
                await store.append("r", [({"type": "X", "i": i}, i)], epoch=claim.epoch)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:

                async def reader() -> None:
                    async for e in store.read("r"):
                        assert e.event["i"] == e.offset
                        got.append(e.offset)

                tg.start_soon(reader)
                await append(1, 5)
                await wait_until_async(lambda: got == [1, 2, 3, 4, 5], "events 1-5",
                                       timeout=DEADLINE)
                hub = store._hub
                assert hub is not None and hub.listening.is_set() and hub.connects == 1
                pid = hub.backend_pid
                hub.allow_connect.clear()  # hold the connection down while we append
                assert _sql("SELECT pg_terminate_backend(%s)", pid) == [(True,)]
                await wait_until_async(lambda: not hub.listening.is_set(),
                                       "the listener to notice its connection died",
                                       timeout=DEADLINE)
                await append(6, 10)  # nobody listens: these notifications go nowhere
                assert got == [1, 2, 3, 4, 5]
                hub.allow_connect.set()
                # the reconnected listener wakes every reader, who re-read from 5
                await wait_until_async(lambda: got == list(range(1, 11)), "events 6-10",
                                       timeout=DEADLINE)
                assert hub.connects == 2 and hub.backend_pid != pid
                await append(11, 15)  # and notifications flow on the new connection
                await wait_until_async(lambda: len(got) == 15, "events 11-15",
                                       timeout=DEADLINE)
                await store.close("r")
        assert got == list(range(1, 16))


async def test_diagnose_proves_notifications_come_back(pg_url: str) -> None:
    async with opened(pg_url) as store:
        line = await store.diagnose()
        assert line.startswith("PostgreSQL 15") or line.startswith("PostgreSQL 1"), line
        assert f"(schema {store.schema}), schema version {latest_version()}; " \
               "LISTEN/NOTIFY works" in line
        hub = store._hub
        assert hub is not None
        hub.allow_connect.clear()  # the listening connection goes down and stays down
        _sql("SELECT pg_terminate_backend(%s)", hub.backend_pid)
        await wait_until_async(lambda: not hub.listening.is_set(), "the listener to drop",
                               timeout=DEADLINE)
        with pytest.raises(StoreError, match="LISTEN/NOTIFY did not deliver a notification "
                                             "within 0.5 s .the listening connection: "):
            await store.diagnose(timeout=0.5)
        hub.allow_connect.set()


async def test_two_hundred_readers_share_one_listen_connection(pg_url: str) -> None:
    other_schema, other_url = postgres_schema()
    try:
        async with opened(pg_url) as a, opened(other_url) as b:
            hub: Hub | None = None
            runs = [(store, f"r{i}") for store in (a, b) for i in range(10)]
            epochs = {}
            for store, run_id in runs:
                await store.create(NewRun(run_id, "t"))
                epochs[store.schema, run_id] = (
                    await store.acquire_claim(run_id, "me", 600)).epoch
            counts: dict[tuple[str, str], int] = {}
            done = 0
            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:

                    async def reader(store: PostgresStore, run_id: str) -> None:
                        nonlocal done
                        async for _e in store.read(run_id):
                            counts[store.schema, run_id] = counts.get(
                                (store.schema, run_id), 0) + 1
                        done += 1

                    for k in range(200):
                        store, run_id = runs[k % len(runs)]
                        tg.start_soon(reader, store, run_id)
                    for store, run_id in runs:
                        await store.append(run_id, [({"type": "X"}, 1)],
                                           epoch=epochs[store.schema, run_id])
                    # every reader has its event, while all 200 are still reading
                    await wait_until_async(
                        lambda: sum(counts.values()) == 200, "200 readers to see an event",
                        timeout=DEADLINE)
                    # (an earlier test's listener may still be closing its connection)
                    async def one_listener() -> bool:
                        found = await anyio.to_thread.run_sync(_backends, LISTEN_NAME)
                        return len(found) == 1

                    await wait_until_async(one_listener, "one LISTEN connection", timeout=30)
                    pooled = await anyio.to_thread.run_sync(_backends, "corral")
                    assert len(pooled) <= 2 * 10  # two pools of at most pool_max each
                    hub = a._hub
                    assert hub is not None and b._hub is hub  # one listener, both schemas
                    for store, run_id in runs:
                        await store.close(run_id)
            assert done == 200
        # the last store out closes the listening connection
        assert await anyio.to_thread.run_sync(_backends, LISTEN_NAME) == []
        assert hub is not None and not hub.thread.is_alive() and hub not in hubs()
    finally:
        drop_postgres_schema(other_schema)


async def test_closing_the_store_ends_its_readers_with_a_clear_error(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url, fallback=HOUR)
    await store.create(NewRun("r", "t"))
    errors: list[BaseException] = []
    started = 0
    with anyio.fail_after(DEADLINE):
        async with anyio.create_task_group() as tg:

            async def reader() -> None:
                nonlocal started
                started += 1
                try:
                    async for _e in store.read("r"):
                        pass
                except StoreError as exc:
                    errors.append(exc)

            for _ in range(3):  # one watches the socket, two wait on it
                tg.start_soon(reader)
            # parked: one on the socket, the others on the event
            await wait_until_async(lambda: started == 3 and store._wakeups._draining
                                   and store._wakeups._event is not None,
                                   "the readers to wait", timeout=DEADLINE)
            await store.aclose()
    assert len(errors) == 3 and all("is closed" in str(e) for e in errors), errors


async def test_a_dead_pooled_connection_is_replaced_before_anything_is_written(
    pg_url: str,
) -> None:
    """A restarted server leaves the pool's connections dead: the next operation notices
    before writing anything and runs again on a fresh one."""
    async with opened(pg_url + "&pool_min=1&pool_max=1") as store:
        await store.create(NewRun("r", "t"))
        claim = await store.acquire_claim("r", "me", 600)
        assert (first := _backends("corral"))  # the pool's connection, found to be killed
        for pid in first:
            _sql("SELECT pg_terminate_backend(%s)", pid)
        assert await store.append("r", [({"type": "X"}, 1)], epoch=claim.epoch) == [1]
        assert (second := _backends("corral")) and not set(second) & set(first)
        for pid in second:
            _sql("SELECT pg_terminate_backend(%s)", pid)
        got = await store.get("r")
        assert got is not None and got.driver_epoch == claim.epoch
        assert [e.offset for e in await store.snapshot("r")] == [1]


# ------------------------------------------------------------------ schema versions


async def test_store_newer_than_this_corral_is_refused(pg_url: str) -> None:
    async with opened(pg_url) as store:
        schema = store.schema
    newer = latest_version() + 1
    _sql(f'INSERT INTO "{schema}".corral_schema VALUES (%s, 0)', newer)
    with pytest.raises(SchemaTooNew) as info:
        await open_store(pg_url)
    where = postgres_database_url()
    assert str(info.value) == (f"store {where} has schema version {newer}, this corral "
                               f"understands up to {latest_version()}; upgrade corral")


OPENER = textwrap.dedent(
    """
    import json, sys, anyio
    from corral.stores import _pg_schema
    from corral.stores._postgres import PostgresStore

    # a newer corral: one more migration, slow enough that both openers overlap in it
    _pg_schema.MIGRATIONS.append((_pg_schema.latest_version() + 1, '''
        CREATE TABLE {s}.probe (pid integer NOT NULL);
        INSERT INTO {s}.probe VALUES (pg_backend_pid());
        SELECT pg_sleep(0.5);
    '''))

    async def main(url):
        print("ready", flush=True)
        sys.stdin.readline()  # both start together
        store = await PostgresStore.open(url)
        await store.aclose()
        print("opened", flush=True)

    anyio.run(main, sys.argv[1])
    """
)


def _race(script: str, url: str, n: int) -> list[tuple[int, str, str]]:
    """Run ``script`` in ``n`` processes released together once each printed ``ready``:
    each one's (exit code, stdout after ``ready``, stderr)."""
    procs = [
        subprocess.Popen([sys.executable, "-c", script, url], env=_env(), text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(n)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline() == "ready\n"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            p.kill()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs, strict=True)]


@pytest.mark.parametrize("existing", [False, True], ids=["fresh", "older-store"])
async def test_migrations_run_once_when_two_processes_open_at_once(
    pg_url: str, existing: bool
) -> None:
    if existing:  # a store at this corral's version, which the child's corral migrates
        async with opened(pg_url):
            pass
    for code, out, err in _race(OPENER, pg_url, 2):
        assert code == 0 and out == "opened\n", err
    schema = pg_url.rpartition("schema=")[2]
    assert len(_sql(f'SELECT pid FROM "{schema}".probe')) == 1
    versions = [v for (v,) in _sql(f'SELECT version FROM "{schema}".corral_schema ORDER BY 1')]
    assert versions == list(range(1, latest_version() + 2))


async def test_reclaimable_listing_walks_an_index(pg_url: str) -> None:
    """``list_reclaimable(limit=…)`` reads the runs_unattended index in order and stops at
    the limit: no sort, no scan of every detached run."""
    async with opened(pg_url) as store:
        await store.create(NewRun("seed", "t"))
        schema = store.schema
        _sql(f'INSERT INTO "{schema}".runs (run_id, thread_id, status, started_at, '
             "unattended_since, doc) SELECT 'r' || i, 't', "
             "CASE WHEN i % 3 = 0 THEN 'completed' ELSE 'running' END, i, i, '{}' "
             "FROM generate_series(1, 20000) i")
        _sql(f'ANALYZE "{schema}".runs')
        with psycopg.connect(postgres_database_url()) as conn:
            plan = conn.execute("EXPLAIN (FORMAT JSON) " + store._sql["reclaimable"],
                                (15000.0, 5)).fetchone()
        assert plan is not None
        text = json.dumps(plan[0])
        assert '"Index Name": "runs_unattended"' in text and '"Sort"' not in text, text


# ------------------------------------------------------------------ approvals and secrets


async def test_approvals_first_answer_stands_across_hosts(pg_url: str) -> None:
    async with opened(pg_url) as host_a, opened(pg_url) as host_b:
        t = 1_700_000_000.0
        first = ApprovalRequest("ap-1", "r", "shell", {"cmd": ["ls", "-l"], "ü": None}, t, t + 60)
        second = ApprovalRequest("ap-2", "r", "write", [1, 2], t, t + 60, call_id="c2")
        earlier = ApprovalRequest("ap-0", "r", "read", "x", t - 1, t + 60)
        for request in (first, second, earlier):
            await host_a.add_approval(request)
        with pytest.raises(ApprovalExists):
            await host_b.add_approval(first)
        await host_a.add_approval(ApprovalRequest("ap-1", "other-run", "shell", {}, t, t + 1))
        assert await host_b.list_pending_approvals("r") == [earlier, first, second]
        assert await host_b.get_approval("r", "ap-1") == (first, None)
        assert await host_b.get_approval("r", "nope") is None
        allow = ApprovalAnswer("allow", None, t + 5)
        deny = ApprovalAnswer("deny", "no", t + 6)
        # both hosts answer at once: exactly one answer stands, and both are told which
        with anyio.fail_after(DEADLINE):
            answers: list[ApprovalAnswer] = []
            async with anyio.create_task_group() as tg:

                async def answer(store: PostgresStore, a: ApprovalAnswer) -> None:
                    answers.append(await store.answer_approval("r", "ap-1", a))

                tg.start_soon(answer, host_a, allow)
                tg.start_soon(answer, host_b, deny)
        assert answers[0] == answers[1] and answers[0] in (allow, deny)
        assert await host_a.get_approval("r", "ap-1") == (first, answers[0])
        assert await host_b.answer_approval("r", "ap-1", allow) == answers[0]
        assert await host_a.list_pending_approvals("r") == [earlier, second]
        with pytest.raises(UnknownApproval):
            await host_a.answer_approval("r", "nope", allow)
        with pytest.raises(StoreError, match="not JSON"):
            await host_a.add_approval(ApprovalRequest("ap-9", "r", "x", {1, 2}, t, t))


SECRET = textwrap.dedent(
    """
    import sys, anyio
    from corral.stores import open_store

    async def main(url):
        store = await open_store(url)
        print("ready", flush=True)
        sys.stdin.readline()
        print((await store.shared_secret("signing")).hex(), flush=True)
        await store.aclose()

    anyio.run(main, sys.argv[1])
    """
)


async def test_shared_secret_is_made_once_for_every_host(pg_url: str) -> None:
    outs = _race(SECRET, pg_url, 3)
    secrets = {out.strip() for _code, out, _err in outs}
    assert len(secrets) == 1 and len(bytes.fromhex(secrets.pop())) == 32, outs
    async with opened(pg_url) as store:
        again = await store.shared_secret("signing")
        assert again.hex() == outs[0][1].strip()
        other = await store.shared_secret("tokens")
        assert len(other) == 32 and other != again
        with pytest.raises(StoreError):
            await store.shared_secret("")


# ------------------------------------------------------------------ the CLI


def test_cli_lists_and_attaches_runs_of_a_postgres_store(pg_url: str, corral_home: Path) -> None:
    async def seed() -> None:
        async with opened(pg_url) as store:
            for i in range(3):
                await store.create(NewRun(f"run-{i}", "t", started_at=1_700_000_000.0 + i))
            claim = await store.acquire_claim("run-1", "me", 60)
            await store.append("run-1", [({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m",
                                           "delta": "hello"}, 1)], epoch=claim.epoch)
            await store.close("run-1")

    anyio.run(seed)
    cmd = [sys.executable, "-m", "corral"]
    env = _env(CORRAL_HOME=str(corral_home))
    out = subprocess.run([*cmd, "ls", "--json", "--store", pg_url], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert [r["run_id"] for r in json.loads(out.stdout)] == ["run-2", "run-1", "run-0"]
    out = subprocess.run([*cmd, "ls", "--json"], env={**env, "CORRAL_STORE": pg_url},
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0 and len(json.loads(out.stdout)) == 3, out.stderr
    out = subprocess.run([*cmd, "show", "run-1", "--json", "--store", pg_url], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0 and json.loads(out.stdout)["run_id"] == "run-1", out.stderr


def test_cli_refuses_bad_and_unreachable_stores_in_one_line(corral_home: Path) -> None:
    cmd = [sys.executable, "-m", "corral", "ls", "--store"]
    env = _env(CORRAL_HOME=str(corral_home))
    port = _closed_port()
    r = subprocess.run([*cmd, f"postgresql://postgres:hunter22@127.0.0.1:{port}/x"],
                       env=env, capture_output=True, text=True, timeout=60, check=False)
    one_line_refusal(r, f"cannot reach PostgreSQL at postgresql://postgres:***@127.0.0.1:{port}/x"
                        ": connection refused; is the server running?")
    assert "hunter22" not in r.stderr
    r = subprocess.run([*cmd, "postgres://u:hunter22@127.0.0.1/x?pool_size=3"], env=env,
                       capture_output=True, text=True, timeout=60, check=False)
    one_line_refusal(r, "unknown option(s) pool_size", "u:***@")
    assert "hunter22" not in r.stderr


def test_cli_refuses_a_store_too_new_in_one_line(pg_url: str, corral_home: Path) -> None:
    async def make() -> str:
        async with opened(pg_url) as store:
            return store.schema

    schema = anyio.run(make)
    _sql(f'INSERT INTO "{schema}".corral_schema VALUES (%s, 0)', latest_version() + 7)
    r = subprocess.run([sys.executable, "-m", "corral", "ls", "--store", pg_url],
                       env=_env(CORRAL_HOME=str(corral_home)), capture_output=True, text=True,
                       timeout=60, check=False)
    one_line_refusal(r, f"has schema version {latest_version() + 7}", "upgrade corral")


def test_two_servers_share_a_postgres_store(
    pg_url: str, tmp_path: Path, need_bwrap_runs: None
) -> None:
    """Two ``corral serve`` processes with their own homes (two hosts) on one PostgreSQL
    store: a run started on one streams, whole and in order, from the other; the start-up
    log names the store with its password masked."""
    from tests.server.conftest import Home, read_stream, ticker, ticker_text

    url = pg_url.replace("postgresql://postgres@", "postgresql://postgres:hunter22@", 1)
    homes = []
    for name in ("host-a", "host-b"):
        (tmp_path / name).mkdir()
        homes.append(Home(tmp_path / name))
    with homes[0].server("--store", url) as a, homes[1].server("--store", url) as b:
        created = a.start(ticker(20, 0.02), thread_id="t", run_id="shared")
        assert created["status"] == "running"
        got, ended = read_stream(b, "shared")
        assert ended and [o for o, _e in got] == list(range(1, len(got) + 1))
        events = [e for _o, e in got]
        assert events[0]["type"] == "RUN_STARTED" and events[-1]["type"] == "RUN_FINISHED"
        text = "".join(e.get("delta", "") for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
        assert text == ticker_text(20)
        wait_until(lambda: b.run("shared")["status"] == "completed", "the run's record to "
                   "say completed", timeout=DEADLINE)
    for log in (a.log, b.log):
        line = "".join(log)
        assert "server processes on every host using it share" in line, line
        assert "postgres:***@" in line and "hunter22" not in line

