"""The docker provider next to bare docker: time to interactive and exec round trip.

Time to interactive (TTI) is ``DockerProvider.create()`` then a first ``exec(["true"])``
(what a sandbox costs before it does anything), next to ``docker run --rm IMAGE true``.
The exec round trip is ``exec(["true"])`` in a live sandbox next to ``docker exec C true``
(the CLI, into an equally live container). Samples alternate (ours, bare, ours, ...) in one
run, so both see the same machine load; it prints medians, p90 and the paired ratios.

    python bench/docker_latency.py [--runs 15] [--image corral-base:<version>]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import anyio

from corral.providers._docker import DockerProvider


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def row(name: str, xs: list[float]) -> str:
    return f"{name:<34} median {statistics.median(xs) * 1e3:7.1f} ms   p90 {pct(xs, 0.9) * 1e3:7.1f} ms"


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--image", default=None)
    args = ap.parse_args()
    provider = DockerProvider(args.image)
    image = provider.image
    tti: list[float] = []
    bare_run: list[float] = []
    rtt: list[float] = []
    bare_exec: list[float] = []
    live = await provider.create()
    bare = subprocess.run(["docker", "run", "-d", "--rm", "--network", "none", image,
                           "sleep", "infinity"], capture_output=True, text=True, check=True)
    bare_id = bare.stdout.strip()
    try:
        await live.process.exec(["true"])  # warm: the first exec pays for page cache
        for _ in range(args.runs):
            t = time.perf_counter()
            h = await provider.create()
            r = await h.process.exec(["true"])
            tti.append(time.perf_counter() - t)
            assert r.ok, r
            await provider.destroy(h.ref)
            t = time.perf_counter()
            subprocess.run(["docker", "run", "--rm", "--network", "none", image, "true"],
                           check=True)
            bare_run.append(time.perf_counter() - t)
            for _ in range(3):
                t = time.perf_counter()
                r = await live.process.exec(["true"])
                rtt.append(time.perf_counter() - t)
                assert r.ok, r
                t = time.perf_counter()
                subprocess.run(["docker", "exec", bare_id, "true"], check=True)
                bare_exec.append(time.perf_counter() - t)
    finally:
        await provider.destroy(live.ref)
        subprocess.run(["docker", "rm", "-f", bare_id], capture_output=True, check=False)
    print(row("corral TTI (create + first exec)", tti))
    print(row("bare docker run --rm IMAGE true", bare_run))
    print(f"{'ratio TTI / docker run (medians)':<34} {statistics.median(tti) / statistics.median(bare_run):.2f}x (target <= 1.5x)")
    print(row("corral exec round trip", rtt))
    print(row("bare docker exec C true", bare_exec))
    print(f"{'ratio exec / docker exec (medians)':<34} {statistics.median(rtt) / statistics.median(bare_exec):.2f}x (target <= 1.3x)")


anyio.run(main)
