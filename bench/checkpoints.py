"""Workspace checkpoints (#27): a 100 MiB workspace of 2000 files in a bubblewrap sandbox,
checkpointed into a store: the first checkpoint, one after a one-file edit, a restore into
a fresh sandbox, and the bytes stored after 20 turns of one-file edits.

The workspace: 1900 text files of ~10 KiB (source-like, compressible) and 100 files of
~0.8 MiB of random bytes (binaries), in 50 directories. Each timing is the median of
``--runs`` (the incremental one of the 20 turns).

Run: PYTHONPATH=src python bench/checkpoints.py [--store sqlite|postgres] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio


def make_workspace(root: Path) -> int:
    rng = random.Random(27)
    words = [f"name{i}" for i in range(500)]
    total = 0
    for i in range(2000):
        d = root / f"pkg{i % 50:02}"
        d.mkdir(exist_ok=True)
        if i % 20 == 0:
            data = os.urandom(800 * 1024 + rng.randrange(64 * 1024))
            path = d / f"blob{i:04}.bin"
        else:
            lines = [f"def {rng.choice(words)}_{j}(x):  # {rng.random()}\n    return x + {j}\n"
                     for j in range(120)]
            data = "".join(lines).encode()
            path = d / f"mod{i:04}.py"
        path.write_bytes(data)
        total += len(data)
    return total


async def main(args: argparse.Namespace) -> None:
    from corral.providers._bubblewrap import BubblewrapProvider
    from corral.sandbox._checkpoint import checkpoint_workspace, restore_checkpoint
    from corral.stores import open_store

    home = Path(tempfile.mkdtemp(prefix="ckbench-"))
    os.environ["CORRAL_HOME"] = str(home)
    provider = BubblewrapProvider()
    schemas: list[str] = []

    def url_of(name: str) -> str:
        # every first checkpoint goes into an empty store: SQLite a new file, PostgreSQL a
        # new schema (dropped at the end)
        if args.store == "sqlite":
            return f"sqlite://{home / (name + '.db')}"
        schema = f"ckbench_{os.getpid()}_{name}"
        schemas.append(schema)
        base, _, query = args.pg.partition("?")
        rest = "&".join(q for q in query.split("&") if q and not q.startswith("schema="))
        return f"{base}?schema={schema}" + (f"&{rest}" if rest else "")

    store = await open_store(url_of("store"))
    a = await provider.create()
    try:
        ws = Path(a.host_path(a.workdir))
        size = make_workspace(ws)
        print(f"workspace: {size / (1 << 20):.1f} MiB in 2000 files; store {args.store}; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        firsts, dedups, restores = [], [], []
        cp = None
        for run in range(args.runs):
            fresh = await open_store(url_of(f"first{run}"))
            try:
                t = time.perf_counter()
                await checkpoint_workspace(a, fresh, thread_id="first")
                firsts.append(time.perf_counter() - t)
            finally:
                await fresh.aclose()
            # the same tree on another thread of a store that holds every chunk
            t = time.perf_counter()
            cp = await checkpoint_workspace(a, store, thread_id=f"first-{run}")
            if run:
                dedups.append(time.perf_counter() - t)
            else:
                stats = await store.chunk_stats()
                print(f"first checkpoint stored {stats.stored_bytes / (1 << 20):.1f} MiB "
                      f"in {stats.count} chunks")
        assert cp is not None
        for _run in range(args.runs):
            b = await provider.create()
            try:
                t = time.perf_counter()
                await restore_checkpoint(b, store, cp)
                restores.append(time.perf_counter() - t)
            finally:
                await provider.destroy(b.ref)
        # 20 turns of one-file edits on a fresh thread (the store holds the runs above)
        before = await store.chunk_stats()
        turns, turn_cpu = [], []
        thread = "turns"
        parent = await checkpoint_workspace(a, store, thread_id=thread)
        base = (await store.chunk_stats()).stored_bytes
        for turn in range(20):
            target = ws / f"pkg{turn % 50:02}" / f"mod{(turn % 50) + 50:04}.py"
            if not target.exists():
                target = next(ws.glob("pkg*/mod*.py"))
            with target.open("a") as fh:
                fh.write(f"# turn {turn}\n")
            t, c = time.perf_counter(), time.process_time()
            parent = await checkpoint_workspace(a, store, thread_id=thread, parent=parent)
            turns.append(time.perf_counter() - t)
            turn_cpu.append(time.process_time() - c)
        after = await store.chunk_stats()
        manifests = sum(1 for _ in await store.list_checkpoints(thread))
        print(f"first checkpoint into an empty store: median {statistics.median(firsts):.2f} s "
              f"({', '.join(f'{x:.2f}' for x in firsts)})")
        if dedups:
            print(f"the same tree on another thread (every chunk held): median "
                  f"{statistics.median(dedups):.2f} s ({', '.join(f'{x:.2f}' for x in dedups)})")
        print(f"restore into a fresh sandbox: median {statistics.median(restores):.2f} s "
              f"({', '.join(f'{x:.2f}' for x in restores)})")
        print(f"checkpoint after a one-file edit: median {statistics.median(turns) * 1000:.0f} ms,"
              f" max {max(turns) * 1000:.0f} ms (20 turns); host CPU (this process, every "
              f"thread) median {statistics.median(turn_cpu) * 1000:.0f} ms")
        stored = after.stored_bytes - before.stored_bytes + (base - before.stored_bytes) * 0
        whole = after.stored_bytes
        print(f"21 checkpoints of the thread ({manifests}): chunks stored "
              f"{whole / (1 << 20):.1f} MiB = {whole / size:.3f}x the workspace "
              f"(the 20 turns added {stored / 1024:.0f} KiB of chunks)")
        if args.store == "sqlite":
            db = home / "store.db"  # the turns' store
            wal = Path(str(db) + "-wal")
            disk = db.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
            print(f"SQLite file on disk (chunks, manifests, indexes): {disk / (1 << 20):.1f} MiB"
                  f" = {disk / size:.3f}x")
    finally:
        await provider.destroy(a.ref)
        await store.aclose()
        if schemas:
            import psycopg

            async with await psycopg.AsyncConnection.connect(args.pg.partition("?")[0],
                                                             autocommit=True) as conn:
                for schema in schemas:
                    await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--pg", default=os.environ.get(
        "CORRAL_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres?schema=ckbench"))
    parser.add_argument("--runs", type=int, default=3)
    anyio.run(main, parser.parse_args())
    sys.exit(0)
