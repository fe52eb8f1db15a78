"""Reaper sweep cost versus the number of detached runs in the store.

Usage: PYTHONPATH=src python bench/reap_sweep.py [--sizes 100,1000,10000] [--batch 25]

For each size N, a fresh SQLite store holds N detached runs, each with a real journal file:
most agents are still producing (journal without an exit sentinel, recently written), and 5
of the 25 oldest have exited (journal ends with the exit trailer carrying the run's nonce).
One sweep (``reap_detached_runs`` with the real journal probe and the ``command`` harness's
translation as the drive, ``max_runs=--batch``) must cost the same whatever N is: it lists
at most ``batch`` runs (index walk + LIMIT), probes those, and finalizes the finished ones.
For contrast it also times the unbounded listing (every detached run), which grows with N.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

SRC = Path(__file__).resolve().parent.parent / "src"
sys.path.insert(0, str(SRC))

from corral.journal._layout import JournalPaths
from corral.runs._run_probe import probe_run_exit
from corral.runs._reap_sweep import ReapOutcome, reap_detached_runs
from corral.runs._reap_runner import journal_drive
from corral.stores._records import RunPatch
from corral.journal._sentinel import format_trailer, new_nonce
from corral.stores._protocols import NewRun
from corral.stores import open_store

FINISHED_AT = (0, 5, 10, 15, 20)  # positions among the oldest runs whose agent exited


async def build(db: Path, journals: Path, n: int, now: float) -> None:
    store = await open_store(f"sqlite://{db}")
    try:
        for i in range(n):
            run_id = f"run-{i:06d}"
            nonce = new_nonce()
            paths = JournalPaths.for_run(journals, run_id)
            body = b"".join(b"line %d of agent %d\n" % (k, i) for k in range(20))
            if i in FINISHED_AT:
                body = body.rstrip(b"\n") + format_trailer(nonce, 0, None)
            paths.journal.write_bytes(body)
            await store.create(NewRun(run_id, f"t-{i}", harness="command",
                                      spec={"argv": ["agent"]},
                                      journal={"dir": str(journals), "nonce": nonce}))
            # Oldest first: run i left i seconds after run 0.
            await store.update(run_id, RunPatch(detached_since=now - 10_000 + i))
    finally:
        await store.aclose()


async def measure(db: Path, batch: int, now: float) -> dict[str, float]:
    store = await open_store(f"sqlite://{db}")
    try:
        full: list[float] = []
        capped: list[float] = []
        for _ in range(5):
            t = time.perf_counter()
            everyone = await store.list_reclaimable(now, 0)
            full.append(time.perf_counter() - t)
            t = time.perf_counter()
            await store.list_reclaimable(now, 0, limit=batch)
            capped.append(time.perf_counter() - t)
        t = time.perf_counter()
        result = await reap_detached_runs(
            store, probe=probe_run_exit, drive=journal_drive(store), ttl=86_400.0, now=now,
            max_runs=batch, quiet=0.0,
        )
        sweep = time.perf_counter() - t
        assert result.considered == batch, result
        assert result.outcomes[ReapOutcome.FINALIZED] == len(FINISHED_AT), result.outcomes
        assert result.outcomes[ReapOutcome.PRODUCING] == batch - len(FINISHED_AT)
        return {
            "detached": len(everyone),
            "full_ms": statistics.median(full) * 1000,
            "capped_ms": statistics.median(capped) * 1000,
            "sweep_ms": sweep * 1000,
        }
    finally:
        await store.aclose()


def plan(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "EXPLAIN QUERY PLAN SELECT doc FROM runs WHERE status = 'running' "
            "AND detached_since IS NOT NULL AND detached_since <= ? "
            "ORDER BY detached_since, seq LIMIT ?", (0.0, 25)).fetchall()
    return "; ".join(str(r[-1]) for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--batch", type=int, default=25)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"SQLite {sqlite3.sqlite_version}, Python {sys.version.split()[0]}, batch {args.batch}, "
          f"{len(FINISHED_AT)} exited agents in the batch, the rest producing")
    print(f"{'detached runs':>14}  {'build s':>8}  {'list all ms':>11}  {'list batch ms':>13}  "
          f"{'sweep ms':>9}")
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="corral-reap-bench-") as tmp:
            db, journals = Path(tmp) / "corral.db", Path(tmp) / "journals"
            journals.mkdir()
            now = time.time()
            t = time.perf_counter()
            anyio.run(build, db, journals, n, now)
            built = time.perf_counter() - t
            m = anyio.run(measure, db, args.batch, now)
            print(f"{int(m['detached']):>14,}  {built:>8.1f}  {m['full_ms']:>11.1f}  "
                  f"{m['capped_ms']:>13.2f}  {m['sweep_ms']:>9.1f}")
            if n == sizes[-1]:
                print(f"query plan: {plan(db)}")


if __name__ == "__main__":
    main()
