"""CLI start-up, two checkouts side by side (issue #17): ``corral --version``, ``corral ls`` on a
100-run SQLite store, a command's help and usage error, ``corral completion bash``, and
SIGKILL of a driver -> the first event from a new ``corral attach``.

    python bench/cli_start.py --a ../old-checkout --b . [--n 40] [--kills 12]
        [--provider bubblewrap|local]

Every sample is a fresh ``python -m corral`` process (PYTHONPATH=<checkout>/src), timed from
spawn to exit (``--version``, ``ls``, ``run --help``, ``run --no-such-option`` (exit 2),
``completion bash``); the two checkouts alternate sample by sample (A B B A ...), so both
see the same load on a shared machine. ``--kills 0`` skips the takeovers. Takeover: ``corral run`` (the driver)
streams a ticking command's events (``--json``, one line per event); after 20 events it is
SIGKILLed and a new ``corral attach RUN --after LAST --json`` starts at once; the time is
SIGKILL -> attach's first line (as in bench/run_latency.py). That first event was either
already in the store when the driver died (logged, not yet read by us: the attach replays it)
or is logged by attach's takeover of the run; the split is printed. Prints p50/p90 per side
and the paired ratio B/A of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TICKER = "i=0; while [ $i -lt 400 ]; do echo tick $i; i=$((i+1)); sleep 0.02; done"
STATUSES = ("completed", "failed", "aborted", "interrupted", "running")

MAKE_STORE = r"""
import sys, time, anyio
from corral.stores import open_store
from corral.stores._protocols import NewRun
from corral.stores._records import RunStatus

async def main(url):
    store = await open_store(url)
    now = time.time()
    statuses = [RunStatus(s) for s in sys.argv[2].split(",")]
    for i in range(100):
        run = NewRun(run_id=f"run-{i:03d}", thread_id=f"thread-{i % 7}",
                     started_at=now - 3600 + 30 * i, status=statuses[i % len(statuses)],
                     harness="command", spec={"argv": ["echo", str(i)]})
        await store.create(run)
    await store.aclose()

anyio.run(main, sys.argv[1])
"""


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


class Side:
    def __init__(self, label: str, tree: Path, root: Path) -> None:
        self.label, self.tree = label, tree.resolve()
        self.home = root / label
        self.home.mkdir()
        self.env = dict(os.environ, PYTHONPATH=str(self.tree / "src"),
                        CORRAL_HOME=str(self.home), CORRAL_LEASE_TTL="10",
                        CORRAL_STORE=f"sqlite://{self.home}/runs.db")
        self.version: list[float] = []
        self.ls: list[float] = []
        self.help: list[float] = []
        self.usage: list[float] = []
        self.completion: list[float] = []
        self.takeover: list[float] = []
        self.replayed = 0

    def corral(self, *args: str, store: str | None = None, **kw: object
               ) -> subprocess.Popen[str]:
        env = dict(self.env, **({"CORRAL_STORE": store} if store else {}))
        return subprocess.Popen([sys.executable, "-m", "corral", *args], env=env, text=True,
                                **kw)  # type: ignore[call-overload]

    def timed(self, *args: str, store: str | None = None, code: int = 0) -> float:
        t = time.perf_counter()
        proc = self.corral(*args, store=store, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE)
        _, err = proc.communicate()
        took = (time.perf_counter() - t) * 1000
        assert proc.returncode == code, (self.label, args, err)
        return took

    def kill_and_attach(self, k: int, provider: str) -> None:
        run_id = f"take-{k}"
        proc = self.corral("run", "--provider", provider, "--run-id", run_id, "--json", "--",
                           "sh", "-c", TICKER, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL)
        assert proc.stdout is not None
        last = 0
        for _ in range(20):
            last = json.loads(proc.stdout.readline())["offset"]
        proc.send_signal(signal.SIGKILL)
        killed = time.perf_counter()
        att = self.corral("attach", run_id, "--after", str(last), "--json",
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert att.stdout is not None
        line = att.stdout.readline()
        self.takeover.append((time.perf_counter() - killed) * 1000)
        assert json.loads(line)["offset"] == last + 1, line
        # what the dead driver had printed (so logged) beyond LAST: replayed, not taken over
        proc.wait()
        rest = proc.stdout.read()
        printed = {json.loads(x)["offset"] for x in rest.splitlines() if x.strip()}
        self.replayed += (last + 1) in printed
        att.send_signal(signal.SIGTERM)  # detach at once; the cancel below ends the run
        att.wait()
        cancel = self.corral("cancel", run_id, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        cancel.wait()


def row(name: str, a: list[float], b: list[float]) -> str:
    ma, mb = statistics.median(a), statistics.median(b)
    return (f"{name:<34} A p50 {ma:7.1f} p90 {pct(a, 90):7.1f} | "
            f"B p50 {mb:7.1f} p90 {pct(b, 90):7.1f} | B/A {mb / ma:.2f}  (n={len(a)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", type=Path, required=True, help="the old checkout")
    parser.add_argument("--b", type=Path, required=True, help="the new checkout")
    parser.add_argument("--n", type=int, default=40, help="samples of --version and ls")
    parser.add_argument("--kills", type=int, default=12, help="takeovers per side")
    parser.add_argument("--provider", default="bubblewrap")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="corral-cli-bench-"))
    try:
        sides = [Side("A", args.a, root), Side("B", args.b, root)]
        seed = root / "seed.db"
        subprocess.run([sys.executable, "-c", MAKE_STORE, f"sqlite://{seed}",
                        ",".join(STATUSES)], env=sides[1].env, check=True)
        for side in sides:
            # each side lists its own copy of the same 100-run store
            shutil.copy(seed, side.home / "ls.db")
            side.timed("ls", store=f"sqlite://{side.home}/ls.db")  # warm the page cache
        for i in range(args.n):
            for side in sides if i % 2 == 0 else sides[::-1]:
                side.version.append(side.timed("--version"))
                side.ls.append(side.timed("ls", store=f"sqlite://{side.home}/ls.db"))
                side.help.append(side.timed("run", "--help"))
                side.usage.append(side.timed("run", "--no-such-option", code=2))
                side.completion.append(side.timed("completion", "bash"))
        for k in range(args.kills):
            for side in sides if k % 2 == 0 else sides[::-1]:
                side.kill_and_attach(k, args.provider)
        a, b = sides
        print(f"A = {a.tree}\nB = {b.tree}\n(ms; Python {sys.version.split()[0]}; "
              f"{os.cpu_count()} cores; alternating A/B)")
        print(row("corral --version", a.version, b.version))
        print(row("corral ls (100-run SQLite store)", a.ls, b.ls))
        print(row("corral run --help", a.help, b.help))
        print(row("corral run --no-such-option (usage)", a.usage, b.usage))
        print(row("corral completion bash", a.completion, b.completion))
        if args.kills:
            print(row(f"SIGKILL -> first attach event ({args.provider})", a.takeover,
                      b.takeover))
            print(f"first attach event already logged by the dead driver (replayed): "
                  f"A {a.replayed}/{args.kills}, B {b.replayed}/{args.kills}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
