"""Chaos: three ``corral serve`` hosts share one PostgreSQL store, each with its own
``$CORRAL_HOME``. Twenty command runs go on while servers are SIGKILLed and restarted at
random fifty times; viewers hop between servers with ``Last-Event-ID``. Every run must end
with exactly one terminal status and a log equal to an uninterrupted run's (0 lost, 0
duplicated), and the built-in reapers must never sweep at the same time. Meanwhile host-tool
approvals held by a driver process on a fourth home are answered through whichever server is
up: requests, answers and the key that signs their ids live in the shared store.

Once the runs end, no sandbox is left behind in any home (issue #26): whichever home
finished a run destroyed its sandbox, wherever it lives. Run once with bubblewrap (sandboxes
under the starting home, reached by the others on the same machine) and once, smaller, with
docker (containers on the shared daemon)."""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import pg_log, pg_schema_url, wait_until
from tests.server.conftest import SRC, Home, Server, sse_events, ticker, ticker_text

pytestmark = pytest.mark.timeout(600)

SERVERS = 3
RUNS = 20
KILLS = 50
LINES = 300
EVERY = 0.1
APPROVALS = 5
SIZES = {"bubblewrap": (RUNS, KILLS, LINES), "docker": (6, 15, 200)}
"""Runs, kills and lines per provider: docker's containers cost more to make on two cores."""

# A driver's gate holding host-tool calls, as the MCP server of a run's driver holds them:
# its own process and $CORRAL_HOME, only the store in common with the servers.
GATE = """
import json, sys, anyio
from corral.stores import open_store
from corral.tools import Approvals

async def main():
    store = await open_store(sys.argv[1])
    def emit(event):
        print(json.dumps(event.value), flush=True)
    try:
        for i in range(int(sys.argv[3])):
            gate = Approvals(store, sys.argv[2], emit=emit, timeout=240)
            decision = await gate.request("deploy", {"step": i})
            print(json.dumps({"decision": decision}), flush=True)
    finally:
        await store.aclose()

anyio.run(main)
"""


class Cluster:
    """Three server slots; a killed slot is restarted at once (without waiting for it)."""

    def __init__(self, homes: list[Home], *args: str) -> None:
        self.homes = homes
        self.args = ("--reap-interval", "1s", *args)
        self.servers = [h.spawn(*self.args, reaper=True) for h in homes]
        self.retired: list[tuple[Server, float]] = []
        """Killed servers and when they were killed (wall clock)."""
        self.lock = threading.Lock()

    def live_url(self, rng: random.Random) -> str | None:
        with self.lock:
            urls = [s.url for s in self.servers if s.ready.is_set() and s.url
                    and s.proc.poll() is None]
        return rng.choice(urls) if urls else None

    def kill_and_restart(self, slot: int) -> None:
        with self.lock:
            victim = self.servers[slot]
        victim.stop(signal.SIGKILL)
        killed_at = time.time()
        fresh = self.homes[slot].spawn(*self.args, reaper=True, wait=False)
        with self.lock:
            self.servers[slot] = fresh
            self.retired.append((victim, killed_at))

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def logs(self) -> Iterator[tuple[list[str], float | None]]:
        """Every server's log and when it was killed (``None``: still running)."""
        for s, killed in self.retired:
            yield s.log, killed
        for s in self.servers:
            yield s.log, None


class Approver(threading.Thread):
    """Answers each approval the gate process asks for through a random live server,
    retrying across kills; the even ones are allowed, the odd ones denied."""

    def __init__(self, cluster: Cluster, gate: subprocess.Popen[str], run_id: str) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.gate = gate
        self.run_id = run_id
        self.rng = random.Random(7)
        self.decisions: list[str | None] = []
        self.refused_again = 0

    def post(self, path: str, decision: str) -> httpx.Response:
        """POST to a random live server, trying another while they die under us."""
        while True:
            url = self.cluster.live_url(self.rng)
            if url is None:
                time.sleep(0.1)
                continue
            try:
                return httpx.post(url + path, json={"decision": decision}, timeout=10)
            except httpx.HTTPError:
                continue

    def answer(self, approval_id: str, decision: str) -> None:
        path = f"/v1/runs/{self.run_id}/approvals/{approval_id}"
        r = self.post(path, decision)
        # 409 "already answered": an earlier try landed, and its server died before replying.
        assert r.status_code == 200 or (r.status_code == 409 and "already answered" in r.text), \
            r.text
        # Once answered, any server refuses a second answer.
        again = self.post(path, "allow")
        assert again.status_code == 409, again.text
        self.refused_again += 1

    def run(self) -> None:
        assert self.gate.stdout is not None
        for line in self.gate.stdout:
            message = json.loads(line)
            if "tool" in message:  # corral.approval_request
                time.sleep(self.rng.uniform(0.5, 3.0))  # spread over the kills
                step = message["args"]["step"]
                self.answer(message["approvalId"], "deny" if step % 2 else "allow")
            elif set(message) == {"decision"}:  # what the held call was told
                self.decisions.append(message["decision"])


class Viewer(threading.Thread):
    """Watches one run to its end from random live servers, resuming after each drop."""

    def __init__(self, cluster: Cluster, run_id: str, seed: int) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.run_id = run_id
        self.rng = random.Random(seed)
        self.got: list[tuple[int, dict[str, Any]]] = []
        self.ended = False
        self.reconnects = 0

    def run(self) -> None:
        deadline = time.monotonic() + 400
        while not self.ended and time.monotonic() < deadline:
            url = self.cluster.live_url(self.rng)
            if url is None:
                time.sleep(0.1)
                continue
            headers = {"Last-Event-ID": str(self.got[-1][0])} if self.got else {}
            try:
                with httpx.Client(base_url=url, timeout=30) as c, c.stream(
                        "GET", f"/v1/runs/{self.run_id}/events", headers=headers) as r:
                    if r.status_code != 200:
                        raise httpx.TransportError(f"status {r.status_code}")
                    for name, ident, data in sse_events(r.iter_lines()):
                        if name == "end":
                            self.ended = True
                            break
                        assert ident is not None
                        self.got.append((int(ident), json.loads(data)))
            except httpx.HTTPError:
                self.reconnects += 1
                time.sleep(0.05)


def _normalized(events: list[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    return [json.loads(json.dumps(e).replace(run_id, "RUN")) for e in events]


_SWEEP = re.compile(r"reaper sweep by (\S+) (started|ended) at ([0-9.]+)")


def _sweeps(cluster: Cluster) -> list[tuple[float, float]]:
    """Each sweep's (start, end); a sweeper killed mid-sweep ends when it was killed."""
    spans: list[tuple[float, float]] = []
    for log, killed in cluster.logs():
        open_at: float | None = None
        for line in log:
            m = _SWEEP.search(line)
            if m is None:
                continue
            at = float(m.group(3))
            if m.group(2) == "started":
                open_at = at
            else:
                assert open_at is not None
                spans.append((open_at, at))
                open_at = None
        if open_at is not None:
            spans.append((open_at, killed if killed is not None else time.time()))
    return sorted(spans)


def _records(url: str, run_ids: list[str]) -> list[Any]:
    import anyio

    from corral.stores import open_store

    async def read() -> list[Any]:
        store = await open_store(url)
        try:
            return [await store.get(r) for r in run_ids]
        finally:
            await store.aclose()

    return anyio.run(read)


def _left_behind(provider: str, homes: list[Path], sandbox_ids: list[str]) -> list[str]:
    """What of the runs' sandboxes is still on this machine, in any home: bubblewrap state
    dirs, files (corral's files index) and cgroups; docker containers."""
    if provider == "docker":
        from corral.providers._docker import container_name

        out = subprocess.run(["docker", "ps", "-a", "--format", "{{.Names}}"],
                             capture_output=True, text=True, check=True, timeout=60).stdout
        names = set(out.split())
        return [container_name(i) for i in sandbox_ids if container_name(i) in names]
    import glob
    import hashlib

    from corral.providers._bubblewrap import FILES_ROOT

    left = [str(d) for home in homes for d in (home / "sandboxes" / "bubblewrap").glob("*")
            if not d.name.startswith(".")]
    for home in homes:
        key = hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:16]
        for root in (FILES_ROOT, FILES_ROOT / "btrfs"):
            left += [str(p) for p in (root / key).glob("*")]
    for sandbox_id in sandbox_ids:
        left += glob.glob(f"/sys/fs/cgroup/*/corral/{sandbox_id}.*")
    return left


def test_three_servers_on_postgres_survive_fifty_kills(tmp_path: Path,
                                                       need_bwrap_runs: None) -> None:
    chaos("bubblewrap", tmp_path)


def chaos(provider: str, tmp_path: Path) -> None:
    """Three servers sharing one store, runs on ``provider``, drivers SIGKILLed at random
    (the docker variant, smaller, is tests/server/test_chaos_docker.py: it runs with the
    docker tests, alone)."""
    runs_n, kills, lines = SIZES[provider]
    with pg_schema_url() as url:
        homes = []
        for i in range(SERVERS):
            path = tmp_path / f"host-{i}"
            path.mkdir()
            home = Home(path)
            home.env["CORRAL_STORE"] = url
            homes.append(home)
        homes_paths = [h.path for h in homes]
        config = tmp_path / "serve.toml"
        config.write_text(f'allowed_providers = ["{provider}"]\n')
        cluster = Cluster(homes, "--config", str(config))
        try:
            command = ticker(lines, EVERY)
            runs = []
            for i in range(runs_n):
                server = cluster.servers[i % SERVERS]
                runs.append(server.start(command, thread_id=f"chaos-{i}", run_id=f"chaos-{i}",
                                         sandbox={"provider": provider})["run_id"])
            viewers = [Viewer(cluster, run_id, seed=i) for i, run_id in enumerate(runs)]
            for v in viewers:
                v.start()
            gate_home = tmp_path / "driver-home"
            gate_home.mkdir()
            gate = subprocess.Popen(
                [sys.executable, "-c", GATE, url, runs[0], str(APPROVALS)],
                env={**homes[0].env, "CORRAL_HOME": str(gate_home), "PYTHONPATH": str(SRC)},
                stdout=subprocess.PIPE, text=True)
            approver = Approver(cluster, gate, runs[0])
            approver.start()

            rng = random.Random(1234)
            for _ in range(kills):
                time.sleep(rng.uniform(0.2, 0.8))
                cluster.kill_and_restart(rng.randrange(SERVERS))
            assert any(not v.ended for v in viewers), "the runs ended before the chaos did"
            for v in viewers:
                v.join(420)
            approver.join(240)
            assert gate.wait(60) == 0
            # allowed (None) and denied in turn, each answered once through some server
            assert approver.decisions == [
                None if i % 2 == 0 else "denied by a human" for i in range(APPROVALS)]
            assert approver.refused_again == APPROVALS
            assert all(v.ended for v in viewers), [v.run_id for v in viewers if not v.ended]

            # An uninterrupted run of the same command is the reference translation.
            clean_id = cluster.servers[0].start(command, thread_id="clean", run_id="clean",
                                                sandbox={"provider": provider})["run_id"]
            clean = Viewer(cluster, clean_id, seed=99)
            clean.run()
            assert clean.ended
            reference = _normalized([e for _, e in clean.got], clean_id)

            for v in viewers:
                offsets = [o for o, _ in v.got]
                assert offsets == list(range(1, len(offsets) + 1)), (v.run_id, "gap or repeat")
                events = [e for _, e in v.got]
                assert events == pg_log(url, v.run_id)
                assert _normalized(events, v.run_id) == reference, v.run_id
                ends = [e for e in events if e["type"] in ("RUN_FINISHED", "RUN_ERROR")]
                assert len(ends) == 1 and events[-1] is ends[0]
                text = "".join(e["delta"] for e in events
                               if e["type"] == "TEXT_MESSAGE_CONTENT")
                assert text == ticker_text(lines)
            url0 = cluster.live_url(random.Random(0))
            assert url0 is not None
            with httpx.Client(base_url=url0, timeout=30) as c:
                for run_id in runs:
                    wait_until(lambda r=run_id: c.get(f"/v1/runs/{r}").json()["status"]
                               == "completed", f"{run_id} completed", timeout=60)
            assert sum(v.reconnects for v in viewers) > 0, "no viewer was ever cut off"

            # Nothing left behind: every run's sandbox destroyed by whichever home ended it.
            records = _records(url, [*runs, clean_id])
            sandbox_ids = [r.sandbox_ref["id"] for r in records if r and r.sandbox_ref]
            assert len(sandbox_ids) == len(records)
            wait_until(lambda: not _left_behind(provider, [*homes_paths, gate_home],
                                                sandbox_ids),
                       "every run's sandbox destroyed", timeout=60)

            spans = _sweeps(cluster)
            assert spans, "no reaper ever swept"
            for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
                assert end <= start, f"two reaper sweeps overlapped: {spans}"
        finally:
            cluster.stop()
