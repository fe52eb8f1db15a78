"""Checkpoint conformance kit: the :class:`~corral.abc.CheckpointStore` contract (#27).

Every backend (memory, SQLite, PostgreSQL, third-party ones) must pass it::

    from corral.testing import check_checkpoint_store

    report = await check_checkpoint_store(make_store)   # KitFailed names each failed check

The store checks cover chunks (idempotent puts, what is missing, touching), manifests
(round trip, per-thread listing, ids, refusal of a manifest naming absent chunks or breaking
the path rules), dedup across threads, and the collector (grace, named chunks kept, and
writers racing it never leaving a manifest that names a collected chunk). The engine checks
run :func:`corral.sandbox.checkpoint_workspace` (reading the workspace both from the host
and by the in-sandbox script) and :func:`corral.sandbox.restore_checkpoint`
through the store against a ``local`` sandbox in a temporary directory (the same
in-sandbox script every provider runs): save and restore (contents, modes, symlinks, empty
directories), an incremental checkpoint reading only what changed, dedup, the size cap
(error and skip) and redaction (a file holding a secret is left out, its bytes in no chunk),
and concurrent checkpoints of one thread. anyio: asyncio or trio.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import zlib
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import anyio

from corral.providers._local import LocalHandle, LocalProvider
from corral.sandbox._checkpoint import (
    CheckpointTooLarge,
    checkpoint_workspace,
    restore_checkpoint,
)
from corral.stores._checkpoints import (
    Checkpoint,
    CheckpointEntry,
    CheckpointExists,
    CorruptCheckpoint,
    MissingChunks,
    check_entries,
)
from corral.stores._protocols import CheckpointStore, StoreError
from corral.testing._kit import Factory, Kit, KitReport, raises

__all__ = ["CHECKPOINT_KIT", "check_checkpoint_store"]

T0 = 1_700_000_000.0
DEADLINE = 60.0


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def checkpoint(cid: str, thread: str, files: dict[str, bytes], *, at: float = T0,
               parent: str | None = None) -> Checkpoint:
    """A checkpoint of ``files`` (path -> content; one chunk each, under a directory)."""
    entries = [CheckpointEntry("d", "dir", 0o755)]
    entries += [CheckpointEntry(f"d/{p}", "file", 0o644, len(c), (digest(c),) if c else ())
                for p, c in sorted(files.items())]
    return Checkpoint(cid, thread, "run-1", at, "/workspace", tuple(entries), parent,
                      sum(map(len, files.values())))


async def put(store: CheckpointStore, cp: Checkpoint, files: dict[str, bytes],
              now: float = T0) -> None:
    await store.put_chunks({digest(c): c for c in files.values() if c}, now=now)
    await store.put_checkpoint(cp, now=now)


# --------------------------------------------------------------------------- store


CHECKPOINT_KIT: Kit[CheckpointStore] = Kit("checkpoint store")
"""Every checkpoint check; the subject is the store the factory makes."""


@CHECKPOINT_KIT.add
async def check_chunks_are_idempotent(store: CheckpointStore) -> None:
    a, b = b"alpha" * 100, b"beta"
    assert await store.missing_chunks([digest(a), digest(b)], now=T0) == {digest(a), digest(b)}
    await store.put_chunks({digest(a): a}, now=T0)
    await store.put_chunks({digest(a): b"something else"}, now=T0)  # first stands
    assert await store.missing_chunks([digest(a), digest(b)], now=T0) == {digest(b)}
    assert await store.get_chunks([digest(a), digest(b)]) == {digest(a): a}
    stats = await store.chunk_stats()
    assert (stats.count, stats.stored_bytes) == (1, len(a))
    with raises(StoreError):
        await store.put_chunks({"not-a-digest": a})


@CHECKPOINT_KIT.add
async def check_manifest_round_trip_and_listing(store: CheckpointStore) -> None:
    files = {"a.txt": b"one", "b.bin": bytes(range(256)), "empty": b""}
    first = checkpoint("ck-1", "thread-1", files, at=T0 + 1)
    await put(store, first, files)
    second = checkpoint("ck-2", "thread-1", {"a.txt": b"two"}, at=T0 + 1, parent="ck-1")
    await put(store, second, {"a.txt": b"two"})
    await put(store, checkpoint("ck-3", "thread-2", files), files)
    assert await store.get_checkpoint("ck-1") == first
    assert await store.get_checkpoint("nope") is None
    listed = await store.list_checkpoints("thread-1")
    assert [i.checkpoint_id for i in listed] == ["ck-1", "ck-2"]  # ties: the order put
    assert listed[1].parent_id == "ck-1" and listed[0].entry_count == 4
    assert listed[0].total_bytes == 259 and listed[0].run_id == "run-1"
    assert await store.list_checkpoints("thread-3") == []
    assert await store.delete_checkpoint("ck-1") is True
    assert await store.delete_checkpoint("ck-1") is False
    assert [i.checkpoint_id for i in await store.list_checkpoints("thread-1")] == ["ck-2"]


@CHECKPOINT_KIT.add
async def check_put_refuses_taken_ids_and_absent_chunks(store: CheckpointStore) -> None:
    files = {"a": b"present"}
    await put(store, checkpoint("ck-1", "t", files), files)
    with raises(CheckpointExists):
        await put(store, checkpoint("ck-1", "t", files), files)
    lacking = checkpoint("ck-2", "t", {"a": b"present", "b": b"never put"})
    with raises(MissingChunks) as caught:
        await store.put_checkpoint(lacking, now=T0)
    assert caught.value.digests == {digest(b"never put")}
    assert await store.get_checkpoint("ck-2") is None
    assert [i.checkpoint_id for i in await store.list_checkpoints("t")] == ["ck-1"]


@CHECKPOINT_KIT.add
async def check_put_refuses_hostile_manifests(store: CheckpointStore) -> None:
    def hostile(*entries: CheckpointEntry) -> Checkpoint:
        return Checkpoint("ck-bad", "t", None, T0, "/workspace", entries)

    cases = [
        hostile(CheckpointEntry("../escape", "file", 0o644)),
        hostile(CheckpointEntry("/etc/passwd", "file", 0o644)),
        hostile(CheckpointEntry("a/./b", "dir", 0o755)),
        hostile(CheckpointEntry("a", "dir", 0o755), CheckpointEntry("a//b", "dir", 0o755)),
        # a file under a symlink: a restore would write through it
        hostile(CheckpointEntry("link", "symlink", 0o777, target="/etc"),
                CheckpointEntry("link/passwd", "file", 0o644)),
        hostile(CheckpointEntry("orphan/f", "file", 0o644)),  # parent not a directory entry
        hostile(CheckpointEntry("x", "file", 0o644), CheckpointEntry("x", "file", 0o644)),
        hostile(CheckpointEntry("x", "file", 0o644, 3, ("zz",))),
        hostile(CheckpointEntry("x", "file", 0o644, 3)),  # content without chunks
        hostile(CheckpointEntry("x", "symlink", 0o777)),  # no target
    ]
    # entries equal (==) to one already checked, but with a bool or float where an int
    # belongs: an entry checked once is remembered by identity, never by equality
    good = CheckpointEntry("x", "file", 1, 0, mtime_ns=1)
    check_entries([good])
    for bad in (CheckpointEntry("x", "file", True, 0, mtime_ns=1),
                CheckpointEntry("x", "file", 1, cast(int, 0.0), mtime_ns=1),
                CheckpointEntry("x", "file", 1, 0, mtime_ns=True)):
        assert bad == good
        cases.append(hostile(bad))
    for cp in cases:
        with raises(CorruptCheckpoint):
            await store.put_checkpoint(cp, now=T0)
    assert await store.list_checkpoints("t") == []


@CHECKPOINT_KIT.add
async def check_dedup_across_checkpoints_and_threads(store: CheckpointStore) -> None:
    big = os.urandom(4096)
    files = {"big": big, "small": b"x"}
    for i, thread in enumerate(["t-1", "t-1", "t-2"]):
        await put(store, checkpoint(f"ck-{i}", thread, files), files)
    stats = await store.chunk_stats()
    assert stats.count == 2 and stats.stored_bytes == len(big) + 1


@CHECKPOINT_KIT.add
async def check_collector_keeps_named_and_recent_chunks(store: CheckpointStore) -> None:
    kept, shared, freed, fresh = b"kept", b"shared", b"freed", b"fresh"
    await put(store, checkpoint("ck-1", "t", {"a": kept, "b": shared}), {"a": kept, "b": shared})
    await put(store, checkpoint("ck-2", "t", {"b": shared, "c": freed}), {"b": shared, "c": freed})
    await store.delete_checkpoint("ck-2")
    await store.put_chunks({digest(fresh): fresh}, now=T0 + 500)
    # within the grace nothing unnamed goes
    assert await store.collect_chunks(grace=100, now=T0 + 50) == 0
    assert await store.collect_chunks(grace=100, now=T0 + 101) == 1
    held = await store.get_chunks([digest(x) for x in (kept, shared, freed, fresh)])
    assert set(held) == {digest(kept), digest(shared), digest(fresh)}
    assert await store.collect_chunks(grace=100, now=T0 + 601) == 1
    assert set(await store.get_chunks([digest(fresh)])) == set()


@CHECKPOINT_KIT.add
async def check_a_writer_between_chunks_and_manifest_is_safe(store: CheckpointStore) -> None:
    old = b"put long ago, named by nobody"
    await store.put_chunks({digest(old): old}, now=T0)
    # a writer learns the chunk is there (which touches it), then the collector runs
    assert await store.missing_chunks([digest(old)], now=T0 + 1000) == set()
    assert await store.collect_chunks(grace=100, now=T0 + 1050) == 0
    await store.put_checkpoint(checkpoint("ck-1", "t", {"a": old}), now=T0 + 1060)
    # a writer slower than the grace: its chunk is collected, and its manifest refused
    # (never stored naming an absent chunk)
    late = b"put, then the writer stalled"
    await store.put_chunks({digest(late): late}, now=T0)
    assert await store.collect_chunks(grace=100, now=T0 + 200) == 1
    with raises(MissingChunks):
        await store.put_checkpoint(checkpoint("ck-2", "t", {"a": late}), now=T0 + 200)
    assert await store.get_checkpoint("ck-2") is None


@CHECKPOINT_KIT.add
async def check_writers_racing_the_collector_leave_no_dangling_manifest(
        store: CheckpointStore) -> None:
    stored: list[str] = []

    async def writer(n: int) -> None:
        files = {f"f{i}": f"writer {n} file {i}".encode() for i in range(5)}
        files["shared"] = b"every writer has this"
        cp = checkpoint(f"ck-{n}", f"t-{n % 3}", files)
        for _attempt in range(50):
            await store.put_chunks({digest(c): c for c in files.values()})
            try:
                await store.put_checkpoint(cp)
            except MissingChunks:
                continue  # collected in between: put them again
            stored.append(cp.checkpoint_id)
            return
        raise AssertionError(f"writer {n} never got its checkpoint in")

    async def collector(done: anyio.Event) -> None:
        while not done.is_set():
            await store.collect_chunks(grace=0)  # the harshest collector
            await anyio.lowlevel.checkpoint()

    with anyio.fail_after(DEADLINE):
        done = anyio.Event()
        async with anyio.create_task_group() as outer:
            outer.start_soon(collector, done)
            async with anyio.create_task_group() as tg:
                for n in range(12):
                    tg.start_soon(writer, n)
            done.set()
    assert sorted(stored) == sorted(f"ck-{n}" for n in range(12))
    for cid in stored:
        cp = await store.get_checkpoint(cid)
        assert cp is not None
        assert set(await store.get_chunks(cp.digests())) == cp.digests(), cid


@CHECKPOINT_KIT.add
async def check_concurrent_writers_on_one_thread(store: CheckpointStore) -> None:
    async def writer(n: int) -> None:
        files = {"a": f"turn {n}".encode(), "common": b"common"}
        await put(store, checkpoint(f"ck-{n}", "thread", files, at=T0 + n), files)

    with anyio.fail_after(DEADLINE):
        async with anyio.create_task_group() as tg:
            for n in range(10):
                tg.start_soon(writer, n)
    listed = await store.list_checkpoints("thread")
    assert [i.checkpoint_id for i in listed] == [f"ck-{n}" for n in range(10)]
    assert (await store.chunk_stats()).count == 11


# --------------------------------------------------------------------------- engine


@asynccontextmanager
async def local_sandbox() -> AsyncIterator[tuple[LocalHandle, Path, LocalProvider]]:
    """A ``local`` sandbox in a temporary directory and its workspace on the host."""
    with tempfile.TemporaryDirectory(prefix="corral-ckpt-") as tmp:
        provider = LocalProvider(home=Path(tmp))
        handle = await provider.create()
        try:
            ws = Path(handle.host_path(handle.workdir))
            ws.mkdir(parents=True, exist_ok=True)
            yield handle, ws, provider
        finally:
            with anyio.CancelScope(shield=True):
                await provider.destroy(handle.ref)


PY = sys.executable


def tree(root: Path) -> dict[str, Any]:
    """Everything under ``root``: path -> (kind, mode, content or target)."""
    out: dict[str, Any] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath, name)
            rel = str(p.relative_to(root))
            st = p.lstat()
            if p.is_symlink():
                out[rel] = ("symlink", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir", oct(st.st_mode & 0o7777))
            else:
                out[rel] = ("file", oct(st.st_mode & 0o7777), p.read_bytes(), st.st_mtime_ns)
    return out


def sample(ws: Path, exec_mode: int = 0o750) -> None:
    """A small workspace with every kind of entry (``exec_mode``: the script's mode; a
    sandbox whose user does not own files written from the host needs them world-readable)."""
    (ws / "src" / "pkg").mkdir(parents=True)
    (ws / "src" / "pkg" / "mod.py").write_text("print('hi')\n" * 50)
    (ws / "big.bin").write_bytes(os.urandom(3 << 20) + b"tail")
    (ws / "run.sh").write_text("#!/bin/sh\necho run\n")
    (ws / "run.sh").chmod(exec_mode)
    (ws / "empty").mkdir()
    (ws / "empty-file").write_bytes(b"")
    (ws / "link").symlink_to("src/pkg/mod.py")
    (ws / "dangling").symlink_to("/nowhere/at/all")
    (ws / "ro").mkdir()
    (ws / "ro" / "f").write_text("read only dir")
    (ws / "ro").chmod(0o555)


@CHECKPOINT_KIT.add
async def check_workspace_round_trip(store: CheckpointStore) -> None:
    # both ways of reading a workspace: from the host (a host-directory provider) and by
    # the script in the sandbox
    for host_read in (True, False):
        async with local_sandbox() as (h1, ws1, _p1), local_sandbox() as (h2, ws2, _p2):
            sample(ws1)
            cp = await checkpoint_workspace(h1, store, thread_id="t", run_id="r1", python=PY,
                                            host_read=host_read)
            assert cp is not None and cp.total_bytes == sum(
                p.stat().st_size for p in ws1.rglob("*") if p.is_file() and not p.is_symlink())
            (ws2 / "stale").write_text("not in the checkpoint")
            await restore_checkpoint(h2, store, cp.checkpoint_id, python=PY)
            assert tree(ws2) == tree(ws1)
            for ws in (ws1, ws2):
                (ws / "ro").chmod(0o755)  # so the temporary directory can be removed


@CHECKPOINT_KIT.add
async def check_incremental_reads_only_what_changed(store: CheckpointStore) -> None:
    for host_read in (True, False):
        async with local_sandbox() as (h, ws, _p):
            sample(ws)
            first = await checkpoint_workspace(h, store, thread_id="t", python=PY,
                                               host_read=host_read)
            assert first is not None
            (ws / "src" / "pkg" / "mod.py").write_text("print('changed')\n")
            (ws / "new.txt").write_text("new")
            second = await checkpoint_workspace(h, store, thread_id="t", python=PY,
                                                parent=first, host_read=host_read)
            assert second is not None and second.parent_id == first.checkpoint_id
            assert second.meta["sent_bytes"] < 1000, second.meta  # not the 3 MiB again
            big = [e for e in second.entries if e.path == "big.bin"]
            assert big[0].chunks == [e for e in first.entries if e.path == "big.bin"][0].chunks
            assert big[0] is [e for e in first.entries if e.path == "big.bin"][0]
            async with local_sandbox() as (h2, ws2, _p2):
                await restore_checkpoint(h2, store, second, python=PY)
                assert tree(ws2) == tree(ws)
                (ws2 / "ro").chmod(0o755)
            (ws / "ro").chmod(0o755)


@CHECKPOINT_KIT.add
async def check_dedup_of_workspaces_across_threads(store: CheckpointStore) -> None:
    async with local_sandbox() as (h1, ws1, _p1), local_sandbox() as (h2, ws2, _p2):
        blob = os.urandom(2 << 20)
        (ws1 / "data").write_bytes(blob)
        (ws2 / "copy").write_bytes(blob)
        a = await checkpoint_workspace(h1, store, thread_id="thread-a", python=PY)
        before = await store.chunk_stats()
        b = await checkpoint_workspace(h2, store, thread_id="thread-b", python=PY)
        assert a is not None and b is not None and b.meta["sent_bytes"] == 0
        assert await store.chunk_stats() == before


@CHECKPOINT_KIT.add
async def check_size_cap_errors_or_skips(store: CheckpointStore) -> None:
    async with local_sandbox() as (h, ws, _p):
        (ws / "data").write_bytes(b"x" * 10_000)
        with raises(CheckpointTooLarge, match="over the checkpoint size cap"):
            await checkpoint_workspace(h, store, thread_id="t", max_bytes=9_999, python=PY)
        skipped = await checkpoint_workspace(h, store, thread_id="t", max_bytes=9_999,
                                             on_too_large="skip", python=PY)
        assert skipped is None
        assert await store.list_checkpoints("t") == []
        assert (await store.chunk_stats()).count == 0
        fits = await checkpoint_workspace(h, store, thread_id="t", max_bytes=10_000, python=PY)
        assert fits is not None


@CHECKPOINT_KIT.add
async def check_secrets_never_enter_a_checkpoint(store: CheckpointStore) -> None:
    secret = "sk-live-" + os.urandom(12).hex()
    async with local_sandbox() as (h, ws, _p):
        (ws / ".env").write_text(f"KEY={secret}\n")
        # across a chunk boundary, in a large file
        (ws / "dump.bin").write_bytes(b"a" * ((1 << 20) - 5) + secret.encode() + b"b" * 100)
        (ws / "ok.txt").write_text("nothing to hide")
        (ws / f"named-{secret}").write_text("the name is the secret")
        for host_read in (False, True):
            cp = await checkpoint_workspace(h, store, thread_id="t", python=PY,
                                            secrets={"API_KEY": secret}, host_read=host_read)
        assert cp is not None
        by_path = {e.path: e for e in cp.entries}
        assert by_path[".env"].skipped == "secret" and not by_path[".env"].chunks
        assert by_path["dump.bin"].skipped == "secret"
        assert by_path["ok.txt"].skipped is None
        assert not any(secret in e.path for e in cp.entries)
        stats = await store.chunk_stats()
        # every chunk the store holds, decoded, is free of the value
        held = await store.get_chunks({d for e in cp.entries for d in e.chunks})
        assert len(held) == stats.count
        for data in held.values():
            raw = zlib.decompress(data[1:]) if data[:1] == b"\x01" else data[1:]
            assert secret.encode() not in raw
        async with local_sandbox() as (h2, ws2, _p2):
            await restore_checkpoint(h2, store, cp, python=PY)
            assert sorted(p.name for p in ws2.iterdir()) == ["ok.txt"]


@CHECKPOINT_KIT.add
async def check_concurrent_checkpoints_of_one_thread(store: CheckpointStore) -> None:
    async with local_sandbox() as (h, ws, _p):
        sample(ws)
        got: list[Checkpoint | None] = []

        async def take() -> None:
            got.append(await checkpoint_workspace(h, store, thread_id="t", python=PY))

        with anyio.fail_after(DEADLINE):
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(take)
        assert len(got) == 3 and all(cp is not None for cp in got)
        listed = {i.checkpoint_id for i in await store.list_checkpoints("t")}
        assert listed == {cp.checkpoint_id for cp in got if cp is not None}
        (ws / "ro").chmod(0o755)


async def check_checkpoint_store(make_store: Factory, *, only: Iterable[str] | None = None
                                 ) -> KitReport:
    """Run the checkpoint kit against stores made by ``make_store`` (one fresh store per
    check); raise :class:`~corral.testing.KitFailed` naming every failed check, else return
    the report. ``only`` names the checks to run (all by default)."""
    return await CHECKPOINT_KIT.verify(make_store, only=only)
