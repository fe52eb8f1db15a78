"""Sandbox latency: create -> first exec (time to interactive), exec round trip, destroy.

For each provider, plus the bare baselines in the same run: ``subprocess`` running
``true``, and ``bwrap`` with the same binds running ``true`` (as the same host uid).
The machine is shared, so every provider sample is taken right after a baseline sample
(interleaved), and the overheads are computed per pair.

``--paths`` compares bubblewrap's two ways of starting a command in one run, sample by
sample (#32): the launcher chain per command (``agent = false``) and the sandbox's agent.
Rows: exec round trip, exec after 100 ms idle, time to interactive, and an agent-like
script (200 short commands, each after a 50 ms pause) against the same commands run
bare on the host (``subprocess.run``), summing only the commands' own times.

    PYTHONPATH=src python bench/sandbox_latency.py [--runs 100] [--paths]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

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


# The agent-like scripts: what a coding agent runs between model turns, in a checkout of
# corral's own sources (a git repository): "agent" as an agent does, and "trivial" (the
# smallest commands, where the start-up is all there is).
SCRIPTS = {
    "agent": [["git", "status", "--short"], ["git", "log", "--oneline", "-3"],
              ["grep", "-rn", "--include=*.py", "-c", "def ", "src"],
              ["python3", "-c", "import json; print(json.dumps({'ok': 1}))"],
              ["find", ".", "-name", "*.py"], ["sed", "-n", "1,40p", "src/corral/__init__.py"],
              ["ls", "-la", "src/corral"], ["wc", "-l", "src/corral/providers/_bubblewrap.py"],
              ["cat", "pyproject.toml"], ["git", "diff", "--stat"]],
    "trivial": [["true"], ["ls", "-la", "/etc"], ["cat", "/etc/os-release"],
                ["sh", "-c", "echo hi | wc -c"], ["grep", "-c", "root", "/etc/passwd"]],
}
_GIT_ENV = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@example.com",
            "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@example.com"}


def _checkout(dest: Path) -> None:
    """A git repository holding corral's src/ and pyproject.toml at ``dest``."""
    here = Path(__file__).resolve().parents[1]
    shutil.copytree(here / "src", dest / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(here / "pyproject.toml", dest / "pyproject.toml")
    env = {**os.environ, **_GIT_ENV}
    for argv in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "x"]):
        subprocess.run(argv, cwd=dest, env=env, check=True, capture_output=True)


async def bench_paths(runs: int, script_len: int) -> None:
    """Launcher chain vs agent, interleaved sample by sample, with bare bwrap / bare host."""
    old, new = BubblewrapProvider(agent=False), BubblewrapProvider()
    argv, uid, bh = await bare_bwrap_argv(old)

    def bare() -> None:
        subprocess.run(argv, check=True, user=uid, group=uid, extra_groups=[] if uid else None,
                       stderr=subprocess.DEVNULL)

    rows: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        rows.setdefault(name, []).append(value)

    ho, hn = await old.create(), await new.create()
    try:
        assert new.command_path()[0] == "agent", new.command_path()
        await hn.process.exec(["true"])  # the agent is up
        for _ in range(runs):
            b = timed(bare, 1)[0]
            samples = {}
            for label, h in (("launcher", ho), ("agent", hn)):
                t = time.perf_counter()
                r = await h.process.exec(["true"])
                samples[label] = time.perf_counter() - t
                assert r.ok, r
                add(f"exec round trip, {label}", samples[label])
            add("bare bwrap true", b)
            add("  exec agent / launcher (ratio)", samples["agent"] / samples["launcher"])
            add("  exec agent / bare bwrap (ratio)", samples["agent"] / b)
            for label, h in (("launcher", ho), ("agent", hn)):
                await anyio.sleep(0.1)
                t = time.perf_counter()
                r = await h.process.exec(["true"])
                samples[f"idle {label}"] = time.perf_counter() - t
                add(f"exec after 100 ms idle, {label}", samples[f"idle {label}"])
            add("  agent: after idle minus back-to-back", samples["idle agent"] - samples["agent"])
            tti = {}
            for label, p in (("launcher", old), ("agent", new)):
                t = time.perf_counter()
                h = await p.create()
                r = await h.process.exec(["true"])
                tti[label] = time.perf_counter() - t
                assert r.ok, r
                await p.destroy(h.ref)
                add(f"time to interactive, {label}", tti[label])
            add("  TTI agent / launcher (ratio)", tti["agent"] / tti["launcher"])
        # The agent-like scripts: per command, bare host then launcher then agent, each
        # after a 50 ms pause; the totals are of the commands' own round trips.
        host_dir = Path(tempfile.mkdtemp(prefix="corral-bench-repo-"))
        _checkout(host_dir)
        tar = subprocess.run(["tar", "-C", str(host_dir), "-c", "."], capture_output=True,
                             check=True).stdout
        for h in (ho, hn):
            r = await h.process.exec(["tar", "-C", "/workspace", "-x"], stdin=tar)
            assert r.ok, r
        totals: dict[str, dict[str, float]] = {}
        for mix, script in SCRIPTS.items():
            tot = totals[mix] = {"host": 0.0, "launcher": 0.0, "agent": 0.0}
            for i in range(script_len):
                cmd = script[i % len(script)]
                await anyio.sleep(0.05)
                t = time.perf_counter()
                subprocess.run(cmd, capture_output=True, check=True, cwd=host_dir)
                tot["host"] += time.perf_counter() - t
                for label, h in (("launcher", ho), ("agent", hn)):
                    await anyio.sleep(0.05)
                    t = time.perf_counter()
                    r = await h.process.exec(cmd)
                    tot[label] += time.perf_counter() - t
                    assert r.ok, r
        shutil.rmtree(host_dir)
    finally:
        for ref in (ho.ref, hn.ref, bh.ref):  # type: ignore[attr-defined]
            await old.destroy(ref)
    print(f"bubblewrap: launcher chain vs agent, interleaved, {runs} runs; load average "
          f"{os.getloadavg()[0]:.2f}")
    for label, values in rows.items():
        if "minus" in label:
            print(f"  {label:<42} p50 {pct(values, 50):7.2f} ms")
        else:
            show(label, values)
    for mix, tot in totals.items():
        print(f"  {script_len}-command {mix} script, each after 50 ms (sum of the commands' "
              "times):")
        for label, total in tot.items():
            print(f"    {label:<10} {total * 1e3:8.1f} ms   {total / tot['host']:5.2f}x bare host")


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
    ap.add_argument("--paths", action="store_true",
                    help="bubblewrap's launcher chain vs its agent, paired (#32)")
    ap.add_argument("--script", type=int, default=200, help="commands in the --paths script")
    a = ap.parse_args()
    if a.paths:
        with tempfile.TemporaryDirectory(prefix="corral-bench-") as home:
            os.environ["CORRAL_HOME"] = home
            anyio.run(bench_paths, a.runs, a.script)
    else:
        anyio.run(main, a.runs)
