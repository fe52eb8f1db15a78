"""Exec round trip of ``true`` on a live local sandbox after an idle gap.

Moving a process into a cgroup v2 group (a write to ``cgroup.procs``) takes a global lock
which, when no migration happened recently, first waits for an RCU grace period; a tight
loop of moves pays it once, a move after a pause pays it every time. The local provider
used to move each command into its sandbox's group; it now starts them inside it
(``clone3(CLONE_INTO_CGROUP)``, #32) and moves only where that cannot work. This script
shows the exec round trip p50 per gap, and the bare write to ``cgroup.procs`` of a just
started ``sleep`` (no corral code), alternating gaps per sample:

    python bench/exec_after_idle.py [--n 30] [--gaps 0,5,20,100]

``--bubblewrap`` does the same for bubblewrap's two ways of starting a command (#32),
sample by sample: the launcher chain (a cgroup move per command) and the sandbox's agent
(none); ``exec`` of ``true`` per gap, p50, and the agent's p50 minus its back-to-back p50.

    python bench/exec_after_idle.py --bubblewrap [--n 30] [--gaps 0,100]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time

import anyio


async def bubblewrap(n: int, gaps: list[float]) -> None:
    from corral.providers._bubblewrap import BubblewrapProvider

    old, new = BubblewrapProvider(agent=False), BubblewrapProvider()
    handles = {"launcher": await old.create(), "agent": await new.create()}
    ms: dict[tuple[str, float], list[float]] = {(p, g): [] for p in handles for g in gaps}
    try:
        for h in handles.values():
            assert (await h.process.exec("true")).ok
        for i in range(n):
            for gap in gaps[i % len(gaps):] + gaps[:i % len(gaps)]:
                for path, h in handles.items():
                    await anyio.sleep(gap)
                    a = time.perf_counter()
                    r = await h.process.exec(["true"])
                    ms[(path, gap)].append((time.perf_counter() - a) * 1e3)
                    assert r.ok, r
    finally:
        for h in handles.values():
            await old.destroy(h.ref)
    print(f"bubblewrap, p50 over {n} samples per gap and path (gaps alternate); load average "
          f"{os.getloadavg()[0]:.2f}")
    base = statistics.median(ms[("agent", gaps[0])])
    for gap in gaps:
        agent = statistics.median(ms[("agent", gap)])
        print(f"  idle {gap * 1e3:5.0f} ms: launcher {statistics.median(ms[('launcher', gap)]):7.2f}"
              f" ms   agent {agent:7.2f} ms   agent minus its {gaps[0] * 1e3:.0f} ms gap "
              f"{agent - base:+6.2f} ms")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--gaps", default="0,5,20,100", help="idle gaps in ms, comma-separated")
    ap.add_argument("--bubblewrap", action="store_true",
                    help="bubblewrap's launcher chain vs its agent (#32)")
    args = ap.parse_args()
    gaps = [float(g) / 1e3 for g in args.gaps.split(",")]
    if args.bubblewrap:
        with tempfile.TemporaryDirectory() as home:
            os.environ["CORRAL_HOME"] = home
            await bubblewrap(args.n, gaps)
        return
    with tempfile.TemporaryDirectory() as home:
        os.environ["CORRAL_HOME"] = home
        from corral.providers import _cgroups as cgroups
        from corral.providers._local import LocalProvider

        p = LocalProvider()
        h = await p.create()
        parent = cgroups.v2_parent()
        bare = f"{parent}/bench-idle-{os.getpid()}" if parent else None
        if bare:
            os.mkdir(bare)
        exec_ms: dict[float, list[float]] = {g: [] for g in gaps}
        join_ms: dict[float, list[float]] = {g: [] for g in gaps}
        try:
            for i in range(args.n):
                for gap in gaps[i % len(gaps):] + gaps[:i % len(gaps)]:
                    await anyio.sleep(gap)
                    a = time.perf_counter()
                    r = await h.process.exec("true")
                    exec_ms[gap].append((time.perf_counter() - a) * 1e3)
                    assert r.ok, r
                    if bare:
                        sleeper = subprocess.Popen(["sleep", "1"])
                        await anyio.sleep(gap)
                        a = time.perf_counter()
                        with open(f"{bare}/cgroup.procs", "w") as fh:
                            fh.write(str(sleeper.pid))
                        join_ms[gap].append((time.perf_counter() - a) * 1e3)
                        sleeper.kill()
                        sleeper.wait()
        finally:
            await p.destroy(h.ref)
            if bare:
                os.rmdir(bare)
        print(f"p50 over {args.n} samples per gap (gaps alternate); load average "
              f"{os.getloadavg()[0]:.2f}")
        for gap in gaps:
            join = f"{statistics.median(join_ms[gap]):7.2f} ms" if bare else "n/a"
            print(f"  idle {gap * 1e3:5.0f} ms: exec('true') {statistics.median(exec_ms[gap]):7.2f}"
                  f" ms   bare cgroup.procs write {join}")


if __name__ == "__main__":
    anyio.run(main)
