"""SQLite-specific behaviour: URLs, corrupt rows, several connections and processes, crashes."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import sys
import textwrap
from pathlib import Path

import anyio
import pytest
from anyio.streams.text import TextReceiveStream

from corral._errors import ConfigError
from corral.stores._records import CorruptRecord, RunStatus
from corral.stores._protocols import ClaimLost, NewRun, StoreError
from corral.stores import default_store_url, open_store
from corral.stores._memory import MemoryStore
from corral.stores._sqlite import SQLiteStore

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
