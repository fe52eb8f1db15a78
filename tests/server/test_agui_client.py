"""A run's event stream read by the official AG-UI client (``@ag-ui/client`` from npm, its
own HTTP transport, SSE parser and event verification; tests/server/e2e/agui_stream.mjs).

Before the fix the stream ended with an ``event: end`` / ``data: {}`` frame, which the client
takes for an event without a type: every run ended in an error for AG-UI clients.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from corral.testing import wait_until
from tests.server.conftest import TOKEN, Home, ticker


def read_with_agui_client(e2e: Path, url: str, token: str) -> list[str]:
    done = subprocess.run(["node", str(e2e / "agui_stream.mjs"), url, token],
                          capture_output=True, text=True, timeout=120, cwd=e2e)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return lines


def test_the_official_client_reads_a_finished_run_and_verifies_it(home: Home,
                                                                  e2e: Path) -> None:
    with home.server(token=TOKEN) as server:
        run_id = server.start(ticker(5, 0.01))["run_id"]
        wait_until(lambda: server.run(run_id)["status"] == "completed", "the run's end")
        lines = read_with_agui_client(e2e, f"{server.url}/v1/runs/{run_id}/events", TOKEN)
    assert lines[-1] == "VERIFIED", lines
    assert [json.loads(line) for line in lines[:-1]] == home.log(run_id)


def test_the_official_client_follows_a_live_run_to_its_end(home: Home, e2e: Path) -> None:
    with home.server(token=TOKEN) as server:
        run_id = server.start(ticker(30, 0.05))["run_id"]
        lines = read_with_agui_client(e2e, f"{server.url}/v1/runs/{run_id}/events", TOKEN)
        assert server.run(run_id)["status"] == "completed"
    assert lines[-1] == "VERIFIED", lines
    events = [json.loads(line) for line in lines[:-1]]
    assert events == home.log(run_id)
    assert events[0]["type"] == "RUN_STARTED" and events[-1]["type"] == "RUN_FINISHED"
