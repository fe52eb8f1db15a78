"""``corral gc`` frees the chunks of removed checkpoints (#27), safely against concurrent
writers: a chunk a writer put or touched lately stays, and a checkpoint whose chunks went
under it is taken again rather than stored naming chunks the store lacks."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from corral.sandbox._checkpoint import checkpoint_workspace, restore_checkpoint
from corral.sandbox._gc import collect_idle
from corral.stores import CHUNK_GRACE, Checkpoint, CheckpointEntry, SQLiteStore, open_store
from corral.testing._checkpoints import local_sandbox, tree

OLD = time.time() - 2 * CHUNK_GRACE


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _manifest(cid: str, *contents: bytes) -> Checkpoint:
    entries = [CheckpointEntry("d", "dir", 0o755)]
    entries += [CheckpointEntry(f"d/f{i}", "file", 0o644, len(c), (_digest(c),))
                for i, c in enumerate(contents)]
    return Checkpoint(cid, "t", None, OLD, "/workspace", tuple(entries))


def test_corral_gc_frees_unnamed_chunks_and_keeps_what_a_writer_put_or_touched(
        corral_cmd: list[str], cli_env: dict[str, str], corral_home: Path) -> None:
    a1, b1, shared, orphan, touched, fresh = (f"chunk {n}".encode() for n in range(6))

    async def before() -> None:
        store = await open_store()
        try:
            await store.put_chunks({_digest(c): c for c in (a1, b1, shared, orphan, touched)},
                                   now=OLD)
            await store.put_checkpoint(_manifest("ckpt-a", a1, shared), now=OLD)
            await store.put_checkpoint(_manifest("ckpt-b", b1, shared), now=OLD)
            assert await store.delete_checkpoint("ckpt-a")
            # a writer between its chunks and its manifest: one chunk it found held (and
            # so touched), one it put just now
            assert await store.missing_chunks([_digest(touched)]) == set()
            await store.put_chunks({_digest(fresh): fresh})
        finally:
            await store.aclose()

    anyio.run(before)
    out = subprocess.run([*corral_cmd, "gc", "--json"], env=cli_env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["chunks"] == 2  # a1 (its checkpoint removed) and orphan

    async def after() -> None:
        store = await open_store()
        try:
            # the writer's manifest goes in: its chunks are there
            await store.put_checkpoint(_manifest("ckpt-c", touched, fresh))
            held = await store.get_chunks([_digest(c) for c in (a1, b1, shared, orphan,
                                                                 touched, fresh)])
            assert set(held) == {_digest(c) for c in (b1, shared, touched, fresh)}
        finally:
            await store.aclose()

    anyio.run(after)
    again = subprocess.run([*corral_cmd, "gc"], env=cli_env, capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0 and "chunk" not in again.stdout, again.stdout


@pytest.mark.anyio
async def test_a_checkpoint_whose_parents_chunks_are_collected_under_it_is_taken_again(
        tmp_path: Path) -> None:
    # An incremental checkpoint names its parent's unchanged chunks without putting them
    # again. Here the parent is removed and gc runs (its chunks long untouched) between
    # the child's chunks and its manifest: the store refuses the manifest, and the
    # checkpoint is taken again reading everything, so it restores whole.
    class Racing(SQLiteStore):
        raced = 0

        async def put_checkpoint(self, checkpoint: Checkpoint, *,
                                 now: float | None = None) -> None:
            if checkpoint.parent_id is not None and not self.raced:
                self.raced += 1
                assert await self.delete_checkpoint(checkpoint.parent_id)
                report = await collect_idle(self, orphans=False)
                assert report.chunks > 0
            await super().put_checkpoint(checkpoint, now=now)

    store = Racing(tmp_path / "store.db")
    try:
        async with local_sandbox() as (h1, ws1, _p1), local_sandbox() as (h2, ws2, _p2):
            for i in range(20):
                (ws1 / f"f{i}.txt").write_text(f"file {i}\n" * 100)
            parent = await checkpoint_workspace(h1, store, thread_id="t", python=sys.executable,
                                                now=OLD)
            assert parent is not None
            (ws1 / "f3.txt").write_text("changed\n")
            child = await checkpoint_workspace(h1, store, thread_id="t", parent=parent,
                                               python=sys.executable)
            assert store.raced == 1 and child is not None and child.parent_id is None
            assert [c.checkpoint_id for c in await store.list_checkpoints("t")] == [
                child.checkpoint_id]
            await restore_checkpoint(h2, store, child.checkpoint_id, python=sys.executable)
            assert tree(ws2) == tree(ws1)
    finally:
        await store.aclose()
