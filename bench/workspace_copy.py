"""Workspace copy: a host directory copied into a fresh bubblewrap sandbox by ``ensure``
(create + bootstrap), for a tree of many small files and for one big file, with the peak
RSS of the process doing it.

Each measurement runs in its own child process (so its peak RSS is its own, from wait4).

Run: PYTHONPATH=src python bench/workspace_copy.py [--runs 5] [--big-mib 512]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio


def make_small_tree(root: Path, files: int = 2000, per_dir: int = 40, size: int = 4096) -> int:
    payload = os.urandom(size)
    for i in range(files):
        d = root / f"d{i // per_dir:03}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i:05}.txt").write_bytes(payload)
    return files * size


def make_big_file(root: Path, mib: int) -> int:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "big.bin", "wb") as f:
        f.truncate(mib << 20)  # sparse on the host: the copy still reads and sends every byte
    return mib << 20


async def _ensure_once(ws: str) -> float:
    from corral import Lifecycle, RunContext, Sandbox, Workspace
    from corral.sandbox._sources import LocalDir
    from corral.stores import open_store

    store = await open_store("memory://")
    sb = Sandbox(provider="bubblewrap", lifecycle=Lifecycle(reuse="none"),
                 workspace=Workspace(source=LocalDir(ws)))
    ctx = RunContext("t", "r")
    try:
        t0 = time.perf_counter()
        await sb.ensure(ctx, store=store)
        took = time.perf_counter() - t0
        await sb.destroy(ctx, store=store)
    finally:
        await store.aclose()
    return took


def child(ws: str) -> None:
    print(anyio.run(_ensure_once, ws))


def measure(ws: Path) -> tuple[float, int]:
    """Seconds for ensure and the child's peak RSS in bytes."""
    proc = subprocess.Popen([sys.executable, __file__, "--child", str(ws)],
                            stdout=subprocess.PIPE, env=os.environ)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"child failed with status {status}")
    return float(out.split()[-1]), usage.ru_maxrss * 1024


def report(name: str, nbytes: int, samples: list[tuple[float, int]]) -> None:
    secs = [s for s, _ in samples]
    rss = max(r for _, r in samples)
    med = statistics.median(secs)
    print(f"{name}: ensure median {med * 1e3:7.1f} ms, min {min(secs) * 1e3:7.1f} ms, "
          f"{nbytes / med / 1e6:7.1f} MB/s, peak RSS {rss / 2**20:6.0f} MiB, n={len(secs)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--big-mib", type=int, default=512)
    ap.add_argument("--child", metavar="WS")
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    os.environ.setdefault("CORRAL_HOME", tempfile.mkdtemp(prefix="corral-bench-"))
    os.environ["CORRAL_MAX_COPY_SIZE"] = f"{args.big_mib * 2}MiB"
    with tempfile.TemporaryDirectory(prefix="corral-bench-ws-") as tmp:
        small, big, empty = Path(tmp, "small"), Path(tmp, "big"), Path(tmp, "empty")
        empty.mkdir()
        n_small = make_small_tree(small)
        n_big = make_big_file(big, args.big_mib)
        for name, ws, nbytes in (("empty dir             ", empty, 0),
                                 ("2000 files x 4 KiB    ", small, n_small),
                                 (f"1 file of {args.big_mib} MiB    ", big, n_big)):
            samples = [measure(ws) for _ in range(args.runs)]
            report(name, max(nbytes, 1), samples)


if __name__ == "__main__":
    main()
