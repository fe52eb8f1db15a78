"""Saved CLI sessions in the store: put and get of one thread's session.

A realistic Claude Code transcript (JSON lines, ~5 MiB by default, plus a few small
files) is put (replacing the previous one) and got back, on a fresh SQLite store and, when
``--pg URL`` is given (a database the user may create schemas in), a PostgreSQL store in a
schema of its own, dropped afterwards. Prints median and p90 of each.

    PYTHONPATH=src python bench/session_store.py [--mib 5] [--n 15] [--pg postgresql://…]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import anyio

from corral.stores import open_store
from corral.stores._protocols import StoredSession


def transcript(mib: float) -> bytes:
    lines: list[bytes] = []
    size = 0
    i = 0
    while size < mib * (1 << 20):
        line = json.dumps({"type": "assistant", "uuid": str(uuid.UUID(int=i)), "message": {
            "role": "assistant", "content": [{"type": "text", "text": f"step {i}: " +
                                             "lorem ipsum dolor sit amet " * 20}]}}).encode()
        lines.append(line + b"\n")
        size += len(line) + 1
        i += 1
    return b"".join(lines)


async def measure(url: str, files: dict[str, bytes], n: int) -> None:
    store = await open_store(url)
    try:
        puts: list[float] = []
        gets: list[float] = []
        for k in range(n):
            t0 = time.perf_counter()
            await store.put_session(StoredSession("t", "claude-code", f"s{k}", files,
                                                  time.time(), f"r{k}"))
            t1 = time.perf_counter()
            got = await store.get_session("t", "claude-code")
            t2 = time.perf_counter()
            assert got is not None and len(got.files) == len(files)
            puts.append(t1 - t0)
            gets.append(t2 - t1)
        size = sum(map(len, files.values())) / (1 << 20)
        for name, xs in (("put", puts), ("get", gets)):
            xs.sort()
            print(f"{url.split(':')[0]:10} {name} {size:.1f} MiB: median "
                  f"{statistics.median(xs) * 1000:7.1f} ms, p90 "
                  f"{xs[int(len(xs) * 0.9)] * 1000:7.1f} ms")
    finally:
        await store.aclose()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=float, default=5.0)
    ap.add_argument("--n", type=int, default=15)
    ap.add_argument("--pg", default=None)
    args = ap.parse_args()
    files = {".claude/projects/-workspace/s.jsonl": transcript(args.mib),
             ".claude/projects/-workspace/memory/notes.md": b"notes\n" * 100,
             ".claude/todos/t.json": b"[]"}
    with tempfile.TemporaryDirectory() as tmp:
        await measure(f"sqlite://{Path(tmp) / 'bench.db'}", files, args.n)
    if args.pg:
        import psycopg

        schema = f"bench_{uuid.uuid4().hex[:12]}"
        try:
            await measure(f"{args.pg}?schema={schema}", files, args.n)
        finally:
            with psycopg.connect(args.pg, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if __name__ == "__main__":
    anyio.run(main)
