"""``corral cancel`` of a run nobody drives logs what its journal holds first (issue #26,
defect 3): the output the agent wrote before its stop reaches the log, then the log ends
with the cancel's ``RUN_ERROR``. A run left alone (detached) and one whose driver was
SIGKILLed, on bubblewrap; the docker provider's case is in ``test_docker_cancel.py``."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from corral.journal._supervisor import process_alive
from tests.helpers import wait_until
from tests.runs.test_runner_e2e import Cli as CliHome
from tests.runs.test_runner_e2e import _agent_pid, live_sandboxes

pytestmark = pytest.mark.usefixtures("need_bwrap_runs")

LINES = 40
# 40 lines at once, then a long wait for the cancel (never its end).
AGENT = ["sh", "-c", f"i=0; while [ $i -lt {LINES} ]; do echo line $i; i=$((i+1)); done; "
         "sleep 120; echo never"]
WANT = "".join(f"line {i}\n" for i in range(LINES))


@pytest.fixture
def cli(corral_cmd: list[str], cli_env: dict[str, str], corral_home: Path) -> CliHome:
    cli_env["CORRAL_LEASE_TTL"] = "3"
    return CliHome(corral_cmd, cli_env, corral_home)


def _journal_lines(cli: CliHome, run_id: str) -> int:
    path = cli.journal(run_id).journal
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _cancelled_with_everything(cli: CliHome, run_id: str) -> list[dict[str, Any]]:
    sandbox_id = cli.raw_record(run_id)["sandbox_ref"]["id"]
    pid = _agent_pid(cli, run_id)
    out = cli.run("cancel", run_id)
    assert out.returncode == 0, out.stderr
    assert not process_alive(pid)
    record = json.loads(cli.run("show", run_id, "--json").stdout)
    assert record["status"] == "aborted" and record["cancel_requested"] is True
    log = cli.log(run_id)
    # Before the fix: RUN_STARTED, TEXT_MESSAGE_START, RUN_ERROR only.
    assert cli.text(run_id) == WANT
    assert log[-1]["type"] == "RUN_ERROR" and log[-1].get("code") == "aborted"
    assert [e["type"] for e in log].count("RUN_ERROR") == 1
    assert cli.closed(run_id)
    assert sandbox_id not in live_sandboxes()
    return log


def test_cancel_of_a_detached_run_logs_its_output_first(cli: CliHome) -> None:
    out = cli.run("run", "--detach", "--run-id", "quiet", "--", *AGENT)
    assert out.returncode == 0, out.stderr
    wait_until(lambda: _journal_lines(cli, "quiet") >= LINES, "the agent's 40 lines",
               timeout=30)
    _cancelled_with_everything(cli, "quiet")


def test_cancel_of_a_run_whose_driver_died_logs_its_output_first(cli: CliHome) -> None:
    driver = cli.popen("run", "--run-id", "orphan", "--json", "--", *AGENT)
    assert driver.stdout is not None
    try:
        assert "RUN_STARTED" in driver.stdout.readline()
        wait_until(lambda: _journal_lines(cli, "orphan") >= LINES, "the agent's 40 lines",
                   timeout=30)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.communicate(timeout=30)
    _cancelled_with_everything(cli, "orphan")
