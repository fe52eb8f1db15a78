"""Store throughput: appends of 1 and of 100 events, and cross-process tail latency.

Usage: python bench/store_throughput.py [--store URL] [--appenders 1,8] [--events N]
                                         [--tail-events N] [--interval S]

Without ``--store`` it measures a SQLite store in a temporary directory (``--synchronous``
picks its mode). With ``--store postgresql://…`` it measures that database, in a fresh
PostgreSQL schema dropped at the end (unless the URL names one with ``schema=``).

Prints events/s for single-event appends (one appender, then N concurrent appenders in one
process, each on its own run), for batches of 100 (one appender), then the latency from
commit to a tailer in another process receiving the event (p50, p99, max).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import anyio
from anyio.streams.text import TextReceiveStream

SRC = Path(__file__).resolve().parent.parent / "src"
sys.path.insert(0, str(SRC))

from corral.stores._protocols import NewRun, Store
from corral.stores import open_store

TAILER = """
import json, sys, time, anyio
sys.path.insert(0, sys.argv[3])
from corral.stores import open_store

async def main(url, run_id):
    store = await open_store(url)
    print("ready", flush=True)
    lat = []
    async for e in store.read(run_id):
        lat.append(time.time() - e.event["t"])
    print(json.dumps(lat), flush=True)
    await store.aclose()

anyio.run(main, sys.argv[1], sys.argv[2])
"""


def _event(i: int) -> dict[str, object]:
    return {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": f"token {i} " * 4}


async def _appender(store: Store, calls: int, batch: int) -> None:
    run_id = f"bench-{batch}-{uuid.uuid4().hex}"
    await store.create(NewRun(run_id, "bench"))
    claim = await store.acquire_claim(run_id, "bench", 600)
    items = [(_event(i), i) for i in range(batch)]
    for _ in range(calls):
        await store.append(run_id, items, epoch=claim.epoch)


async def throughput(url: str, total: int, batch: int, appenders: int = 1) -> float:
    """Events/s of ``appenders`` tasks, each appending ``total // appenders`` events to its
    own run in calls of ``batch`` events, through one store object."""
    store = await open_store(url)
    calls = max(1, total // batch // appenders)
    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(appenders):
            tg.start_soon(_appender, store, calls, batch)
    elapsed = time.perf_counter() - start
    await store.aclose()
    return calls * batch * appenders / elapsed


async def tail_latency(url: str, count: int, interval: float) -> list[float]:
    store = await open_store(url)
    run_id = f"tail-{uuid.uuid4().hex}"
    await store.create(NewRun(run_id, "bench"))
    claim = await store.acquire_claim(run_id, "bench", 600)
    env = dict(os.environ)
    async with await anyio.open_process(
        [sys.executable, "-c", TAILER, url, run_id, str(SRC)], env=env
    ) as proc:
        assert proc.stdout is not None
        stream = TextReceiveStream(proc.stdout)
        buffer = ""
        while "ready\n" not in buffer:
            buffer += await stream.receive()
        await anyio.sleep(0.5)  # the tailer's first read and its listener are up
        for i in range(count):
            event = {"type": "TEXT_MESSAGE_CONTENT", "delta": str(i), "t": time.time()}
            await store.append(run_id, [(event, i)], epoch=claim.epoch)
            await anyio.sleep(interval)
        await store.close(run_id)
        async for chunk in stream:
            buffer += chunk
        await proc.wait()
    await store.aclose()
    line = buffer.split("ready\n", 1)[1].strip()
    return [x * 1000 for x in json.loads(line)]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _postgres_setup(url: str) -> tuple[str, str | None, str]:
    """The URL to measure (a fresh schema unless ``url`` names one), the schema to drop
    afterwards, and a description of the server."""
    import psycopg

    from corral.stores._pg_url import parse_postgres_url

    target = parse_postgres_url(url)
    schema = None
    if "schema=" not in url:
        schema = f"corral_bench_{uuid.uuid4().hex[:10]}"
        url += ("&" if "?" in url else "?") + f"schema={schema}"
    with psycopg.connect(target.dsn(), autocommit=True) as conn:
        row = conn.execute("SELECT current_setting('server_version'), "
                           "current_setting('synchronous_commit'), "
                           "current_setting('fsync')").fetchone()
    assert row is not None
    about = (f"PostgreSQL {row[0]} (synchronous_commit={row[1]}, fsync={row[2]}), "
             f"psycopg {psycopg.__version__} (appends from the event loop, the rest via "
             "anyio.to_thread)")
    return url, schema, about


def _postgres_drop(url: str, schema: str) -> None:
    import psycopg

    from corral.stores._pg_url import parse_postgres_url

    with psycopg.connect(parse_postgres_url(url).dsn(), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="store URL (default: SQLite in a temporary directory)")
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--appenders", default="1,8",
                        help="concurrent single-event appenders to measure, comma-separated")
    parser.add_argument("--tail-events", type=int, default=500)
    parser.add_argument("--interval", type=float, default=0.01)
    parser.add_argument("--synchronous", default="normal", choices=["normal", "full"])
    args = parser.parse_args()
    counts = [int(n) for n in args.appenders.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        drop: str | None = None
        if args.store and args.store.startswith(("postgresql://", "postgres://")):
            url, drop, about = _postgres_setup(args.store)
        elif args.store:
            url, about = args.store, args.store
        else:
            import sqlite3

            url = f"sqlite://{tmp}/bench.db?synchronous={args.synchronous}"
            about = (f"SQLite {sqlite3.sqlite_version}, sqlite3 via anyio.to_thread, WAL, "
                     f"synchronous={args.synchronous}")
        try:
            singles = [(n, await throughput(url, args.events // 4, 1, n)) for n in counts]
            batched = await throughput(url, args.events * 5, 100)
            lat = await tail_latency(url, args.tail_events, args.interval)
        finally:
            if drop is not None:
                _postgres_drop(url, drop)
    print(f"{about}, Python {sys.version.split()[0]}")
    for n, rate in singles:
        who = "1 appender" if n == 1 else f"{n} appenders (one run each, one store)"
        print(f"append, 1 event per call, {who}: {rate:10,.0f} events/s  (target >= 2,000)")
    print(f"append, 100 events per call, 1 appender: {batched:10,.0f} events/s  "
          "(target >= 20,000)")
    print(f"cross-process tail latency over {len(lat)} events, one every "
          f"{args.interval * 1000:.0f} ms: p50 {statistics.median(lat):.2f} ms, "
          f"p99 {pct(lat, 0.99):.2f} ms, max {max(lat):.2f} ms  (target p99 <= 50 ms)")


if __name__ == "__main__":
    anyio.run(main)
