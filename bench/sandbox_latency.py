"""Sandbox latency: create -> first exec (time to interactive), exec round trip, destroy.

For each provider, plus the bare baselines in the same run: ``subprocess`` running
``true``, and ``bwrap`` with the same binds running ``true`` (as the same host uid).
The machine is shared, so every provider sample is taken right after a baseline sample
(interleaved), and the overheads are computed per pair.

    PYTHONPATH=src python bench/sandbox_latency.py [--runs 100]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable

import anyio

from corral.providers._bubblewrap import BubblewrapHandle, BubblewrapProvider
from corral.providers._local import LocalProvider
from corral.sandbox._contracts import Provider


def pct(samples: list[float], p: float) -> float:
    s = sorted(samples)
    k = min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))
    return s[k] * 1000


def show(name: str, samples: list[float]) -> None:
    if "ratio" in name:  # a plain ratio, not seconds
        print(f"  {name:<34} p50 {pct(samples, 50) / 1000:7.2f} x    p99 {pct(samples, 99) / 1000:7.2f} x")
        return
    print(f"  {name:<34} p50 {pct(samples, 50):7.2f} ms   p99 {pct(samples, 99):7.2f} ms   "
          f"mean {statistics.mean(samples) * 1000:7.2f} ms   n={len(samples)}")


def timed(fn: Callable[[], object], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


async def bench_provider(
    provider: Provider, runs: int, bare: Callable[[], object]
) -> dict[str, list[float]]:
    tti: list[float] = []
    create: list[float] = []
    rtt: list[float] = []
    destroy: list[float] = []
    bare_s: list[float] = []
    tti_over: list[float] = []
    rtt_over: list[float] = []
    for _ in range(runs):
        b = timed(bare, 1)[0]
        t0 = time.perf_counter()
        h = await provider.create()
        t1 = time.perf_counter()
        r = await h.process.exec(["true"])
        t2 = time.perf_counter()
        assert r.ok, r
        create.append(t1 - t0)
        tti.append(t2 - t0)
        bare_s.append(b)
        tti_over.append((t2 - t0) / b)
        t3 = time.perf_counter()
        await provider.destroy(h.ref)
        destroy.append(time.perf_counter() - t3)
    h = await provider.create()
    try:
        for _ in range(runs):
            b = timed(bare, 1)[0]
            t = time.perf_counter()
            r = await h.process.exec(["true"])
            d = time.perf_counter() - t
            rtt.append(d)
            rtt_over.append(d - b)
            assert r.ok, r
    finally:
        await provider.destroy(h.ref)
    return {"create": create, "time to interactive (create+exec)": tti,
            "  TTI / bare bwrap (ratio)": tti_over,
            "exec round trip (true)": rtt, "  exec minus bare bwrap (paired)": rtt_over,
            "destroy": destroy}


async def bare_bwrap_argv(provider: BubblewrapProvider) -> tuple[list[str], int | None, object]:
    h = await provider.create()
    assert isinstance(h, BubblewrapHandle)
    argv = [*h._bwrap, "--chdir", "/workspace", "--", "true"]
    return argv, h.state.host_uid, h


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as home:
        os.environ["CORRAL_HOME"] = home
        print(f"runs per measurement: {runs}")
        print("baselines:")
        show("subprocess.run(['true'])", timed(lambda: subprocess.run(["true"], check=True), runs))
        bw = BubblewrapProvider()
        argv, uid, h = await bare_bwrap_argv(bw)
        try:
            def bare() -> None:
                subprocess.run(argv, check=True, user=uid, group=uid, extra_groups=[] if uid else None)

            show("bare bwrap, same binds, true", timed(bare, runs))
            for name, provider in (("local", LocalProvider()), ("bubblewrap", bw)):
                print(f"{name} (baseline for ratios: bare bwrap):")
                for label, samples in (await bench_provider(provider, runs, bare)).items():
                    show(label, samples)
        finally:
            await bw.destroy(h.ref)  # type: ignore[attr-defined]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=100)
    anyio.run(main, ap.parse_args().runs)
