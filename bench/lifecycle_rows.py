"""The local provider on every row of the reference's own bench, side by side with it.

The reference (``../shared/anchors/tanstack/bench.mjs``, TanStack ``@tanstack/ai-sandbox``
with its local-process provider) times, per row, 5 warm-up runs (thrown away) then N runs,
with linearly interpolated percentiles (numpy's default):

- ``time_to_interactive``: ``create``, then the first ``exec('true')`` (create + exec = time
  to interactive), then ``destroy`` of that sandbox: rows create, tti, destroy;
- ``exec_roundtrip``: ``exec('true')`` on a live sandbox;
- ``exec_50mb_stdout``: ``exec`` of a command printing 50 MiB (whole output checked);
- ``spawn_stream_lines``: ``spawn('seq 1 200000')``, time until the last line is read;
- ``fs_write_read_10mb``: ``fs.write`` then ``fs.read`` of 10 MiB of random bytes;
- ``setup_plan_5_serial``: a setup plan of 5 serial ``true`` on a live sandbox
  (corral: ``run_setup``; reference: ``bootstrapWorkspace``);
- ``ensure_with_setup_plan``: create + that plan through the sandbox definition's
  ``ensure`` (``Lifecycle(reuse="none")``, the default SQLite store), destroy not timed.

This script runs the same jobs with corral's local provider, in a worker per checkout (each
importing corral from its own ``src``), and the reference's own bench in the same session,
alternating whole runs (reference, A, B, reference, A, B ...) so all see the same load:

    python bench/lifecycle_rows.py --b . [--a ../old-checkout] [--reference DIR] \\
        [--rounds 3] [--n 50] [--warmup 5] [--json]

``--reference DIR`` is a copy of the reference's bench with ``npm install`` done. Per round
each side's p50 is printed; then the median over rounds of each p50, the ratio to the
reference per row, and (with ``--a``) the per-round ratio B/A.
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
import json, os, sys, time, anyio
from corral import Lifecycle, RunContext, Sandbox, Workspace
from corral.providers._local import LocalProvider
from corral.sandbox._redact import Redactor
from corral.sandbox._setup_shell import run_setup
from corral.sandbox._workspace import Step
from corral.stores import open_store

N, WARMUP = int(sys.argv[1]), int(sys.argv[2])
BIG = 50 * 1024 * 1024
BIG_CMD = f"head -c {BIG} /dev/zero | tr '\\0' 'a'"
LINES = 200_000
FS = os.urandom(10 * 1024 * 1024)
PLAN = [Step("true") for _ in range(5)]
now = time.perf_counter

async def repeat(fn, rows):
    for i in range(WARMUP + N):
        got = await fn()
        if i >= WARMUP:
            for k, v in got.items():
                rows.setdefault(k, []).append(v * 1e3)

async def main():
    p = LocalProvider()
    rows = {}

    async def lifecycle():
        a = now()
        h = await p.create()
        b = now()
        r = await h.process.exec("true")
        c = now()
        await p.destroy(h.ref)
        d = now()
        assert r.exit_code == 0 and not os.path.exists(h.state_dir), r
        return {"create_ms": b - a, "tti_ms": c - a, "destroy_ms": d - c}
    await repeat(lifecycle, rows)

    h = await p.create()

    async def exec_true():
        a = now()
        r = await h.process.exec("true")
        assert r.exit_code == 0, r
        return {"exec_ms": now() - a}
    await repeat(exec_true, rows)

    async def big():
        a = now()
        r = await h.process.exec(BIG_CMD)
        ms = now() - a
        assert r.exit_code == 0 and len(r.stdout) == BIG and not r.stdout.strip(b"a"), r.exit_code
        return {"stdout_50mib_ms": ms}
    await repeat(big, rows)

    async def stream():
        a = now()
        proc = await h.process.spawn(f"seq 1 {LINES}")
        lines, last, tail = 0, None, b""
        async with anyio.create_task_group() as tg:
            async def drain_err():
                async for _ in proc.stderr:
                    pass
            tg.start_soon(drain_err)
            async for chunk in proc.stdout:
                lines += chunk.count(b"\n")
                tail = (tail + chunk)[-16:]
                if lines == LINES and last is None:
                    last = now() - a
        r = await proc.wait()
        assert r.exit_code == 0 and lines == LINES and tail.endswith(b"\n%d\n" % LINES), r
        return {"stream_200k_ms": last}
    await repeat(stream, rows)

    async def fs_rw():
        a = now()
        await h.fs.write("/workspace/bench-blob.bin", FS)
        back = await h.fs.read("/workspace/bench-blob.bin")
        ms = now() - a
        assert back == FS
        return {"fs_10mib_ms": ms}
    await repeat(fs_rw, rows)

    async def plan():
        a = now()
        await run_setup(h, PLAN, env={}, redactor=Redactor({}))
        return {"setup_plan_ms": now() - a}
    await repeat(plan, rows)
    await p.destroy(h.ref)

    store = await open_store()
    sb = Sandbox(provider="local", workspace=Workspace(setup=["true"] * 5),
                 lifecycle=Lifecycle(reuse="none"))
    run = 0

    async def ensure():
        nonlocal run
        run += 1
        ctx = RunContext(thread_id="bench", run_id=f"r{run}")
        a = now()
        e = await sb.ensure(ctx, store=store)
        ms = now() - a
        assert os.path.isdir(e.handle.state_dir)
        await sb.destroy(ctx, store=store)
        return {"ensure_ms": ms}
    await repeat(ensure, rows)
    await store.aclose()
    print(json.dumps(rows))

anyio.run(main)
"""

ROWS = ("create_ms", "destroy_ms", "tti_ms", "exec_ms", "setup_plan_ms", "ensure_ms",
        "stdout_50mib_ms", "stream_200k_ms", "fs_10mib_ms")


def pct(xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default, as the reference)."""
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def run_corral(tree: Path, n: int, warmup: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, PYTHONPATH=str(tree / "src"), CORRAL_HOME=home)
        env.pop("CORRAL_STORE", None)
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
    return {
        "create_ms": tti["create_ms"]["p50"], "tti_ms": tti["tti_ms"]["p50"],
        "destroy_ms": tti["destroy_ms"]["p50"], "exec_ms": res["exec_roundtrip"]["ms"]["p50"],
        "setup_plan_ms": res["setup_plan_5_serial"]["ms"]["p50"],
        "ensure_ms": res["ensure_with_setup_plan"]["ms"]["p50"],
        "stdout_50mib_ms": res["exec_50mb_stdout"]["ms"]["p50"],
        "stream_200k_ms": res["spawn_stream_lines"]["last_line_ms"]["p50"],
        "fs_10mib_ms": res["fs_write_read_10mb"]["total_ms"]["p50"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", type=Path, help="checkout A (the baseline)")
    ap.add_argument("--b", type=Path, required=True, help="checkout B")
    ap.add_argument("--reference", type=Path, help="the reference's bench dir (npm installed)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="also print every round as JSON")
    args = ap.parse_args()
    sides: list[tuple[str, object]] = []
    if args.reference:
        sides.append(("ref", lambda: run_reference(args.reference, args.n, args.warmup)))
    if args.a:
        sides.append(("A", lambda: run_corral(args.a.resolve(), args.n, args.warmup)))
    sides.append(("B", lambda: run_corral(args.b.resolve(), args.n, args.warmup)))
    got: dict[str, list[dict[str, float]]] = {name: [] for name, _ in sides}
    loads: list[str] = []
    print(f"p50 per round (ms), n={args.n} after {args.warmup} warm-up runs, rounds alternate; "
          f"A = {args.a}, B = {args.b}")
    print(f"{'round side':<12}" + "".join(f"{k[:-3]:>14}" for k in ROWS) + "  load avg (1 min)")
    for r in range(args.rounds):
        for name, fn in sides:
            res = fn()  # type: ignore[operator]
            got[name].append(res)
            load = f"{os.getloadavg()[0]:.2f}"
            loads.append(load)
            print(f"{r + 1:<6}{name:<6}" + "".join(f"{res[k]:14.3f}" for k in ROWS) + f"  {load}",
                  flush=True)
    med = {name: {k: sorted(x[k] for x in rs)[len(rs) // 2] for k in ROWS} for name, rs in got.items()}
    print("median over rounds of the p50 (ms):")
    for name, m in med.items():
        print(f"{'':<6}{name:<6}" + "".join(f"{m[k]:14.3f}" for k in ROWS))
    for name in med:
        if name == "ref" or "ref" not in med:
            continue
        print(f"{name} / ref, per round, then of the medians:")
        for r in range(args.rounds):
            print(f"{r + 1:<12}" + "".join(
                f"{got[name][r][k] / got['ref'][r][k]:13.2f}x" for k in ROWS))
        print(f"{'medians':<12}" + "".join(f"{med[name][k] / med['ref'][k]:13.2f}x" for k in ROWS))
    if "A" in med:
        print("B / A, per round:")
        for r in range(args.rounds):
            print(f"{r + 1:<12}" + "".join(f"{got['B'][r][k] / got['A'][r][k]:13.2f}x" for k in ROWS))
    if args.json:
        print(json.dumps({"rounds": got, "load": loads}))


if __name__ == "__main__":
    main()
