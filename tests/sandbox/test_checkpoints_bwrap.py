"""Workspace checkpoints (#27) in real bubblewrap sandboxes, on a SQLite store: a round trip
into a fresh sandbox, a secret-bearing file that never reaches the store file, hostile
manifests and planted symlinks that a restore refuses or does not follow, and concurrent
checkpoints of one thread; and a workspace read from the host (bubblewrap keeps it in a host
directory), which never follows a symlink the sandbox planted, before or during the read."""

from __future__ import annotations

import json
import os
import sqlite3
import struct
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from corral.providers._bubblewrap import BubblewrapHandle, BubblewrapProvider
from corral.sandbox._checkpoint import (
    SessionSource,
    checkpoint_workspace,
    restore_checkpoint,
)
from corral.sandbox._checkpoint_script import CheckpointError, script
from corral.stores import CorruptCheckpoint, SQLiteStore
from corral.testing._checkpoints import sample, tree

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("corral_home", "need_bwrap_runs")]


@pytest.fixture
async def sandboxes() -> AsyncIterator[list[BubblewrapHandle]]:
    provider = BubblewrapProvider()
    made = [await provider.create(), await provider.create()]
    try:
        yield made
    finally:
        for h in made:
            for p in Path(h.host_path("/workspace")).rglob("*"):
                if p.is_dir() and not p.is_symlink():
                    p.chmod(0o755)
            await provider.destroy(h.ref)


def ws(h: BubblewrapHandle) -> Path:
    return Path(h.host_path(h.workdir))


async def test_round_trip_into_a_fresh_sandbox_with_its_session(
        sandboxes: list[BubblewrapHandle], tmp_path: Path) -> None:
    a, b = sandboxes
    sample(ws(a), 0o755)
    got = await a.process.exec(["sh", "-c", "mkdir -p ~/.claude/projects && "
                                "echo transcript > ~/.claude/projects/s1.jsonl"])
    assert got.ok, got
    (ws(b) / "leftover").write_text("from an earlier turn")
    async with SQLiteStore(tmp_path / "s.db") as store:
        cp = await checkpoint_workspace(
            a, store, thread_id="t", run_id="r1",
            session=SessionSource("claude", "s1", "~/.claude"))
        assert cp is not None and cp.session is not None
        assert [e.path for e in cp.session.entries] == ["projects", "projects/s1.jsonl"]
        await restore_checkpoint(b, store, cp.checkpoint_id)
    assert tree(ws(b)) == tree(ws(a))
    got = await b.process.exec(["cat", "/home/agent/.claude/projects/s1.jsonl"])
    assert got.stdout == b"transcript\n"


async def test_a_secret_bearing_file_never_reaches_the_store_file(
        sandboxes: list[BubblewrapHandle], tmp_path: Path) -> None:
    a, _b = sandboxes
    secret = "sk-test-" + os.urandom(16).hex()
    (ws(a) / ".env").write_text(f"ANTHROPIC_API_KEY={secret}\n")
    (ws(a) / "notes.md").write_text("ordinary notes\n" * 100)
    (ws(a) / "big.log").write_bytes(os.urandom(1 << 20) + secret.encode() + os.urandom(999))
    db = tmp_path / "s.db"
    async with SQLiteStore(db) as store:
        cp = await checkpoint_workspace(a, store, thread_id="t", secrets={"KEY": secret})
        assert cp is not None
        skipped = sorted(e.path for e in cp.entries if e.skipped == "secret")
        assert skipped == [".env", "big.log"]
    raw = db.read_bytes() + (Path(str(db) + "-wal").read_bytes()
                             if Path(str(db) + "-wal").exists() else b"")
    assert secret.encode() not in raw
    conn = sqlite3.connect(db)
    try:
        for (data,) in conn.execute("SELECT data FROM chunks"):
            plain = zlib.decompress(data[1:]) if data[:1] == b"\x01" else data[1:]
            assert secret.encode() not in plain
        for (manifest,) in conn.execute("SELECT manifest FROM checkpoints"):
            assert secret.encode() not in zlib.decompress(manifest)
    finally:
        conn.close()


async def test_a_hostile_manifest_in_the_store_is_refused(
        sandboxes: list[BubblewrapHandle], tmp_path: Path) -> None:
    a, b = sandboxes
    (ws(a) / "f").write_text("content")
    db = tmp_path / "s.db"
    async with SQLiteStore(db) as store:
        cp = await checkpoint_workspace(a, store, thread_id="t")
        assert cp is not None
    # someone with write access to the store rewrites the manifest: a path that climbs out
    conn = sqlite3.connect(db)
    try:
        (blob,) = conn.execute("SELECT manifest FROM checkpoints").fetchone()
        doc = json.loads(zlib.decompress(blob))
        doc["entries"][0][0] = "../../escaped"
        conn.execute("UPDATE checkpoints SET manifest = ?",
                     (zlib.compress(json.dumps(doc).encode()),))
        conn.commit()
    finally:
        conn.close()
    async with SQLiteStore(db) as store:
        with pytest.raises(CorruptCheckpoint, match="leaves|component"):
            await restore_checkpoint(b, store, cp.checkpoint_id)


@pytest.mark.parametrize("entries", [
    [["../tmp/escaped", "file", 0o644, 1, 0, None, 1]],  # /workspace/.. is /
    [["/tmp/escaped", "file", 0o644, 1, 0, None, 1]],
    # a symlink, then a file through it: the script makes symlinks last, and a parent
    # must be a directory of the request
    [["out", "symlink", 0o777, 0, 0, "/tmp", 0], ["out/escaped", "file", 0o644, 1, 0, None, 1]],
])
async def test_the_in_sandbox_restore_refuses_paths_out_of_the_workspace(
        sandboxes: list[BubblewrapHandle], entries: list[list[object]]) -> None:
    """Defence in depth: the script itself, fed a request the host would never send."""
    a, _b = sandboxes
    head = json.dumps({"op": "restore", "chunk": 1 << 20,
                       "roots": [{"root": ".", "entries": entries}]}).encode()
    frames = struct.pack(">cI", b"H", len(head)) + head
    frames += struct.pack(">cI", b"D", 1) + b"x" + struct.pack(">cI", b"E", 0)
    got = await a.process.exec(["/usr/bin/python3", "-I", "-S", "-c", script()],
                               stdin=frames, cwd=a.workdir)
    assert got.exit_code == 1 and b"error" in got.stdout
    found = await a.process.exec(["sh", "-c", "test -e /tmp/escaped && echo ESCAPED; true"])
    assert found.stdout == b""


async def test_restore_does_not_follow_a_symlink_planted_in_the_workspace(
        sandboxes: list[BubblewrapHandle], tmp_path: Path) -> None:
    a, b = sandboxes
    (ws(a) / "dir").mkdir()
    (ws(a) / "dir" / "f").write_text("mine")
    outside = await b.process.exec(["sh", "-c", "mkdir -p /tmp/outside && echo keep > "
                                    "/tmp/outside/f"])
    assert outside.ok
    # the agent of sandbox b planted dir -> /tmp/outside before the restore
    (ws(b) / "dir").symlink_to("/tmp/outside")
    async with SQLiteStore(tmp_path / "s.db") as store:
        cp = await checkpoint_workspace(a, store, thread_id="t")
        assert cp is not None
        await restore_checkpoint(b, store, cp)
    assert not (ws(b) / "dir").is_symlink() and (ws(b) / "dir" / "f").read_text() == "mine"
    kept = await b.process.exec(["cat", "/tmp/outside/f"])
    assert kept.stdout == b"keep\n"


async def test_concurrent_checkpoints_of_one_thread_all_land(
        sandboxes: list[BubblewrapHandle], tmp_path: Path) -> None:
    a, b = sandboxes
    sample(ws(a), 0o755)
    (ws(b) / "other").write_text("b's turn")
    async with SQLiteStore(tmp_path / "s.db") as store:
        ids: list[str] = []

        async def take(h: BubblewrapHandle) -> None:
            cp = await checkpoint_workspace(h, store, thread_id="shared")
            assert cp is not None
            ids.append(cp.checkpoint_id)

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for h in (a, b, a, b):
                    tg.start_soon(take, h)
        listed = [i.checkpoint_id for i in await store.list_checkpoints("shared")]
        assert sorted(listed) == sorted(ids) and len(ids) == 4


async def test_a_truncated_stream_from_the_sandbox_is_an_error(
        sandboxes: list[BubblewrapHandle], tmp_path: Path) -> None:
    """A hostile sandbox whose Python says nothing useful: one clear error, nothing stored."""
    a, _b = sandboxes
    (ws(a) / "f").write_text("x")
    async with SQLiteStore(tmp_path / "s.db") as store:
        with pytest.raises(CheckpointError, match="ended early|failed"):
            await checkpoint_workspace(a, store, thread_id="t", python="/bin/true",
                                       host_read=False)
        assert await store.list_checkpoints("t") == []


async def test_a_host_side_read_never_follows_the_sandboxs_symlinks(
        sandboxes: list[BubblewrapHandle], tmp_path: Path) -> None:
    a, b = sandboxes
    host_secret = tmp_path / "host-only"
    (host_secret / "d").mkdir(parents=True)
    (host_secret / "d" / "f.txt").write_text("HOST-PRIVATE-BYTES")
    (host_secret / "top.txt").write_text("HOST-PRIVATE-BYTES")
    w = ws(a)
    (w / "d").mkdir()
    (w / "d" / "f.txt").write_text("mine")
    (w / "escape").symlink_to(host_secret)            # a directory outside
    (w / "top-link").symlink_to(host_secret / "top.txt")  # a file outside
    os.mkfifo(w / "pipe")  # would block a reader that opened it for reading
    async with SQLiteStore(tmp_path / "s.db") as store:
        with anyio.fail_after(60):
            cp = await checkpoint_workspace(a, store, thread_id="t")
        assert cp is not None
        kinds = {e.path: e.kind for e in cp.entries}
        assert kinds == {"d": "dir", "d/f.txt": "file", "escape": "symlink",
                         "top-link": "symlink"}
        await restore_checkpoint(b, store, cp)
        assert (ws(b) / "d" / "f.txt").read_text() == "mine"
        assert os.readlink(ws(b) / "escape") == str(host_secret)
        assert await store.get_chunks([_digest(b"HOST-PRIVATE-BYTES")]) == {}
    assert b"HOST-PRIVATE-BYTES" not in _store_bytes(tmp_path / "s.db")


async def test_a_directory_swapped_for_a_symlink_during_a_host_read_is_not_followed(
        sandboxes: list[BubblewrapHandle], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The race a hostile agent would run: the walk sees ``d/f.txt`` in a directory, then
    ``d`` becomes a symlink to a host directory holding an ``f.txt`` before the content is
    read. The read is refused by the kernel (no symlink on the way): the file is recorded
    unreadable, and no byte of the host's file reaches the store."""
    from corral.sandbox import _checkpoint_host

    a, _b = sandboxes
    host_secret = tmp_path / "host-only"
    host_secret.mkdir()
    (host_secret / "f.txt").write_text("HOST-PRIVATE-BYTES")
    w = ws(a)
    (w / "d").mkdir()
    (w / "d" / "f.txt").write_text("mine")
    walk = _checkpoint_host._walk

    def walk_then_swap(*args: object) -> None:
        walk(*args)  # type: ignore[arg-type]
        (w / "d").rename(w / "d-gone")
        (w / "d").symlink_to(host_secret)

    monkeypatch.setattr(_checkpoint_host, "_walk", walk_then_swap)
    async with SQLiteStore(tmp_path / "s.db") as store:
        cp = await checkpoint_workspace(a, store, thread_id="t")
        assert cp is not None
        [f] = [e for e in cp.entries if e.path == "d/f.txt"]
        assert f.skipped == "unreadable" and not f.chunks
        assert await store.get_chunks([_digest(b"HOST-PRIVATE-BYTES")]) == {}
    assert b"HOST-PRIVATE-BYTES" not in _store_bytes(tmp_path / "s.db")


def _digest(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _store_bytes(db: Path) -> bytes:
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*") if p.is_file())
