"""The docker provider next to bare docker: time to interactive and exec round trip.

Time to interactive (TTI) is ``DockerProvider.create()`` then a first ``exec(["true"])``
(what a sandbox costs before it does anything), next to ``docker run --rm IMAGE true``.
The exec round trip is ``exec(["true"])`` in a live sandbox next to ``docker exec C true``
(the CLI, into an equally live container). Samples alternate (ours, bare, ours, ...) in one
run, so both see the same machine load; it prints medians, p90 and the paired ratios.

    python bench/docker_latency.py [--runs 15] [--image corral-base:<version>]

``--paths`` compares docker's two ways of running a command in one run, sample by sample
(#32): a ``docker exec`` per command (``agent = false``) and the sandbox's agent behind one
exec stream, next to the Docker API's own exec (the SDK: create, start, inspect of ``true``)
and the docker CLI's. Rows: exec round trip, exec after 100 ms idle, 50 MiB of stdout and
200k lines (against ``docker exec`` through the CLI into a pipe), time to interactive, and an
agent-like script (200 short commands, each after a 50 ms pause) against the same commands
run bare on the host (the sum of the commands' own times, and the script's whole time).

    PYTHONPATH=src python bench/docker_latency.py --paths [--runs 20] [--script 200]

``--fs`` compares docker's file operations, sample by sample (#32, dkfs): the handle's
long-lived file server (the helper's ``serve`` mode behind the agent), the helper started
per operation through the agent (before), and per operation through ``docker exec``
(``agent = false``). Rows: read, write and stat of a 100-byte file, read and write of
10 MiB, and the first operation of a new handle (the server's start).

    PYTHONPATH=src python bench/docker_latency.py --fs [--runs 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import anyio
import anyio.to_thread

from corral.providers._docker import DockerProvider

# The scripts of sandbox_latency (bench/ is sys.path[0]): an agent's commands in a git
# checkout of corral's sources, and the smallest commands.
from sandbox_latency import _GIT_ENV, SCRIPTS, _checkout


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def p50(xs: list[float]) -> float:
    return statistics.median(xs)


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


BIG = ["head", "-c", str(50 << 20), "/dev/zero"]
LINES = ["seq", "1", "200000"]


async def paths(runs: int, script_len: int, image: str | None) -> None:
    """docker exec per command vs the agent, interleaved, with the API's and CLI's exec."""
    old, new = DockerProvider(image, agent=False), DockerProvider(image)
    ho, hn = await old.create(), await new.create()
    api = new.api
    rows: dict[str, list[float]] = {}
    scripts: dict[str, tuple[dict[str, float], dict[str, float]]] = {}

    def add(name: str, value: float) -> None:
        rows.setdefault(name, []).append(value)

    def api_exec(argv: list[str]) -> None:
        exec_id = api.exec_create(hn.container, argv, user="1000:1000")["Id"]
        api.exec_start(exec_id)
        assert api.exec_inspect(exec_id)["ExitCode"] == 0

    def cli_exec(argv: list[str]) -> bytes:
        return subprocess.run(["docker", "exec", "-u", "1000:1000", hn.container, *argv],
                              capture_output=True, check=True).stdout

    async def ours(h: object, argv: list[str]) -> float:
        t = time.perf_counter()
        r = await h.process.exec(argv)  # type: ignore[attr-defined]
        dt = time.perf_counter() - t
        assert r.ok, r
        return dt

    try:
        assert new.command_path()[0] == "agent", new.command_path()
        await hn.process.exec(["true"])  # the agent is up
        await ho.process.exec(["true"])
        for _ in range(runs):
            t = time.perf_counter()
            await anyio.to_thread.run_sync(api_exec, ["true"])
            a = time.perf_counter() - t
            t = time.perf_counter()
            cli_exec(["true"])
            c = time.perf_counter() - t
            e = await ours(ho, ["true"])
            g = await ours(hn, ["true"])
            add("exec: agent", g)
            add("exec: docker exec path (old)", e)
            add("exec: Docker API's own exec", a)
            add("exec: docker CLI exec", c)
            add("  exec agent / API exec (ratio)", g / a)
            add("  exec agent / old path (ratio)", g / e)
            await anyio.sleep(0.1)
            add("exec after 100 ms idle: agent", await ours(hn, ["true"]))
        for _ in range(max(3, runs // 4)):
            for name, argv in (("50 MiB stdout", BIG), ("200k lines", LINES)):
                t = time.perf_counter()
                out = cli_exec(argv)
                c = time.perf_counter() - t
                t = time.perf_counter()
                r = await hn.process.exec(argv)
                g = time.perf_counter() - t
                assert r.ok and len(r.stdout) == len(out), (len(r.stdout), len(out))
                e = await ours(ho, argv)
                add(f"{name}: agent", g)
                add(f"{name}: docker CLI exec", c)
                add(f"{name}: docker exec path (old)", e)
                add(f"  {name}: agent throughput / CLI (ratio)", c / g)
        for _ in range(max(3, runs // 4)):
            for label, p in (("old", old), ("agent", new)):
                t = time.perf_counter()
                h = await p.create()
                r = await h.process.exec(["true"])
                add(f"time to interactive: {label}", time.perf_counter() - t)
                assert r.ok, r
                await p.destroy(h.ref)
        # The scripts: per command, bare host then the old path then the agent, each after
        # a 50 ms pause. "trivial" in the container's root; "agent" in a git checkout of
        # corral's sources (on the host: a copy in a temporary directory).
        with tempfile.TemporaryDirectory() as tmp:
            checkout = Path(tmp)
            _checkout(checkout)
            for h in (ho, hn):
                await _copy_checkout(h, checkout)
            for kind, commands in SCRIPTS.items():
                host_cwd = str(checkout) if kind == "agent" else None
                sums = scripts[kind] = ({"host": 0.0, "old": 0.0, "agent": 0.0},
                                        {"host": 0.0, "old": 0.0, "agent": 0.0})
                for i in range(script_len):
                    cmd = commands[i % len(commands)]
                    t0 = time.perf_counter()
                    await anyio.sleep(0.05)
                    t = time.perf_counter()
                    subprocess.run(cmd, capture_output=True, check=True, cwd=host_cwd)
                    sums[0]["host"] += time.perf_counter() - t
                    sums[1]["host"] += time.perf_counter() - t0
                    for label, h in (("old", ho), ("agent", hn)):
                        t0 = time.perf_counter()
                        await anyio.sleep(0.05)
                        sums[0][label] += await ours(h, cmd)
                        sums[1][label] += time.perf_counter() - t0
    finally:
        await old.destroy(ho.ref)
        await new.destroy(hn.ref)
    print(f"docker: docker exec per command vs the agent, interleaved, {runs} runs; load "
          f"average {os.getloadavg()[0]:.2f}")
    for label, xs in rows.items():
        if "ratio" in label:
            print(f"  {label:<46} p50 {p50(xs):7.2f} x")
        else:
            print(f"  {label:<46} p50 {p50(xs) * 1e3:8.1f} ms   p90 {pct(xs, 0.9) * 1e3:8.1f} ms")
    for kind, (sums, walls) in scripts.items():
        print(f"  {script_len}-command {kind} script, each after 50 ms:")
        for label in sums:
            print(f"    {label:<6} commands {sums[label] * 1e3:8.1f} ms "
                  f"({sums[label] / sums['host']:5.2f}x bare host)   whole script "
                  f"{walls[label] * 1e3:8.1f} ms ({walls[label] / walls['host']:5.2f}x)")


async def _copy_checkout(h: object, checkout: Path) -> None:
    """``checkout``'s files into the sandbox's workspace (its own git repository)."""
    for path in sorted(checkout.rglob("*")):
        rel = path.relative_to(checkout)
        if path.is_file() and rel.parts[0] != ".git":
            await h.fs.write(str(rel), path.read_bytes())  # type: ignore[attr-defined]
    env = {"HOME": "/tmp", **_GIT_ENV}
    for argv in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "x"]):
        r = await h.process.exec(argv, env=env)  # type: ignore[attr-defined]
        assert r.ok, r


async def fs_paths(runs: int, image: str | None) -> None:
    """File operations: the file server vs a helper per operation, interleaved."""
    agent, off = DockerProvider(image), DockerProvider(image, agent=False)
    hs, hx = await agent.create(), await off.create()
    hp = await DockerProvider(image).resume(hs.ref)  # the same sandbox, its own agent
    assert hp is not None
    hp.fs_servers.problem = "bench: the helper per operation"
    ways = (("server", hs), ("helper per op via agent (before)", hp),
            ("helper per op via docker exec", hx))
    rows: dict[str, list[float]] = {}
    small, big = os.urandom(100), os.urandom(10 << 20)

    async def timed(name: str, op: object) -> None:
        t = time.perf_counter()
        await op  # type: ignore[misc]
        rows.setdefault(name, []).append(time.perf_counter() - t)

    try:
        for _label, h in ways:
            await h.fs.write("small", small)
            await h.fs.write("big", big)
        assert agent.command_path()[0] == "agent", agent.command_path()
        for _ in range(runs):
            for label, h in ways:
                await timed(f"read 100 B: {label}", h.fs.read("small"))
                await timed(f"write 100 B: {label}", h.fs.write("small", small))
                await timed(f"stat: {label}", h.fs.stat("small"))
            for label, h in ways:
                await timed(f"read 10 MiB: {label}", h.fs.read("big"))
                await timed(f"write 10 MiB: {label}", h.fs.write("big", big))
            await hs.fs_servers.aclose()  # the idle servers stop: the next op starts one
            await timed("first op, the server's start: server", hs.fs.stat("small"))
        assert hs.fs_servers.problem is None and await hs.fs.read("big") == big
    finally:
        await agent.destroy(hs.ref)
        await off.destroy(hx.ref)
    print(f"docker file operations, interleaved, {runs} runs; load average "
          f"{os.getloadavg()[0]:.2f}")
    for label, xs in rows.items():
        print(f"  {label:<56} p50 {p50(xs) * 1e3:8.2f} ms   p90 {pct(xs, 0.9) * 1e3:8.2f} ms")
    for op in ("read 100 B", "write 100 B", "stat", "read 10 MiB", "write 10 MiB"):
        new = p50(rows[f"{op}: server"])
        print(f"  {op + ': server / before (p50 ratio)':<56} "
              f"{new / p50(rows[f'{op}: helper per op via agent (before)']):8.2f} x")


if __name__ == "__main__":
    import sys

    if "--fs" in sys.argv:
        ap = argparse.ArgumentParser()
        ap.add_argument("--fs", action="store_true")
        ap.add_argument("--runs", type=int, default=20)
        ap.add_argument("--image", default=None)
        a = ap.parse_args()
        anyio.run(fs_paths, a.runs, a.image)
    elif "--paths" in sys.argv:
        ap = argparse.ArgumentParser()
        ap.add_argument("--paths", action="store_true")
        ap.add_argument("--runs", type=int, default=20)
        ap.add_argument("--script", type=int, default=200)
        ap.add_argument("--image", default=None)
        a = ap.parse_args()
        anyio.run(paths, a.runs, a.script, a.image)
    else:
        anyio.run(main)
