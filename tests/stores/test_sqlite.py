"""SQLite-specific behaviour: URLs, corrupt rows, several connections and processes, crashes."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
from functools import partial
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
from anyio.streams.text import TextReceiveStream

from corral._errors import ConfigError
from corral.stores._records import CorruptRecord, RunStatus
from corral.stores._protocols import (
    ApprovalAnswer,
    ApprovalRequest,
    ClaimLost,
    InstanceRecord,
    NewRun,
    StoreError,
)
from corral.stores import default_store_url, open_store
from corral.stores._memory import MemoryStore
from corral.stores._protocols import StoredSession
from corral.stores._sqlite import SQLiteStore
from corral.stores._sqlite_tables import SCHEMA_VERSION
from corral.stores._sqlite_tables import MIGRATIONS
from tests.helpers import one_line_refusal

SRC = Path(__file__).resolve().parents[2] / "src"
pytestmark = pytest.mark.anyio
DEADLINE = 20.0


async def test_open_store_urls(tmp_path: Path, corral_home: Path) -> None:
    assert isinstance(await open_store("memory://"), MemoryStore)
    s = await open_store(f"sqlite://{tmp_path / 'a.db'}")
    assert isinstance(s, SQLiteStore) and s.path == tmp_path / "a.db"
    await s.aclose()
    s = await open_store(f"sqlite:///{tmp_path / 'b.db'}")  # SQLAlchemy-style four slashes
    assert isinstance(s, SQLiteStore) and s.path == tmp_path / "b.db"
    await s.aclose()
    assert default_store_url() == f"sqlite://{corral_home / 'corral.db'}"
    s = await open_store()
    assert isinstance(s, SQLiteStore) and s.path == corral_home / "corral.db"
    await s.aclose()
    for bad in ["nonsense", "ftp://x", "sqlite://", "memory://x", f"sqlite://{tmp_path}/c.db?x=1",
                f"sqlite://{tmp_path}/c.db?synchronous=maybe", "redis://localhost/0"]:
        with pytest.raises(ConfigError):
            await open_store(bad)


async def test_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="SQLite store .*not a database"):
        await open_store(f"sqlite://{path}")


async def test_corrupt_stored_values_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    store = await open_store(f"sqlite://{path}")
    await store.create(NewRun("r", "t"))
    raw = sqlite3.connect(path)
    doc = json.loads(raw.execute("SELECT doc FROM runs").fetchone()[0])
    doc["status"] = "toString"
    raw.execute("UPDATE runs SET doc = ?", (json.dumps(doc),))
    raw.commit()
    raw.close()
    with pytest.raises(CorruptRecord, match="toString"):
        await store.get("r")
    with pytest.raises(CorruptRecord):
        await store.list_by_thread("t")
    await store.aclose()


async def test_two_connections_share_one_database(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'shared.db'}"
    a, b = await open_store(url), await open_store(url)
    await a.create(NewRun("r", "t"))
    claim = await b.acquire_claim("r", "b", 30)
    got: list[int] = []
    with anyio.fail_after(DEADLINE):
        async with anyio.create_task_group() as tg:

            async def reader() -> None:
                async for e in a.read("r"):
                    got.append(e.offset)

            tg.start_soon(reader)
            for i in range(20):
                await b.append("r", [({"type": "X", "i": i}, i)], epoch=claim.epoch)
            await b.close("r")
    assert got == list(range(1, 21))
    with pytest.raises(ClaimLost):
        await a.append("r", [({"type": "X"}, 0)], epoch=claim.epoch - 1)
    await a.aclose()
    await b.aclose()


APPENDER = textwrap.dedent(
    """
    import sys, anyio
    from corral.stores import open_store

    async def main(url, run_id, epoch, count):
        store = await open_store(url)
        for i in range(count):
            await store.append(run_id, [({"type": "X", "i": i}, i)], epoch=epoch)
            print(i, flush=True)
        await store.aclose()

    anyio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    """
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    return env


async def test_append_in_another_process_pokes_this_one(tmp_path: Path) -> None:
    """A tailer is woken by the appender's poke, not by its fallback poll."""
    url = f"sqlite://{tmp_path / 'x.db'}"
    store = await open_store(url)
    assert isinstance(store, SQLiteStore)
    await store.create(NewRun("r", "t"))
    claim = await store.acquire_claim("r", "me", 60)
    store._signal.listen()
    sock = store._signal._sock
    assert sock is not None
    with pytest.raises(BlockingIOError):
        sock.recv(8)  # nothing pending yet
    proc = await anyio.run_process(
        [sys.executable, "-c", APPENDER, url, "r", str(claim.epoch), "1"], env=_env())
    assert proc.returncode == 0
    assert sock.recv(8) == b"!"  # the other process's commit poked our socket
    assert [e.offset for e in await store.snapshot("r")] == [1]
    await store.aclose()
    assert not any((tmp_path / "x.db.notify").iterdir())  # marker removed on close


async def test_stale_notify_markers_are_cleaned(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'x.db'}"
    store = await open_store(url)
    await store.create(NewRun("r", "t"))
    claim = await store.acquire_claim("r", "me", 60)
    notify = tmp_path / "x.db.notify"
    notify.mkdir(exist_ok=True)
    stale = notify / ("0" * 32)
    stale.touch()  # a marker whose process died without cleaning up
    await store.append("r", [({"type": "X"}, 0)], epoch=claim.epoch)
    assert not stale.exists()
    await store.aclose()


CRASHER = textwrap.dedent(
    """
    import sys, anyio
    from corral.stores import open_store

    async def main(url, run_id, epoch):
        store = await open_store(url)
        batch = 0
        while True:
            batch += 1
            size = 1 + batch % 7
            events = [({"type": "X", "batch": batch, "size": size, "k": k, "pad": "p" * 300}, batch)
                      for k in range(size)]
            offsets = await store.append(run_id, events, epoch=epoch)
            print(offsets[-1], flush=True)

    anyio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]))
    """
)


async def test_sigkill_mid_append_leaves_clean_prefix_and_run_continues(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'crash.db'}"
    store = await open_store(url)
    await store.create(NewRun("r", "t"))
    dead = await store.acquire_claim("r", "doomed-host", 2.0)
    acked = 0
    with anyio.fail_after(DEADLINE):
        async with await anyio.open_process(
            [sys.executable, "-c", CRASHER, url, "r", str(dead.epoch)], env=_env()
        ) as proc:
            assert proc.stdout is not None
            buffer = ""
            async for chunk in TextReceiveStream(proc.stdout):
                *lines, buffer = (buffer + chunk).split("\n")
                if lines:
                    acked = int(lines[-1])
                if acked >= 3000:
                    break
            proc.send_signal(signal.SIGKILL)  # mid-loop: appends are in flight
            await proc.wait()
    assert acked >= 3000

    # A fresh connection (another "process") sees a clean prefix: no torn batch, no gap.
    await store.aclose()
    store = await open_store(url)
    snap = await store.snapshot("r")
    assert len(snap) >= acked  # nothing acknowledged was lost
    assert [e.offset for e in snap] == list(range(1, len(snap) + 1))
    batches: dict[int, list[int]] = {}
    for e in snap:
        assert e.journal_offset == e.event["batch"]
        batches.setdefault(e.event["batch"], []).append(e.event["k"])
    for batch, ks in batches.items():
        assert ks == list(range(len(ks))) and len(ks) == 1 + batch % 7, batch
    assert sorted(batches) == list(range(1, len(batches) + 1))

    # The dead driver's lease lapses; another host claims and continues the log.
    rec = await store.get("r")
    assert rec is not None and rec.claim_owner == "doomed-host"
    assert rec.claim_expires_at is not None
    claim = await store.acquire_claim("r", "successor", 30, now=rec.claim_expires_at)
    tail = await store.tail("r")
    assert tail.last_offset == len(snap) and tail.last_journal_offset == snap[-1].journal_offset
    assert await store.append("r", [({"type": "RUN_FINISHED"}, 0)], epoch=claim.epoch) == [
        len(snap) + 1]
    with pytest.raises(ClaimLost):
        await store.append("r", [({"type": "X"}, 0)], epoch=dead.epoch)
    rec = await store.get("r")
    assert rec is not None and rec.status is RunStatus.RUNNING
    await store.aclose()


async def test_wal_mode_and_sockets_are_linux_abstract(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    store = await open_store(f"sqlite://{path}")
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    raw.close()
    assert isinstance(store, SQLiteStore)
    store._signal.listen()
    assert store._signal._sock is not None
    assert store._signal._sock.family == socket.AF_UNIX
    await store.aclose()


# ------------------------------------------------------------------ schema versions

V1_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL UNIQUE,
    thread_id TEXT NOT NULL,
    status TEXT NOT NULL,
    started_at REAL NOT NULL,
    detached_since REAL,
    driver_epoch INTEGER NOT NULL DEFAULT 0,
    doc TEXT NOT NULL,
    last_offset INTEGER NOT NULL DEFAULT 0,
    last_journal_offset INTEGER,
    log_closed INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS runs_thread ON runs (thread_id, started_at);
CREATE INDEX IF NOT EXISTS runs_detached ON runs (status, detached_since);
CREATE INDEX IF NOT EXISTS runs_unattended ON runs
    (status, COALESCE(detached_since, json_extract(doc, '$.claim_expires_at')));
CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL,
    offset INTEGER NOT NULL,
    journal_offset INTEGER NOT NULL,
    event TEXT NOT NULL,
    PRIMARY KEY (run_id, offset)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS instances (
    key TEXT PRIMARY KEY,
    expires_at REAL,
    doc TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS locks (
    name TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    expires_at REAL NOT NULL
);
"""
"""The schema corral 0.x wrote as ``PRAGMA user_version = 1`` (verbatim), before approvals
and secrets moved into the store."""

V1_RUN = {"run_id": "old-run", "thread_id": "t", "status": "running", "started_at": 1000.0,
          "updated_at": 1001.0, "harness": "command", "spec": {"argv": ["echo", "hi"]},
          "driver_epoch": 3, "claim_owner": "host-a", "claim_expires_at": 1030.0}


def make_v1_store(path: Path) -> None:
    """A store file as the version-1 code left it: one claimed run with three events, an
    instance and a lock."""
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("PRAGMA journal_mode = WAL")
    raw.executescript("BEGIN IMMEDIATE;" + V1_SCHEMA + "PRAGMA user_version = 1;COMMIT;")
    raw.execute("INSERT INTO runs (run_id, thread_id, status, started_at, driver_epoch, doc, "
                "last_offset, last_journal_offset) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                ("old-run", "t", "running", 1000.0, 3, json.dumps(V1_RUN), 3, 30))
    for i in (1, 2, 3):
        raw.execute("INSERT INTO events VALUES (?, ?, ?, ?)",
                    ("old-run", i, 10 * i, json.dumps({"type": "X", "i": i})))
    raw.execute("INSERT INTO instances VALUES (?, ?, ?)", ("k", 2000.0, json.dumps(
        {"key": "k", "provider": "local", "provider_sandbox_id": "sb", "thread_id": "t",
         "updated_at": 1000.0, "expires_at": 2000.0})))
    raw.execute("INSERT INTO locks VALUES (?, ?, ?)", ("reaper", "host-a", 9e9))
    raw.close()


def user_version(path: Path) -> int:
    raw = sqlite3.connect(path)
    try:
        return int(raw.execute("PRAGMA user_version").fetchone()[0])
    finally:
        raw.close()


async def check_v1_data(store: SQLiteStore) -> None:
    rec = await store.get("old-run")
    assert rec is not None and rec.to_dict() == V1_RUN
    assert [(e.offset, e.journal_offset, e.event["i"]) for e in await store.snapshot("old-run")
            ] == [(1, 10, 1), (2, 20, 2), (3, 30, 3)]
    tail = await store.tail("old-run")
    assert (tail.last_offset, tail.last_journal_offset, tail.closed) == (3, 30, False)
    inst = await store.get_instance("k")
    assert inst is not None and inst.provider_sandbox_id == "sb"
    assert not await store.try_lock("reaper", "host-b", 10)  # host-a's lock survived
    # the old run's driver (epoch 3) appends on, in the migrated file
    assert await store.append("old-run", [({"type": "X", "i": 4}, 40)], epoch=3) == [4]


async def test_a_version_1_file_is_migrated_once_keeping_its_data(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    make_v1_store(path)
    store = await open_store(f"sqlite://{path}")
    assert isinstance(store, SQLiteStore)
    assert store.migrated_from == 1 and user_version(path) == SCHEMA_VERSION
    await check_v1_data(store)
    # the new tables work
    await store.add_approval(ApprovalRequest("a1", "old-run", "deploy", {}, 1000.0, 1300.0))
    assert [r.approval_id for r in await store.list_pending_approvals("old-run")] == ["a1"]
    answer = ApprovalAnswer("allow", None, 1001.0)
    assert await store.answer_approval("old-run", "a1", answer) == answer
    secret = await store.shared_secret("approvals")
    # and the saved sessions' (#27)
    await store.put_session(StoredSession("old-thread", "codex", "c", {"a": b"1"}, 1000.0))
    await store.aclose()
    again = await open_store(f"sqlite://{path}")  # current now: nothing to migrate
    assert isinstance(again, SQLiteStore) and again.migrated_from is None
    assert await again.shared_secret("approvals") == secret
    assert (await again.tail("old-run")).last_offset == 4
    kept = await again.get_session("old-thread", "codex")
    assert kept is not None and dict(kept.files) == {"a": b"1"}
    await again.aclose()


async def test_a_new_file_gets_the_current_schema(tmp_path: Path) -> None:
    store = await open_store(f"sqlite://{tmp_path / 'new.db'}")
    assert isinstance(store, SQLiteStore) and store.migrated_from == 0
    assert user_version(tmp_path / "new.db") == SCHEMA_VERSION == len(MIGRATIONS)
    await store.aclose()


OPENER = textwrap.dedent(
    """
    import sys, anyio
    from corral.stores import open_store

    async def main(url):
        print("ready", flush=True)
        sys.stdin.readline()  # all processes open at once
        store = await open_store(url)
        rec = await store.get("old-run")
        print(store.migrated_from, rec.driver_epoch, flush=True)
        await store.aclose()

    anyio.run(main, sys.argv[1])
    """
)


async def _race(argv: list[str], count: int) -> list[str]:
    """Start ``count`` processes of ``argv``; when all printed ``ready``, release them at
    once (a line on stdin); return the last line each printed."""
    procs = [await anyio.open_process(argv, env=_env()) for _ in range(count)]
    try:
        with anyio.fail_after(DEADLINE):
            for proc in procs:
                assert proc.stdout is not None
                first = b""
                while not first.endswith(b"\n"):
                    first += await proc.stdout.receive(1)
                assert first == b"ready\n", first
            for proc in procs:
                assert proc.stdin is not None
                await proc.stdin.send(b"go\n")
            outs: list[str] = []
            for proc in procs:
                assert proc.stdout is not None and proc.stderr is not None
                chunks = [chunk async for chunk in proc.stdout]
                err = b"".join([chunk async for chunk in proc.stderr])
                assert await proc.wait() == 0, err.decode()
                outs.append(b"".join(chunks).decode().strip().splitlines()[-1])
            return outs
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
            await proc.aclose()


async def test_processes_opening_a_version_1_file_at_once_migrate_it_once(
        tmp_path: Path) -> None:
    for attempt in range(3):
        path = tmp_path / f"race-{attempt}.db"
        make_v1_store(path)
        outs = await _race([sys.executable, "-c", OPENER, f"sqlite://{path}"], 4)
        # exactly one process migrated; the others found the new version under the lock
        assert sorted(outs) == ["1 3", "None 3", "None 3", "None 3"], outs
        assert user_version(path) == SCHEMA_VERSION
        store = await open_store(f"sqlite://{path}")
        assert isinstance(store, SQLiteStore)
        await check_v1_data(store)
        await store.aclose()


async def test_a_newer_schema_is_refused_in_one_line(
        tmp_path: Path, corral_cmd: list[str], cli_env: dict[str, str]) -> None:
    path = tmp_path / "future.db"
    make_v1_store(path)
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA user_version = 99")
    raw.close()
    with pytest.raises(StoreError, match=r"schema version 99, newer than this corral "
                                         rf"understands \({SCHEMA_VERSION}\); upgrade corral"):
        await open_store(f"sqlite://{path}")
    assert user_version(path) == 99  # untouched
    r = subprocess.run([*corral_cmd, "ls", "--store", f"sqlite://{path}"], env=cli_env,
                       capture_output=True, text=True, timeout=60)
    one_line_refusal(r, "schema version 99", "upgrade corral")


SECRET_READER = textwrap.dedent(
    """
    import sys, anyio
    from corral.stores import open_store

    async def main(url):
        store = await open_store(url)
        print("ready", flush=True)
        sys.stdin.readline()  # all processes ask for the first time at once
        print((await store.shared_secret("approvals")).hex(), flush=True)
        await store.aclose()

    anyio.run(main, sys.argv[1])
    """
)


async def test_processes_racing_the_first_secret_agree(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 's.db'}"
    outs = await _race([sys.executable, "-c", SECRET_READER, url], 4)
    assert len(set(outs)) == 1 and len(bytes.fromhex(outs[0])) == 32
    store = await open_store(url)
    assert (await store.shared_secret("approvals")).hex() == outs[0]
    await store.aclose()


async def test_taking_a_lock_reads_the_instance_in_the_same_transaction(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    try:
        from corral.stores._protocols import InstanceRecord

        assert await store.try_lock_reading_instance("sandbox:k", "me", 30, "k") == (True, None)
        record = InstanceRecord("k", "local", "sb-1", "t", 1.0, meta={"a": 1})
        await store.upsert_instance(record)
        # the same owner extends its lock, and reads what get_instance reads
        assert await store.try_lock_reading_instance("sandbox:k", "me", 30, "k") == (
            True, await store.get_instance("k"))
        # another owner neither takes the lock nor reads the record
        assert await store.try_lock_reading_instance("sandbox:k", "other", 30, "k") == (
            False, None)
        assert not await store.try_lock("sandbox:k", "other", 30)
        assert await store.unlock("sandbox:k", "me")
        taken, read = await store.try_lock_reading_instance("sandbox:k", "other", 30, "k")
        assert taken and read == record
    finally:
        await store.aclose()


def _instance(key: str, pad: int = 0) -> InstanceRecord:
    return InstanceRecord(key, "local", "sb-1", "t", 1.0, meta={"pad": "x" * pad})


async def test_instance_and_lock_operations_need_no_worker_thread(tmp_path: Path) -> None:
    """What ``ensure`` does to the store runs on the event loop when SQLite is free: here
    every worker thread is taken (the default limiter's one token is held), and the
    operations still complete."""
    store = SQLiteStore(tmp_path / "s.db")
    limiter = anyio.to_thread.current_default_thread_limiter()
    tokens, limiter.total_tokens = limiter.total_tokens, 1
    release = threading.Event()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(anyio.to_thread.run_sync, release.wait))
            await anyio.wait_all_tasks_blocked()
            try:
                with anyio.fail_after(DEADLINE):
                    assert await store.try_lock_reading_instance(
                        "sandbox:k", "me", 30, "k") == (True, None)
                    await store.upsert_instance(_instance("k"))
                    assert await store.get_instance("k") == _instance("k")
                    await store.upsert_instance_unlocking(_instance("k", 10), "sandbox:k", "me")
                    assert await store.try_lock("sandbox:k", "other", 30)
                    assert await store.unlock("sandbox:k", "other")
                    await store.delete_instance("k")
                    assert await store.get_instance("k") is None
            finally:
                release.set()
    finally:
        limiter.total_tokens = tokens
        await store.aclose()


async def test_an_operation_another_writer_blocks_waits_without_blocking_the_loop(
    tmp_path: Path,
) -> None:
    """While another connection holds SQLite's write lock, a lock attempt waits for it in a
    worker thread (the loop runs on: this test's own task commits the other transaction),
    then decides on what that transaction committed."""
    store = SQLiteStore(tmp_path / "s.db")
    other = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("INSERT INTO locks (name, owner, expires_at) VALUES (?, ?, ?)",
                      ("sandbox:k", "other", 9e9))
        got: list[tuple[bool, InstanceRecord | None]] = []
        with anyio.fail_after(DEADLINE):
            async with anyio.create_task_group() as tg:
                async def take() -> None:
                    got.append(await store.try_lock_reading_instance("sandbox:k", "me", 30, "k"))

                tg.start_soon(take)
                await anyio.wait_all_tasks_blocked()
                assert got == []  # still waiting for the other writer
                other.execute("COMMIT")
        assert got == [(False, None)]  # the other's lock, committed while we waited, holds
    finally:
        other.close()
        await store.aclose()


async def test_the_wal_stays_bounded_when_writes_run_on_the_loop(tmp_path: Path) -> None:
    """The loop's connection never checkpoints (a checkpoint fsyncs); one write in
    ``_THREAD_EVERY`` goes through the writer's thread, whose commit checkpoints: 3000
    writes of ~1 KiB leave a WAL far below the ~3000 pages they wrote."""
    store = SQLiteStore(tmp_path / "s.db")
    try:
        for i in range(3000):
            await store.upsert_instance(_instance(f"k{i}", 1000))
        pages = os.path.getsize(tmp_path / "s.db-wal") // 4096
        assert 0 < pages < 1500
        assert len(await store.list_expired_instances(9e9)) == 0
        assert await store.get_instance("k2999") == _instance("k2999", 1000)
    finally:
        await store.aclose()


async def test_corral_ls_reads_the_file_as_the_store_lists_it(
        tmp_path: Path, corral_cmd: list[str], cli_env: dict[str, str]) -> None:
    """``corral ls`` reads a current store file with plain sqlite3 (``peek_runs``): every
    filter gives exactly the store's own listing, ties in start time included."""
    from corral.cli._records import record_json
    from corral.stores._sqlite_tables import peek_runs

    path = tmp_path / "runs.db"
    store = await open_store(f"sqlite://{path}")
    statuses = list(RunStatus)
    for i in range(40):
        await store.create(NewRun(run_id=f"r{i:02d}", thread_id=f"t{i % 3}",
                                  started_at=1000.0 + i // 4, status=statuses[i % len(statuses)]))
    for thread in (None, "t0", "t1", "t2", "nope"):
        for status in (None, *statuses):
            for limit in (1, 3, 50):
                if thread is None:
                    want = await store.list_runs(status=status, limit=limit)
                else:
                    want = [r for r in reversed(await store.list_by_thread(thread))
                            if status is None or r.status is status][:limit]
                got = peek_runs(path, thread=thread, status=status, limit=limit)
                assert got == want, (thread, status, limit)
    want = [record_json(r) for r in (await store.list_by_thread("t1"))[::-1][:2]]
    await store.aclose()
    out = subprocess.run([*corral_cmd, "ls", "--json", "--thread", "t1", "--limit", "2",
                          "--store", f"sqlite://{path}"], env=cli_env, capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == want


async def test_corral_ls_of_an_old_or_missing_file_opens_the_store(
        tmp_path: Path, corral_cmd: list[str], cli_env: dict[str, str]) -> None:
    """A file the quick read cannot answer (an older schema, no file yet) is opened as a
    store: migrated, or created, then listed."""
    from corral.stores._sqlite_tables import peek_runs

    old = tmp_path / "old.db"
    make_v1_store(old)
    assert peek_runs(old, thread=None, status=None, limit=5) is None
    out = subprocess.run([*corral_cmd, "ls", "--json", "--store", f"sqlite://{old}"],
                         env=cli_env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert [r["run_id"] for r in json.loads(out.stdout)] == ["old-run"]
    assert user_version(old) == SCHEMA_VERSION
    new = tmp_path / "new.db"
    assert peek_runs(new, thread=None, status=None, limit=5) is None
    out = subprocess.run([*corral_cmd, "ls", "--json", "--store", f"sqlite://{new}"],
                         env=cli_env, capture_output=True, text=True, timeout=60, check=False)
    assert (out.returncode, out.stdout.strip()) == (0, "[]"), out.stderr
    assert user_version(new) == SCHEMA_VERSION
