"""The reaper inside ``corral serve``: unwatched runs expire after the TTL, watched ones do
not, runs nobody drives are finalized, and one sweep runs at a time across processes."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest

from corral.runs._reap_sweep import ReapOutcome
from corral.runs._runner import RunRequest
from corral.server._config import ServerConfig
from corral.server._reap_loop import LOCK_NAME, sweep_once
from corral.server._service import RunService
from corral.server._sse import encode_event
from corral.stores import open_store
from tests.helpers import wait_until
from tests.server.conftest import Home, read_stream, sse_events, ticker
from corral.testing import wait_until_async

REAPER = ("--reap-interval", "0.3s", "--reap-ttl", "1s")


def test_an_unwatched_run_expires_and_a_watched_one_does_not(home: Home) -> None:
    with home.server(*REAPER, reaper=True) as server:
        lonely = server.start(ticker(600, 0.05), run_id="lonely")["run_id"]
        watched = server.start(ticker(600, 0.05), run_id="watched")["run_id"]
        stop = threading.Event()
        offsets: list[int] = []

        def watch() -> None:
            with httpx.Client(base_url=server.url, timeout=30) as c, c.stream(
                "GET", f"/v1/runs/{watched}/events"
            ) as r:
                for _name, ident, _data in sse_events(r.iter_lines()):
                    offsets.append(int(ident or 0))
                    if stop.is_set():
                        return

        viewer = threading.Thread(target=watch)
        viewer.start()
        try:
            wait_until(lambda: server.run(lonely)["status"] == "aborted", "expiry", timeout=20)
            # Well past the TTL (and several sweeps), the watched run goes on.
            wait_until(lambda: len(offsets) > 50, "events while watched", timeout=20)
            assert server.run(watched)["status"] == "running"
        finally:
            stop.set()
            viewer.join(30)
        # The viewer left: now it is unwatched, and expires in its turn.
        wait_until(lambda: server.run(watched)["status"] == "aborted",
                   "expiry after leaving", timeout=20)
        assert home.log(lonely)[-1]["type"] == "RUN_ERROR"
        assert home.raw(lonely)["cancel_requested"] is True


def test_a_run_nobody_drives_is_finalized_by_the_servers_reaper(home: Home) -> None:
    out = home.cli("run", "--detach", "--run-id", "cli-run", "--", "sh", "-c", "echo done")
    assert out.returncode == 0, out.stderr
    with home.server("--reap-interval", "0.3s", "--reap-ttl", "1h", reaper=True) as server:
        wait_until(lambda: server.run("cli-run")["status"] == "completed", "finalized", timeout=30)
        got, ended = read_stream(server, "cli-run")
        assert ended and got[-1][1]["type"] == "RUN_FINISHED"
        assert "done" in "".join(e.get("delta", "") for _, e in got)


@pytest.mark.anyio
async def test_one_sweep_at_a_time(tmp_path: Path, need_bwrap_runs: None,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_HOME", str(tmp_path))
    store = await open_store(f"sqlite://{tmp_path / 'corral.db'}")
    try:
        service = RunService(ServerConfig(reaper=False, reap_ttl=3600), encode_event,
                             store=store)
        async with service.running():
            runner = service.runner
            record = await runner.start(RunRequest(command=["sh", "-c", "echo hi"]))
            await runner.detach(record.run_id)  # like `corral run --detach`: nobody drives

            async def exited() -> bool:
                from corral.runs._run_probe import probe_run_exit

                current = await store.get(record.run_id)
                assert current is not None
                return (await probe_run_exit(current)).state == "finished"

            await wait_until_async(exited, "the agent to finish", timeout=20, interval=0.05)

            assert await store.try_lock(LOCK_NAME, "another-server", 60)
            assert await sweep_once(service, "this-server") is None
            untouched = await store.get(record.run_id)
            assert untouched is not None and untouched.status.value == "running"
            assert untouched.driver_epoch == record.driver_epoch

            assert await store.unlock(LOCK_NAME, "another-server")
            result = await sweep_once(service, "this-server")
            assert result is not None
            assert result.outcomes[ReapOutcome.FINALIZED] == 1
            done = await store.get(record.run_id)
            assert done is not None and done.status.value == "completed"
            # The lock was released after the sweep.
            assert await store.try_lock(LOCK_NAME, "another-server", 60)
    finally:
        await store.aclose()
