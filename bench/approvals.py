"""Approvals through the store: how long a held tool call takes to resume after an answer,
and what a human's answer costs.

Usage: python bench/approvals.py [--store URL] [--count N]

A gate (:class:`corral.tools._approvals.Approvals`) on one store object asks ``N`` times in
a row; for each, another store object on the same URL (another "host") answers as soon as
the request is pending (after a random part of a poll interval). Prints the latency from the answer's commit to the gate's return
(p50, p99, max: bounded by the gate's poll interval) and the time ``answer_approval``
takes (signature check, look-up, first-answer-wins write). Default store: a temporary
SQLite file.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

SRC = Path(__file__).resolve().parent.parent / "src"
sys.path.insert(0, str(SRC))

from corral.stores import open_store  # noqa: E402
from corral.tools._approvals import POLL, Approvals, answer_approval  # noqa: E402


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(url: str, count: int) -> None:
    driver = await open_store(url)
    # memory:// is one process's own: the "other host" is the same object there
    other = driver if url.startswith("memory:") else await open_store(url)
    gate = Approvals(driver, "bench-run", timeout=60)
    resume: list[float] = []
    answer_cost: list[float] = []
    try:
        for i in range(count):
            answered: list[float] = []

            async def ask(i: int = i, answered: list[float] = answered) -> None:
                assert await gate.request("deploy", {"i": i}) is None
                resume.append(time.perf_counter() - answered[0])

            async with anyio.create_task_group() as tg:
                tg.start_soon(ask)
                while not (pending := await other.list_pending_approvals("bench-run")):
                    await anyio.sleep(0.005)
                await anyio.sleep(random.uniform(0, POLL))  # a human: any moment of a poll
                t0 = time.perf_counter()
                await answer_approval(other, "bench-run", pending[0].approval_id, True)
                answered.append(time.perf_counter())
                answer_cost.append(answered[0] - t0)
    finally:
        await driver.aclose()
        if other is not driver:
            await other.aclose()
    ms = 1000.0
    print(f"store {url}, {count} approvals, gate poll {POLL * ms:.0f} ms")
    print(f"answer -> call resumes: p50 {statistics.median(resume) * ms:.1f} ms, "
          f"p99 {_pct(resume, 0.99) * ms:.1f} ms, max {max(resume) * ms:.1f} ms")
    print(f"answer_approval: p50 {statistics.median(answer_cost) * ms:.2f} ms, "
          f"p99 {_pct(answer_cost, 0.99) * ms:.2f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="store URL (default: a temporary SQLite file)")
    parser.add_argument("--count", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        anyio.run(main, args.store or f"sqlite://{Path(tmp) / 'corral.db'}", args.count)
