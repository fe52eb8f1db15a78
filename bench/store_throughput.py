"""SQLite store throughput: appends of 1 and of 100 events, and cross-process tail latency.

Usage: python bench/store_throughput.py [--events N] [--tail-events N]

Prints events/s for single-event appends and batches of 100, then the latency from commit to
a tailer in another process receiving the event (p50, p99, max).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
from anyio.streams.text import TextReceiveStream

SRC = Path(__file__).resolve().parent.parent / "src"
sys.path.insert(0, str(SRC))

from corral.stores._protocols import NewRun
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


async def throughput(url: str, total: int, batch: int) -> float:
    store = await open_store(url)
    run_id = f"bench-{batch}-{time.monotonic_ns()}"
    await store.create(NewRun(run_id, "bench"))
    claim = await store.acquire_claim(run_id, "bench", 600)
    items = [(_event(i), i) for i in range(batch)]
    start = time.perf_counter()
    for _ in range(total // batch):
        await store.append(run_id, items, epoch=claim.epoch)
    elapsed = time.perf_counter() - start
    await store.aclose()
    return (total // batch) * batch / elapsed


async def tail_latency(url: str, count: int, interval: float) -> list[float]:
    store = await open_store(url)
    run_id = f"tail-{time.monotonic_ns()}"
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
        await anyio.sleep(0.2)
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


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--tail-events", type=int, default=500)
    parser.add_argument("--interval", type=float, default=0.01)
    parser.add_argument("--synchronous", default="normal", choices=["normal", "full"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite://{tmp}/bench.db?synchronous={args.synchronous}"
        single = await throughput(url, args.events // 4, 1)
        batched = await throughput(url, args.events * 5, 100)
        lat = await tail_latency(url, args.tail_events, args.interval)
    print(f"SQLite {sqlite3.sqlite_version}, Python {sys.version.split()[0]}, "
          f"sqlite3 via anyio.to_thread, WAL, synchronous={args.synchronous}")
    print(f"append, 1 event per call:    {single:10,.0f} events/s  (target >= 2,000)")
    print(f"append, 100 events per call: {batched:10,.0f} events/s  (target >= 20,000)")
    print(f"cross-process tail latency over {len(lat)} events, one every "
          f"{args.interval * 1000:.0f} ms: p50 {statistics.median(lat):.2f} ms, "
          f"p99 {pct(lat, 0.99):.2f} ms, max {max(lat):.2f} ms  (target p99 <= 50 ms)")


if __name__ == "__main__":
    anyio.run(main)
