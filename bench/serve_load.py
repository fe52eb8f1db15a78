"""HTTP service under load: event delivery latency over SSE, and memory per idle viewer.

Usage: python bench/serve_load.py [--viewers 200] [--runs 50] [--lines N]
                                 [--servers 1] [--store URL]

`--servers` `corral serve` processes (each its own $CORRAL_HOME, bubblewrap sandboxes) on
127.0.0.1 sharing one store (`--store`, default a SQLite file; with several servers use
PostgreSQL: `--store postgresql://…`); viewers are spread over them round-robin, runs are
started on the first (fan-out) or round-robin (many runs), so most viewers watch a run
another process drives. This process is the viewers (raw asyncio sockets, one event loop). Agents print lines carrying their
wall-clock send time; latency = the time a viewer has the SSE frame - that send time, so it
covers journal -> translation -> store -> server fan-out -> socket -> client parse.

1. One run, --viewers concurrent SSE viewers (a line every 50 ms).
2. --runs concurrent runs, one viewer each (a line every 200 ms per run).
3. Memory: a fresh server's RSS before and after --viewers viewers connect to a quiet run
   (after 10 warm-up viewers came and went).

Loopback only; every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

AGENT = (
    "import time,sys\n"
    "time.sleep(max(0.0, {start} - time.time()))\n"
    "for i in range({n}):\n"
    "    sys.stdout.write('T%.6f\\n' % time.time()); sys.stdout.flush(); time.sleep({every})\n"
)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


class Server:
    def __init__(self, home: Path, store: str | None = None) -> None:
        home.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
        env["CORRAL_HOME"] = str(home)
        env.pop("CORRAL_API_TOKEN", None)
        env.pop("CORRAL_STORE", None)
        if store is not None:
            env["CORRAL_STORE"] = store
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "corral.server", "--port", "0", "--no-reaper",
             "--log-level", "warning", "--max-active-runs", "500"],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True)
        ready = threading.Event()
        self.url = ""

        def drain() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                if line.startswith("corral: serving on "):
                    self.url = line.split()[3]
                    ready.set()
                elif "WARNING" in line or "ERROR" in line:
                    sys.stderr.write("server: " + line)
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        if not ready.wait(60) or not self.url:
            raise SystemExit("server did not start")
        self.host, port = self.url.removeprefix("http://").rsplit(":", 1)
        self.port = int(port)

    def start(self, n: int, every: float, start_at: float) -> str:
        body = json.dumps({"thread_id": "bench", "command": [
            "python3", "-c", AGENT.format(n=n, every=every, start=start_at)]}).encode()
        req = urllib.request.Request(f"{self.url}/v1/runs", data=body, method="POST",
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            run_id: str = json.load(r)["run_id"]
        return run_id

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def viewer(server: Server, run_id: str, samples: list[float], connected: asyncio.Event,
                 counter: list[int], total: int, deadline: float) -> int:
    """One SSE connection; appends a latency sample per timestamped event; returns the
    number of events seen. Reads whatever has arrived in one call and splits it into lines
    itself: with 1,000 viewers a readline() per line made this client, not the servers,
    the bottleneck."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(f"GET /v1/runs/{run_id}/events HTTP/1.1\r\nHost: {server.host}\r\n"
                 "Accept: text/event-stream\r\n\r\n".encode())
    await writer.drain()
    seen = 0
    pending = b""
    try:
        while True:
            remaining = deadline - time.time()
            if remaining <= 0:
                break
            chunk = await asyncio.wait_for(reader.read(1 << 16), remaining)
            if not chunk:
                break
            now = time.time()
            *lines, pending = (pending + chunk).split(b"\n")
            ended = False
            for line in lines:
                if line.startswith(b"retry:"):
                    counter[0] += 1
                    if counter[0] >= total:
                        connected.set()
                elif line.startswith(b"event: end"):
                    ended = True
                    break
                elif line.startswith(b"data: ") and b'"delta":"' in line:
                    seen += 1
                    delta = line.split(b'"delta":"', 1)[1].split(b'"', 1)[0]
                    for part in delta.split(b"\\n"):
                        if part.startswith(b"T"):
                            samples.append(now - float(part[1:]))
            if ended:
                break
    except TimeoutError:
        pass
    finally:
        writer.close()
    return seen


async def fan_out(servers: list[Server], viewers: int, lines: int,
                  every: float) -> dict[str, float]:
    start_at = time.time() + 8 + viewers / 200
    run_id = servers[0].start(lines, every, start_at)
    samples: list[float] = []
    connected = asyncio.Event()
    counter = [0]
    deadline = start_at + lines * every + 30
    tasks = [asyncio.create_task(viewer(servers[i % len(servers)], run_id, samples, connected,
                                        counter, viewers, deadline)) for i in range(viewers)]
    await asyncio.wait_for(connected.wait(), 60)
    if time.time() > start_at:
        print("warning: viewers connected after the agent started", file=sys.stderr)
    await asyncio.gather(*tasks)
    return summary(samples, expected=viewers * lines)


async def many_runs(servers: list[Server], runs: int, lines: int) -> dict[str, float]:
    start_at = time.time() + 2.0 + runs * 0.25
    run_ids = [servers[i % len(servers)].start(lines, 0.2, start_at) for i in range(runs)]
    samples: list[float] = []
    connected = asyncio.Event()
    counter = [0]
    deadline = start_at + lines * 0.2 + 30
    # each run watched through the next server: with several, never its driver's
    tasks = [asyncio.create_task(viewer(servers[(i + 1) % len(servers)], r, samples, connected,
                                        counter, runs, deadline))
             for i, r in enumerate(run_ids)]
    await asyncio.wait_for(connected.wait(), 30)
    if time.time() > start_at:
        print("warning: viewers connected after the agents started", file=sys.stderr)
    await asyncio.gather(*tasks)
    return summary(samples, expected=runs * lines)


async def idle_memory(server: Server, viewers: int) -> dict[str, float]:
    run_id = server.start(1, 0.0, time.time() + 120)  # quiet for two minutes
    pid = server.proc.pid
    connected = asyncio.Event()
    counter = [0]
    warm = [asyncio.create_task(viewer(server, run_id, [], connected, counter, 10,
                                       time.time() + 3)) for _ in range(10)]
    await asyncio.gather(*warm)  # first-use allocations out of the way
    await asyncio.sleep(1)
    before = rss_kib(pid)
    connected = asyncio.Event()
    counter = [0]
    deadline = time.time() + 60
    tasks = [asyncio.create_task(viewer(server, run_id, [], connected, counter, viewers,
                                        deadline)) for _ in range(viewers)]
    await asyncio.wait_for(connected.wait(), 30)
    await asyncio.sleep(2)
    after = rss_kib(pid)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    urllib.request.urlopen(urllib.request.Request(
        f"{server.url}/v1/runs/{run_id}/cancel", method="POST"), timeout=60).close()
    return {"before_kib": before, "after_kib": after,
            "per_viewer_kib": (after - before) / viewers}


def summary(samples: list[float], expected: int) -> dict[str, float]:
    ms = [s * 1000 for s in samples]
    return {"events": len(ms), "expected": expected, "p50_ms": pct(ms, 50),
            "p99_ms": pct(ms, 99), "max_ms": max(ms), "mean_ms": statistics.fmean(ms)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--viewers", type=int, default=200)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--lines", type=int, default=200,
                        help="lines of the fan-out run (the many-runs case prints a quarter)")
    parser.add_argument("--every", type=float, default=0.05,
                        help="seconds between the fan-out run's lines")
    parser.add_argument("--servers", type=int, default=1,
                        help="server processes sharing the store (each its own CORRAL_HOME)")
    parser.add_argument("--store", default=None,
                        help="store URL the servers share (default: a SQLite file)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="corral-serve-bench-") as tmp:
        store = args.store or f"sqlite://{tmp}/corral.db"
        servers: list[Server] = []
        try:
            for i in range(args.servers):
                servers.append(Server(Path(tmp) / f"host-{i}", store))
            where = f"{args.servers} server(s), store {store.split('://')[0]}"
            a = asyncio.run(fan_out(servers, args.viewers, args.lines, args.every))
            print(f"{where}: 1 run, {args.viewers} SSE viewers, {args.lines} lines "
                  f"{args.every * 1000:g} ms apart: "
                  f"delivered {a['events']}/{a['expected']}  p50 {a['p50_ms']:.1f} ms  "
                  f"p99 {a['p99_ms']:.1f} ms  max {a['max_ms']:.1f} ms")
            lines = max(1, args.lines // 4)
            b = asyncio.run(many_runs(servers, args.runs, lines))
            print(f"{where}: {args.runs} runs, 1 viewer each, {lines} lines 200 ms apart: "
                  f"delivered {b['events']}/{b['expected']}  p50 {b['p50_ms']:.1f} ms  "
                  f"p99 {b['p99_ms']:.1f} ms  max {b['max_ms']:.1f} ms")
        finally:
            for server in servers:
                server.stop()
        # A fresh server, so memory freed by the viewers above does not hide the cost.
        server = Server(Path(tmp) / "memory", args.store)
        try:
            m = asyncio.run(idle_memory(server, args.viewers))
            print(f"memory: {args.viewers} idle viewers: server RSS {m['before_kib'] / 1024:.1f} "
                  f"-> {m['after_kib'] / 1024:.1f} MiB, {m['per_viewer_kib']:.1f} KiB per viewer")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
