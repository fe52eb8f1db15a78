"""Several ``corral serve`` processes sharing one SQLite store: any serves any run, and a
viewer on a survivor takes over a run whose driving server was SIGKILLed."""

from __future__ import annotations

import json
import signal
import threading
from typing import Any

import httpx

from tests.helpers import wait_until
from tests.server.conftest import Home, read_stream, sse_events, ticker, ticker_text


def normalized(events: list[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    """Events with the run id replaced, so two runs of one command compare equal."""
    return [json.loads(json.dumps(e).replace(run_id, "RUN")) for e in events]


def test_sigkill_the_driving_server_and_watch_the_rest_on_another(home: Home) -> None:
    lines = 60
    command = ticker(lines, 0.05)
    with home.server() as a, home.server() as b:
        run_id = a.start(command, thread_id="x", run_id="victim")["run_id"]
        # A viewer on A sees the first events; A drives the run.
        first, ended = read_stream(a, run_id, limit=10)
        assert not ended
        assert home.raw(run_id)["claim_owner"] is not None
        # B serves the same run too (without driving it: A holds the claim).
        peek, _ = read_stream(b, run_id, limit=3)
        assert [e for _, e in peek] == [e for _, e in first[:3]]

        a.stop(signal.SIGKILL)
        last_seen = first[-1][0]
        # The viewer reconnects to B where it left off: B finds the driver dead and drives.
        rest, ended = read_stream(b, run_id, last_event_id=last_seen, timeout=90)
        assert ended
        offsets = [o for o, _ in first + rest]
        assert offsets == list(range(1, len(offsets) + 1)), "a duplicate or a gap"
        interrupted = [e for _, e in first + rest]
        assert interrupted == home.log(run_id)
        assert interrupted[-1]["type"] == "RUN_FINISHED"

        # The same command, uninterrupted, on B: the same events.
        clean_id = b.start(command, thread_id="x", run_id="clean")["run_id"]
        clean, ended = read_stream(b, clean_id)
        assert ended
        assert normalized(interrupted, run_id) == normalized([e for _, e in clean], clean_id)
        text = "".join(e["delta"] for e in interrupted if e["type"] == "TEXT_MESSAGE_CONTENT")
        assert text == ticker_text(lines)
        wait_until(lambda: b.run(run_id)["status"] == "completed", "completed record", timeout=20)
        assert b.run(run_id)["driver_epoch"] >= 3  # start, A's drive, B's takeover


def test_a_watcher_on_another_server_notices_the_driver_dying(home: Home) -> None:
    """The viewer stays connected to B the whole time; A dies mid-run; B's presence check
    finds the driver gone and continues the run, and the open stream simply goes on."""
    with home.server() as a, home.server() as b:
        run_id = a.start(ticker(80, 0.05), run_id="watched")["run_id"]
        got: list[tuple[int, dict[str, Any]]] = []

        def kill_a_once_watching() -> None:
            wait_until(lambda: len(got) >= 10, "events before the kill", timeout=30)
            a.stop(signal.SIGKILL)

        killer = threading.Thread(target=kill_a_once_watching)
        killer.start()
        with httpx.Client(base_url=b.url, timeout=90) as c, c.stream(
            "GET", f"/v1/runs/{run_id}/events"
        ) as r:
            for name, ident, data in sse_events(r.iter_lines()):
                if name == "end":
                    break
                assert ident is not None
                got.append((int(ident), json.loads(data)))
        killer.join()
        assert [o for o, _ in got] == list(range(1, len(got) + 1))
        assert [e for _, e in got] == home.log(run_id)
        assert got[-1][1]["type"] == "RUN_FINISHED"


def test_sigterm_detaches_the_servers_runs_for_others(home: Home) -> None:
    """A server stopping cleanly ends its streams, detaches every run it drives (lease
    released, marked unwatched) and exits; a viewer on another server continues at once."""
    with home.server() as a, home.server() as b:
        run_id = a.start(ticker(60, 0.05), run_id="handover")["run_id"]
        first, _ = read_stream(a, run_id, limit=6)
        a.stop(signal.SIGTERM, timeout=15)
        # A clean stop (uvicorn re-raises the SIGTERM it handled), not stop()'s SIGKILL
        # fallback after a hang.
        assert a.proc.returncode in (0, -signal.SIGTERM), "".join(a.log)
        assert "Application shutdown complete" in "".join(a.log)
        record = home.raw(run_id)
        assert record["status"] == "running"
        assert record.get("claim_owner") is None and record.get("detached_since") is not None
        rest, ended = read_stream(b, run_id, last_event_id=first[-1][0], timeout=60)
        assert ended
        events = [e for _, e in first + rest]
        assert [o for o, _ in first + rest] == list(range(1, len(events) + 1))
        assert events == home.log(run_id) and events[-1]["type"] == "RUN_FINISHED"
