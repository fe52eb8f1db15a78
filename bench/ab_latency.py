"""Two checkouts of corral side by side: bubblewrap create, exec round trip, destroy.

On a shared, noisy machine two benchmark runs taken minutes apart are not comparable. This
one keeps a worker process per checkout (each importing corral from its own ``src``) and
alternates them sample by sample (A B B A ...), so both see the same load; it prints each
side's percentiles and the paired ratio B/A.

    python bench/ab_latency.py --a ../base-checkout --b . [--runs 200]

(``git worktree add ../base-checkout <commit>`` makes a checkout of an older commit.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = r"""
import json, sys, time, anyio
from corral.providers._bubblewrap import BubblewrapProvider

async def main():
    p = BubblewrapProvider()
    h = await p.create()
    for line in sys.stdin:
        what = line.strip()
        t = time.perf_counter()
        if what == "exec":
            r = await h.process.exec(["true"])
            assert r.exit_code == 0, r
        elif what == "create":
            made = await p.create()
            t2 = time.perf_counter()
            await p.destroy(made.ref)
            print(json.dumps([t2 - t, time.perf_counter() - t2]), flush=True)
            continue
        else:
            break
        print(json.dumps([time.perf_counter() - t]), flush=True)
    await p.destroy(h.ref)

anyio.run(main)
"""


def worker(tree: Path, home: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), CORRAL_HOME=str(home))
    return subprocess.Popen([sys.executable, "-c", WORKER], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def ask(proc: subprocess.Popen[str], what: str) -> list[float]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(what + "\n")
    proc.stdin.flush()
    out: list[float] = json.loads(proc.stdout.readline())
    return out


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def show(name: str, a: list[float], b: list[float]) -> None:
    ratios = [y / x for x, y in zip(a, b, strict=True) if x > 0]
    print(f"  {name:<22} A p50 {pct(a, 50)*1e3:7.2f} ms  p90 {pct(a, 90)*1e3:7.2f} ms | "
          f"B p50 {pct(b, 50)*1e3:7.2f} ms  p90 {pct(b, 90)*1e3:7.2f} ms | "
          f"B/A paired p50 {statistics.median(ratios):.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", type=Path, required=True, help="checkout A (the baseline)")
    ap.add_argument("--b", type=Path, required=True, help="checkout B")
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as home_a, tempfile.TemporaryDirectory() as home_b:
        procs = {"A": worker(args.a.resolve(), Path(home_a)),
                 "B": worker(args.b.resolve(), Path(home_b))}
        samples: dict[str, dict[str, list[float]]] = {
            k: {"exec": [], "create": [], "destroy": []} for k in procs}
        try:
            for i in range(args.runs):
                order = ("A", "B") if i % 2 == 0 else ("B", "A")
                for what in ("exec", "create"):
                    for k in order:
                        got = ask(procs[k], what)
                        if what == "exec":
                            samples[k]["exec"].append(got[0])
                        else:
                            samples[k]["create"].append(got[0])
                            samples[k]["destroy"].append(got[1])
        finally:
            for proc in procs.values():
                assert proc.stdin is not None
                proc.stdin.close()
                proc.wait(timeout=60)
    print(f"A = {args.a}\nB = {args.b}\nruns: {args.runs}, alternating A B / B A")
    for name in ("exec", "create", "destroy"):
        show(f"bubblewrap {name}", samples["A"][name], samples["B"][name])


if __name__ == "__main__":
    main()
