"""The SQLite store's share of one ``ensure``: its two operations on the critical path.

Times ``try_lock_reading_instance`` (the key's lock taken and the instance record read, in
one transaction) and ``upsert_instance_unlocking`` (the ``ready`` record written and the lock
released, in one transaction) on a fresh SQLite store, back to back and after an idle
moment (as between the samples of ``bench/lifecycle_rows.py``, where the CPU has gone idle).
Also ``ensure``'s whole key lock around an empty body (``key_lock``: the same two store
operations, the lease renewer's task and the lock's scopes).
Run it once per checkout (``PYTHONPATH=<checkout>/src``) to compare them:

    PYTHONPATH=src python bench/store_ensure_ops.py [--n 300] [--idle 0,0.015]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import anyio

from corral.sandbox._ensure import key_lock
from corral.stores._protocols import InstanceRecord
from corral.stores._sqlite import SQLiteStore


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(int(len(s) * q), len(s) - 1)]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--idle", default="0,0.015", help="seconds idle before each sample")
    args = ap.parse_args()
    record = InstanceRecord(
        key="k", provider="local", provider_sandbox_id="sb-0123456789ab", thread_id="t",
        updated_at=time.time(), latest_run_id="r", expires_at=None,
        meta={"definition": "d", "workspace_hash": "0" * 64, "state": "ready",
              "provider": {"name": "local", "config": {}, "package": None}})
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(os.path.join(tmp, "s.db"))
        try:
            for idle in (float(x) for x in args.idle.split(",")):
                lock: list[float] = []
                write: list[float] = []
                whole: list[float] = []
                for _ in range(args.n):
                    await anyio.sleep(idle)
                    a = time.perf_counter()
                    await store.try_lock_reading_instance("sandbox:k", "me", 30, "k")
                    lock.append(time.perf_counter() - a)
                    await anyio.sleep(idle)
                    a = time.perf_counter()
                    await store.upsert_instance_unlocking(record, "sandbox:k", "me")
                    write.append(time.perf_counter() - a)
                    await anyio.sleep(idle)
                    a = time.perf_counter()
                    async with key_lock(store, "k2", read_instance=True):
                        pass
                    whole.append(time.perf_counter() - a)
                for name, xs in (("lock + read", lock), ("write + unlock", write),
                                 ("key_lock", whole)):
                    print(f"idle {idle * 1e3:4.0f} ms  {name:<15} p50 {pct(xs, 0.5) * 1e6:6.0f} us"
                          f"  p90 {pct(xs, 0.9) * 1e6:6.0f} us  (n={args.n})")
        finally:
            await store.aclose()


if __name__ == "__main__":
    anyio.run(main)
