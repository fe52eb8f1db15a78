"""Where a PostgreSQL append's time goes: the same ``append_events`` call, one event, sent
several ways, and the pieces of the call itself.

Usage: python bench/pg_append_parts.py --store postgresql://… [--calls N] [--rounds R]
                                       [--backend asyncio|trio]

Measures, in a fresh schema of that database (dropped at the end), µs per call (median of R
rounds of N calls, one caller):

- ``store.append``: the whole public call;
- the call from the event loop through the store's pool (:class:`LoopStatement`), and the
  same on one connection without the pool, prepared and parsed each time;
- the call in a worker thread: ``anyio.to_thread`` (psycopg, prepared), the same with a
  limiter of its own, and a dedicated thread fed through a queue;
- the call blocking (no event loop), with ``synchronous_commit`` on and off, and a bare
  round trip (``SELECT 1``): the commit's flush and the server's work, by difference.
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import psycopg

from corral.stores import _pg_direct
from corral.stores._pg_listen import CHANNEL, payload
from corral.stores._postgres import PostgresStore
from corral.stores._protocols import NewRun

EVENT = {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "token 1 " * 4}


class Worker:
    """A dedicated thread running what it is handed, answering through ``done``."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], Callable[[Any], None]]] = (
            queue.SimpleQueue())
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            job, done = self.jobs.get()
            done(job())


async def main(args: argparse.Namespace) -> None:
    schema = f"corral_bench_{uuid.uuid4().hex[:10]}"
    url = args.store + ("&" if "?" in args.store else "?") + f"schema={schema}"
    store = await PostgresStore.open(url)
    conn = psycopg.connect(store.target.dsn(), autocommit=True)
    lax = psycopg.connect(store.target.dsn(), autocommit=True,
                          options="-c synchronous_commit=off")
    try:
        await store.create(NewRun("r", "bench"))
        epoch = (await store.acquire_claim("r", "bench", 600)).epoch
        text = json.dumps(EVENT, separators=(",", ":"), ensure_ascii=False)
        params = ["r", str(epoch), "{1}", _pg_direct.text_array([text]), CHANNEL,
                  payload(schema, "r")]
        values = [p.encode() for p in params]
        sql = store._append_statement.sql
        pg = conn.pgconn
        pg.prepare(b"append", sql)
        pg.prepare(b"one", b"SELECT 1")
        lax.pgconn.prepare(b"append", sql)
        py_sql = sql.decode()
        for n in range(6, 0, -1):
            py_sql = py_sql.replace(f"${n}", "%s")

        def sync_call() -> Any:
            return conn.execute(py_sql, [epoch if i == 1 else p for i, p in enumerate(params)],
                                prepare=True).fetchone()

        limiter = anyio.CapacityLimiter(1)
        worker = Worker()

        async def dedicated() -> None:
            done = anyio.Event()
            token = _loop_token()
            worker.jobs.put((sync_call, lambda _r: token(done.set)))
            await done.wait()

        async def loop_call(prepared: bool) -> None:
            if prepared:
                pg.send_query_prepared(b"append", values)
            else:
                pg.send_query_params(sql, values)
            await _pg_direct._results(pg)

        async def blocking(name: bytes, vals: list[bytes]) -> None:
            pg.exec_prepared(name, vals)

        async def sync_off() -> None:
            lax.pgconn.exec_prepared(b"append", values)

        items = [(EVENT, 1)]
        ways: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
            ("store.append", lambda: store.append("r", items, epoch=epoch)),
            ("from the loop, the store's pool (prepared)",
             lambda: store._append_statement.first_row(store._pool, params)),
            ("from the loop, one connection, prepared", lambda: loop_call(True)),
            ("from the loop, one connection, parsed each time", lambda: loop_call(False)),
            ("anyio.to_thread, psycopg (prepared)", lambda: anyio.to_thread.run_sync(sync_call)),
            ("anyio.to_thread, a limiter of its own",
             lambda: anyio.to_thread.run_sync(sync_call, limiter=limiter)),
            ("a dedicated thread fed through a queue", dedicated),
            ("blocking, no event loop", lambda: blocking(b"append", values)),
            ("blocking, synchronous_commit=off", sync_off),
            ("a round trip: SELECT 1, blocking", lambda: blocking(b"one", [])),
        ]
        times: dict[str, list[float]] = {}
        for _round in range(args.rounds):
            for label, way in ways:
                for _ in range(20):
                    await way()
                start = time.perf_counter()
                for _ in range(args.calls):
                    await way()
                times.setdefault(label, []).append(
                    (time.perf_counter() - start) / args.calls * 1e6)
    finally:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.close()
        lax.close()
        await store.aclose()
    print(f"µs per call, median of {args.rounds} rounds of {args.calls} "
          f"({_backend()}, psycopg {psycopg.__version__}):")
    for label, got in times.items():
        print(f"  {label:50s} {statistics.median(got):6.0f}   "
              f"({' '.join(f'{x:.0f}' for x in got)})")


def _backend() -> str:
    import sniffio

    return sniffio.current_async_library()


def _loop_token() -> Callable[[Callable[[], Any]], None]:
    """How a foreign thread schedules a callback on this event loop."""
    if _backend() == "trio":
        import trio

        return trio.lowlevel.current_trio_token().run_sync_soon
    import asyncio

    loop = asyncio.get_running_loop()

    def schedule(callback: Callable[[], Any]) -> None:
        loop.call_soon_threadsafe(callback)

    return schedule


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="postgresql://… (a database you own)")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    parsed = parser.parse_args()
    anyio.run(main, parsed, backend=parsed.backend)
