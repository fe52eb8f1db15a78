"""Durable-run latency: agent stdout line -> event seen by an attached reader, and takeover.

Usage: python bench/run_latency.py [--lines N] [--kills N] [--provider bubblewrap|local]

1. Line latency. `corral run` drives a bubblewrap run whose agent prints a line carrying its
   wall-clock send time every 20 ms; this process tails the run's log from the SQLite store
   (another process, as a viewer would) and measures line -> event visible.
2. Takeover. `corral run` drives a ticking agent and is SIGKILLed mid-run; `corral attach`
   starts at once in a new process; we time SIGKILL -> the first new event the successor
   prints (new process start-up included).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

SRC = Path(__file__).resolve().parent.parent / "src"
sys.path.insert(0, str(SRC))

from corral.stores import open_store

AGENT = (
    "import time,sys\n"
    "for i in range({n}):\n"
    "    sys.stdout.write('T%d\\n' % time.time_ns()); sys.stdout.flush(); time.sleep(0.02)\n"
)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def cli(env: dict[str, str], *args: str, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "corral", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, **kw)  # type: ignore[call-overload]


async def line_latency(env: dict[str, str], n: int, provider: str) -> list[float]:
    store = await open_store(env["CORRAL_STORE"])
    proc = cli(env, "run", "--provider", provider, "--run-id", "lat", "--",
               "python3", "-c", AGENT.format(n=n))
    try:
        with anyio.fail_after(30):
            while await store.get("lat") is None:
                await anyio.sleep(0.01)
        samples: list[float] = []
        async for logged in store.read("lat"):
            seen = time.time_ns()
            if logged.event.get("type") != "TEXT_MESSAGE_CONTENT":
                continue
            for token in logged.event["delta"].split():
                if token.startswith("T"):
                    samples.append((seen - int(token[1:])) / 1e6)
        return samples
    finally:
        proc.wait()
        await store.aclose()


def takeover(env: dict[str, str], kills: int, provider: str) -> list[float]:
    out: list[float] = []
    ticker = "i=0; while [ $i -lt 200 ]; do echo tick $i; i=$((i+1)); sleep 0.02; done"
    for k in range(kills):
        run_id = f"take-{k}"
        proc = cli(env, "run", "--provider", provider, "--run-id", run_id, "--json", "--",
                   "sh", "-c", ticker)
        assert proc.stdout is not None
        last = 0
        for _ in range(20):
            last = json.loads(proc.stdout.readline())["offset"]
        proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        proc.wait()
        att = cli(env, "attach", run_id, "--after", str(last), "--json")
        assert att.stdout is not None
        line = att.stdout.readline()
        out.append((time.monotonic() - killed) * 1000)
        assert json.loads(line)["offset"] == last + 1, line
        att.wait()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=300)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--provider", default="bubblewrap")
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="corral-bench-")
    env = dict(os.environ, CORRAL_HOME=home, PYTHONPATH=str(SRC),
               CORRAL_STORE=f"sqlite://{home}/corral.db", CORRAL_LEASE_TTL="10")
    samples = anyio.run(line_latency, env, args.lines, args.provider)
    print(f"line -> attached reader ({args.provider}, {len(samples)} lines): "
          f"p50 {statistics.median(samples):.1f} ms  p99 {pct(samples, 99):.1f} ms  "
          f"max {max(samples):.1f} ms")
    takes = takeover(env, args.kills, args.provider)
    print(f"driver SIGKILL -> first event from the successor ({len(takes)} kills, lease 10 s, "
          f"same machine): p50 {statistics.median(takes):.0f} ms  p99 {pct(takes, 99):.0f} ms  "
          f"max {max(takes):.0f} ms")


if __name__ == "__main__":
    main()
