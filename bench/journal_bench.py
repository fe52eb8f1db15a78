"""Journal benchmarks: supervisor launch, agent output into the journal, reader throughput,
line latency, tail attach.

Run: PYTHONPATH=src python bench/journal_bench.py
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

from corral.harness._base import RunContext, translate_run
from corral.harness._command import CommandHarness
from corral.journal._reader import Exit, read_journal
from corral.journal._layout import JournalPaths, read_status
from corral.journal._sentinel import format_trailer, new_nonce
from corral.journal._supervisor import AgentSpec, kill_supervised, launch_supervised

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def bench_launch(d: Path, n: int = 20) -> None:
    times = []
    for i in range(n):
        paths = JournalPaths.for_run(d, f"launch-{i}")
        t = time.perf_counter()
        launch_supervised(AgentSpec(["true"], ENV), paths, new_nonce())
        times.append(time.perf_counter() - t)
        while (st := read_status(paths.status)) is None or st.state != "exited":
            time.sleep(0.005)
    print(f"launch_supervised (agent spawned, call returns): median {statistics.median(times)*1e3:.1f} ms, "
          f"max {max(times)*1e3:.1f} ms over {n}")


def bench_agent_output(d: Path, mib: int = 200) -> None:
    """An agent writing ``mib`` MiB of 100-byte lines, from launch to the recorded exit:
    what the supervisor costs on the way to the journal (it pipes the agent's output)."""
    script = ("import sys; line = b'x' * 99 + b'\\n'; block = line * 10486; "
              f"[sys.stdout.buffer.write(block) for _ in range({mib * 1024 * 1024 // (100 * 10486)})]")
    paths = JournalPaths.for_run(d, "output")
    t = time.perf_counter()
    launch_supervised(AgentSpec([sys.executable, "-c", script], ENV), paths, new_nonce())
    while (st := read_status(paths.status)) is None or st.state != "exited":
        time.sleep(0.002)
    dt = time.perf_counter() - t
    size = paths.journal.stat().st_size
    print(f"agent output into the journal, {size/1e6:.0f} MB: {dt*1e3:.0f} ms, {size/dt/1e6:.0f} MB/s")
    paths.journal.unlink()


def bench_throughput(d: Path) -> None:
    nonce = new_nonce()
    j = d / "tp.journal"
    line = b"x" * 99 + b"\n"
    n = 2_000_000
    with open(j, "wb") as f:
        f.writelines(line * 10000 for _ in range(n // 10000))
        f.write(format_trailer(nonce, 0, None))

    async def read() -> int:
        count = 0
        async for item in read_journal(j, nonce=nonce, follow=False):
            count += 1
        return count

    t = time.perf_counter()
    count = anyio.run(read)
    dt = time.perf_counter() - t
    size = j.stat().st_size
    print(f"read_journal, {size/1e6:.0f} MB of 100-byte lines: {count/dt/1e6:.2f} M lines/s, "
          f"{size/dt/1e6:.0f} MB/s")

    async def translate() -> int:
        count = 0
        async for b in translate_run(CommandHarness(), RunContext("r", "t"), j, nonce=nonce,
                                     follow=False):
            count += len(b.events)
        return count

    j2 = d / "tp2.journal"
    with open(j2, "wb") as f:
        f.write(line * 200_000 + format_trailer(nonce, 0, None))
    j = j2
    t = time.perf_counter()
    events = anyio.run(translate)
    dt = time.perf_counter() - t
    print(f"translate_run (command), 200k lines: {200_000/dt/1e3:.0f} k lines/s ({events} events)")


def bench_line_latency(d: Path, n: int = 30, gap: float = 0.2) -> None:
    paths = JournalPaths.for_run(d, "latency")
    nonce = new_nonce()
    script = (f"import time,sys\nfor i in range({n}):\n    time.sleep({gap})\n"
              "    sys.stdout.write(repr(time.time())+'\\n'); sys.stdout.flush()\n")
    launch_supervised(AgentSpec([sys.executable, "-c", script], ENV), paths, nonce)

    async def follow() -> list[float]:
        lat = []
        async for item in read_journal(paths, nonce=nonce, poll=0.05):
            if isinstance(item, Exit):
                break
            if item.data:  # the last, empty segment is closed by the supervisor's separator
                lat.append(time.time() - float(item.data))
        return lat

    try:
        lat = anyio.run(follow)
    finally:
        kill_supervised(paths, grace=1, include_supervisor=True)
    print(f"line latency (agent write -> reader yield), lines {gap}s apart, poll=0.05: "
          f"median {statistics.median(lat)*1e3:.1f} ms, max {max(lat)*1e3:.1f} ms")


def bench_tail_attach(d: Path) -> None:
    nonce = new_nonce()
    j = d / "big.journal"
    size = 1 << 30
    with open(j, "wb") as f:
        f.truncate(size)
        f.seek(size)
        f.write(b"\nend\n" + format_trailer(nonce, 0, None))

    async def attach() -> None:
        async for _ in read_journal(j, nonce=nonce, after=size + 1):
            pass

    t = time.perf_counter()
    anyio.run(attach)
    print(f"attach near the end of a 1 GiB journal: {(time.perf_counter()-t)*1e3:.2f} ms")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        bench_launch(d)
        bench_agent_output(d)
        bench_throughput(d)
        bench_line_latency(d)
        bench_tail_attach(d)


if __name__ == "__main__":
    main()
