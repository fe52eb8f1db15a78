"""Local provider create / time to interactive / destroy, as rows of the reference's bench.

The reference (``../shared/anchors/tanstack/bench.mjs``) times, per run: ``create``, then
the first ``exec('true')`` (create + exec = time to interactive), then ``destroy`` of that
sandbox; 5 warm-up runs are thrown away, then N runs; percentiles are linearly interpolated
(numpy's default). This script does the same for corral's local provider, in a worker per
checkout (each importing corral from its own ``src``), and can run the reference's own
bench in the same session, alternating rounds (reference, A, B, reference, A, B ...) so all
see the same load:

    python bench/lifecycle_rows.py --b . [--a ../old-checkout] [--reference DIR] \\
        [--rounds 3] [--n 50] [--warmup 5]

``--reference DIR`` is a copy of the reference's bench with ``npm install`` done; its
``time_to_interactive`` row gives create_ms / tti_ms / destroy_ms. The exec round trip of
``true`` on a live sandbox is reported too (the reference's ``exec_roundtrip`` row), to show
that joining the sandbox's cgroup costs the exec path little.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = r"""
import json, sys, time, anyio
from corral.providers._local import LocalProvider

N, WARMUP = int(sys.argv[1]), int(sys.argv[2])

async def main():
    p = LocalProvider()
    rows = {"create_ms": [], "tti_ms": [], "destroy_ms": [], "exec_ms": []}
    for i in range(WARMUP + N):
        a = time.perf_counter()
        h = await p.create()
        b = time.perf_counter()
        r = await h.process.exec("true")
        c = time.perf_counter()
        await p.destroy(h.ref)
        d = time.perf_counter()
        assert r.exit_code == 0, r
        if i >= WARMUP:
            rows["create_ms"].append((b - a) * 1e3)
            rows["tti_ms"].append((c - a) * 1e3)
            rows["destroy_ms"].append((d - c) * 1e3)
    h = await p.create()
    for i in range(WARMUP + N):
        a = time.perf_counter()
        r = await h.process.exec("true")
        if i >= WARMUP:
            rows["exec_ms"].append((time.perf_counter() - a) * 1e3)
    await p.destroy(h.ref)
    print(json.dumps(rows))

anyio.run(main)
"""

ROWS = ("create_ms", "tti_ms", "destroy_ms", "exec_ms")


def pct(xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default, as the reference)."""
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def run_corral(tree: Path, n: int, warmup: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, PYTHONPATH=str(tree / "src"), CORRAL_HOME=home)
        out = subprocess.run([sys.executable, "-c", WORKER, str(n), str(warmup)], env=env,
                             check=True, capture_output=True, text=True).stdout
    rows: dict[str, list[float]] = json.loads(out)
    return {k: pct(v, 0.5) for k, v in rows.items()}


def run_reference(directory: Path, n: int, warmup: int) -> dict[str, float]:
    out = subprocess.run(["node", "bench.mjs", "--json", "--n", str(n), "--warmup", str(warmup)],
                         cwd=directory, check=True, capture_output=True, text=True).stdout
    res = json.loads(out)
    res = res.get("results", res)
    tti = res["time_to_interactive"]
    return {"create_ms": tti["create_ms"]["p50"], "tti_ms": tti["tti_ms"]["p50"],
            "destroy_ms": tti["destroy_ms"]["p50"], "exec_ms": res["exec_roundtrip"]["ms"]["p50"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", type=Path, help="checkout A (the baseline)")
    ap.add_argument("--b", type=Path, required=True, help="checkout B")
    ap.add_argument("--reference", type=Path, help="the reference's bench dir (npm installed)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    sides: list[tuple[str, object]] = []
    if args.reference:
        sides.append(("reference", lambda: run_reference(args.reference, args.n, args.warmup)))
    if args.a:
        sides.append(("A " + str(args.a), lambda: run_corral(args.a, args.n, args.warmup)))
    sides.append(("B " + str(args.b), lambda: run_corral(args.b, args.n, args.warmup)))
    got: dict[str, list[dict[str, float]]] = {name: [] for name, _ in sides}
    print(f"p50 per round (ms), n={args.n} after {args.warmup} warm-up runs, rounds alternate")
    for r in range(args.rounds):
        for name, fn in sides:
            res = fn()  # type: ignore[operator]
            got[name].append(res)
            print(f"  round {r + 1} {name:<28} " + "  ".join(f"{k} {res[k]:6.3f}" for k in ROWS),
                  flush=True)
    print("median of the rounds' p50 (ms):")
    med = {name: {k: sorted(x[k] for x in rs)[len(rs) // 2] for k in ROWS} for name, rs in got.items()}
    for name, m in med.items():
        line = f"  {name:<30} " + "  ".join(f"{k} {m[k]:6.3f}" for k in ROWS)
        if args.reference and name != "reference":
            ref = med["reference"]
            line += "   vs reference: " + "  ".join(f"{k[:-3]} {m[k] / ref[k]:.2f}x" for k in ROWS)
        print(line)


if __name__ == "__main__":
    main()
