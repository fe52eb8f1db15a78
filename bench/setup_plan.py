"""Setup plan latency (issue #17): a plan of 5 serial ``true`` steps, and ``ensure``.

Rows, per provider (local, bubblewrap):
- ``exec true``: one ``process.exec(["true"])`` on a live sandbox (the exec round trip);
- ``setup plan 5 serial true``: ``run_setup`` on a live sandbox (what the reference's
  ``bootstrapWorkspace`` times);
- ``ensure (create+plan)``: ``Sandbox(..., workspace=Workspace(setup=[5 x "true"]),
  lifecycle=Lifecycle(reuse="none")).ensure()`` with a SQLite store; destroy not timed;
plus the baselines ``bare bwrap, one sh, 5 x true``: one ``bwrap`` with the sandbox's binds
running ``sh -c 'true; true; true; true; true'`` (for the plan), and ``bare bwrap, true``
(for the exec), each as the sandbox's host uid (without the C init's bind, where a
checkout has one: bare bwrap runs no init).

With ``--a OLD --b NEW`` (two checkouts) a worker per checkout imports corral from its own
``src``, and the workers alternate sample by sample (A B B A ...), so both see the same
load; each row prints both sides and the paired ratio B/A. With ``--b`` only, one side.
A bare-bwrap baseline is sampled right before every bubblewrap sample (paired ratio and,
for the exec, paired difference ``side-bare``).

    python bench/setup_plan.py --a /tmp/old --b . [--runs 50] [--json]
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
import json, os, subprocess, sys, time, anyio
from corral import Lifecycle, RunContext, Sandbox, Workspace
from corral.providers._bubblewrap import BubblewrapProvider
from corral.providers._local import LocalProvider
from corral.sandbox._redact import Redactor
from corral.sandbox._setup_shell import run_setup
from corral.sandbox._workspace import Step
from corral.stores import open_store

PLAN = [Step("true") for _ in range(5)]

async def main():
    store = await open_store()
    providers = {"local": LocalProvider(), "bubblewrap": BubblewrapProvider()}
    live = {n: await p.create() for n, p in providers.items()}
    bw = live["bubblewrap"]
    # The sandbox's options without the C init's bind (bare bwrap runs no init).
    opts = list(bw._bwrap)
    for i in range(len(opts) - 2):
        if opts[i] == "--ro-bind" and opts[i + 2] == "/run/corral-init":
            del opts[i:i + 3]
            break
    bare = [*opts, "--", "sh", "-c", "true; true; true; true; true"]
    bare_true = [*opts, "--", "true"]
    uid = bw.state.host_uid
    sandboxes = {n: Sandbox(provider=n, workspace=Workspace(setup=["true"] * 5),
                            lifecycle=Lifecycle(reuse="none")) for n in providers}
    run = 0
    for line in sys.stdin:
        what = line.strip()
        if what in ("bare", "bare-true"):
            t = time.perf_counter()
            subprocess.run(bare if what == "bare" else bare_true, check=True,
                           user=uid, group=uid, extra_groups=[] if uid else None)
        elif what.startswith("exec:"):
            h = live[what[5:]]
            t = time.perf_counter()
            r = await h.process.exec(["true"])
            assert r.ok, r
        elif what.startswith("plan:"):
            h = live[what[5:]]
            t = time.perf_counter()
            await run_setup(h, PLAN, env={}, redactor=Redactor({}))
        elif what.startswith("ensure:"):
            run += 1
            ctx = RunContext(thread_id="bench", run_id=f"r{run}")
            sb = sandboxes[what[7:]]
            t = time.perf_counter()
            await sb.ensure(ctx, store=store)
            d = time.perf_counter() - t
            await sb.destroy(ctx, store=store)
            print(json.dumps(d), flush=True)
            continue
        else:
            break
        print(json.dumps(time.perf_counter() - t), flush=True)
    for n, h in live.items():
        await providers[n].destroy(h.ref)
    await store.aclose()

anyio.run(main)
"""

ROWS = (
    ("exec true", "exec"),
    ("setup plan 5 serial true", "plan"),
    ("ensure (create+plan)", "ensure"),
)
# The bare-bwrap baseline sampled before each bubblewrap sample: (worker op, row name).
BARE = {"exec": ("bare-true", "bare bwrap, true"), "plan": ("bare", "bare bwrap, one sh, 5 x true")}


def worker(tree: Path, home: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), CORRAL_HOME=str(home))
    return subprocess.Popen([sys.executable, "-c", WORKER], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def ask(proc: subprocess.Popen[str], what: str) -> float:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(what + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"worker died on {what!r}")
    return float(json.loads(line))


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)  # linear interpolation, as numpy and the reference's bench.mjs
    pos = (len(s) - 1) * p / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def stats(xs: list[float], scale: float = 1000.0) -> dict[str, float]:
    return {"p50": round(pct(xs, 50) * scale, 3), "p90": round(pct(xs, 90) * scale, 3),
            "mean": round(statistics.mean(xs) * scale, 3), "n": len(xs)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", type=Path, help="the old checkout (optional)")
    ap.add_argument("--b", type=Path, default=Path("."), help="the new checkout")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sides = {"b": args.b.resolve()} | ({"a": args.a.resolve()} if args.a else {})
    results: dict[str, dict[str, list[float]]] = {}
    load0 = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        procs = {k: worker(tree, Path(tmp) / k) for k, tree in sides.items()}
        for d in sides:
            (Path(tmp) / d).mkdir(exist_ok=True)
        try:
            order = sorted(procs)
            for provider in ("local", "bubblewrap"):
                for label, op in ROWS:
                    row = f"{provider}: {label}"
                    for i in range(args.warmup + args.runs):
                        sample: dict[str, float] = {}
                        for side in (order if i % 2 == 0 else order[::-1]):
                            if provider == "bubblewrap" and op in BARE:
                                sample[f"bare:{side}"] = ask(procs[side], BARE[op][0])
                            sample[side] = ask(procs[side], f"{op}:{provider}")
                        if i < args.warmup:
                            continue
                        for key, v in sample.items():
                            name = BARE[op][1] if key.startswith("bare") else row
                            side = key.rsplit(":", 1)[-1]
                            results.setdefault(name, {}).setdefault(side, []).append(v)
                        if "a" in sample:
                            results[row].setdefault("b/a", []).append(sample["b"] / sample["a"])
                        if f"bare:{order[0]}" in sample:
                            for side in order:
                                results[row].setdefault(f"{side}/bare", []).append(
                                    sample[side] / sample[f"bare:{side}"])
                                if op == "exec":
                                    results[row].setdefault(f"{side}-bare", []).append(
                                        sample[side] - sample[f"bare:{side}"])
        finally:
            for p in procs.values():
                assert p.stdin is not None
                p.stdin.write("quit\n")
                p.stdin.close()
                p.wait(timeout=60)
    out = {row: {k: stats(v, 1.0 if "/" in k else 1000.0) for k, v in by.items()}
           for row, by in results.items()}
    load1 = round(os.getloadavg()[0], 2)
    if args.json:
        print(json.dumps({**out, "load average (1 min) at start, end": [load0, load1]}, indent=1))
        return
    print(f"runs {args.runs} (+{args.warmup} warm-up); a = {sides.get('a')}, b = {sides['b']}; "
          f"load {load0} -> {load1}")
    for row, by in out.items():
        print(row)
        for k, s in by.items():
            unit = "x " if "/" in k else "ms"
            print(f"  {k:<8} p50 {s['p50']:8.3f} {unit}  p90 {s['p90']:8.3f} {unit}  "
                  f"mean {s['mean']:8.3f} {unit}  n={s['n']}")


if __name__ == "__main__":
    main()
