"""Two checkouts of corral side by side: bubblewrap create, exec round trip, destroy.

On a shared, noisy machine two benchmark runs taken minutes apart are not comparable. This
one keeps a worker process per checkout (each importing corral from its own ``src``) and
alternates them sample by sample (A B B A ...), so both see the same load; it prints each
side's percentiles and the paired ratio B/A.

``--script N`` adds #32's script rows, paired: the agent-like and the trivial mixes of
``sandbox_latency.py`` (N commands each, every command after a 50 ms pause), each command
run bare on the host (``subprocess.run``, in a git checkout of corral's sources), then by
A and B (alternating which goes first); the totals are of the commands' own times.

    python bench/ab_latency.py --a ../base-checkout --b . [--runs 200] [--script 200]

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
import time
from pathlib import Path

WORKER = r"""
import json, sys, time, anyio
from corral.providers._bubblewrap import BubblewrapProvider

async def main():
    p = BubblewrapProvider()
    h = await p.create()
    for line in sys.stdin:
        what, _, arg = line.strip().partition(" ")
        if what == "idle":  # an exec after 100 ms with nothing to do
            await anyio.sleep(0.1)
        elif what == "setup":  # a tar of the script's checkout into /workspace
            with open(arg, "rb") as fh:
                r = await h.process.exec(["tar", "-C", "/workspace", "-x"], stdin=fh.read())
            assert r.exit_code == 0, r
            print("[]", flush=True)
            continue
        elif what == "cmd":  # one command of a script, after its 50 ms pause
            await anyio.sleep(0.05)
        t = time.perf_counter()
        if what in ("exec", "idle"):
            r = await h.process.exec(["true"])
            assert r.exit_code == 0, r
        elif what == "cmd":
            r = await h.process.exec(json.loads(arg))
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
    print(f"  {name:<34} A p50 {pct(a, 50)*1e3:7.2f} ms  p90 {pct(a, 90)*1e3:7.2f} ms | "
          f"B p50 {pct(b, 50)*1e3:7.2f} ms  p90 {pct(b, 90)*1e3:7.2f} ms | "
          f"B/A paired p50 {statistics.median(ratios):.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", type=Path, required=True, help="checkout A (the baseline)")
    ap.add_argument("--b", type=Path, required=True, help="checkout B")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--script", type=int, default=0,
                    help="commands per script mix (0: no script rows)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as home_a, tempfile.TemporaryDirectory() as home_b:
        procs = {"A": worker(args.a.resolve(), Path(home_a)),
                 "B": worker(args.b.resolve(), Path(home_b))}
        samples: dict[str, dict[str, list[float]]] = {
            k: {"exec": [], "idle": [], "create": [], "destroy": []} for k in procs}
        totals: dict[str, dict[str, float]] = {}
        try:
            for i in range(args.runs):
                order = ("A", "B") if i % 2 == 0 else ("B", "A")
                for what in ("exec", "idle", "create"):
                    for k in order:
                        got = ask(procs[k], what)
                        if what == "create":
                            samples[k]["create"].append(got[0])
                            samples[k]["destroy"].append(got[1])
                        else:
                            samples[k][what].append(got[0])
            if args.script:
                totals = scripts(procs, args.script)
        finally:
            for proc in procs.values():
                assert proc.stdin is not None
                proc.stdin.close()
                proc.wait(timeout=60)
    print(f"A = {args.a}\nB = {args.b}\nruns: {args.runs}, alternating A B / B A")
    for name in ("exec", "idle", "create", "destroy"):
        label = "exec after 100 ms idle" if name == "idle" else name
        show(f"bubblewrap {label}", samples["A"][name], samples["B"][name])
    for mix, tot in totals.items():
        print(f"  {args.script}-command {mix} script, each after 50 ms (sum of the commands' "
              "times):")
        for k, total in tot.items():
            print(f"    {k:<5} {total * 1e3:8.1f} ms   {total / tot['host']:5.2f}x bare host")


def scripts(procs: dict[str, subprocess.Popen[str]], n: int) -> dict[str, dict[str, float]]:
    """The script rows (see the module docstring): totals per mix for host, A and B."""
    from sandbox_latency import SCRIPTS, _checkout

    totals: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="corral-bench-repo-") as tmp:
        repo = Path(tmp, "repo")
        _checkout(repo)
        tar = Path(tmp, "repo.tar")
        subprocess.run(["tar", "-C", str(repo), "-cf", str(tar), "."], check=True)
        for proc in procs.values():
            ask(proc, f"setup {tar}")
        for mix, script in SCRIPTS.items():
            tot = totals[mix] = {"host": 0.0, "A": 0.0, "B": 0.0}
            for i in range(n):
                cmd = script[i % len(script)]
                time.sleep(0.05)
                t = time.perf_counter()
                subprocess.run(cmd, capture_output=True, check=True, cwd=repo)
                tot["host"] += time.perf_counter() - t
                for k in (("A", "B") if i % 2 == 0 else ("B", "A")):
                    tot[k] += ask(procs[k], "cmd " + json.dumps(cmd))[0]
    return totals


if __name__ == "__main__":
    main()
