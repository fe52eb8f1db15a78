"""``corral cancel`` of a docker run nobody drives logs what its journal holds first (issue
#26, defect 3, the docker provider's case; bubblewrap's is ``test_cancel_keeps_output.py``).
The journal lives in the container, so the cancel must read it before the container goes."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from corral.journal._layout import encode_run_id
from corral.providers._docker import DockerProvider
from tests.corral_cli import CliHome
from tests.helpers import wait_until
from tests.runs.test_docker_multihost import _container_exists

pytestmark = pytest.mark.usefixtures("need_docker")

LINES = 40
AGENT = ["sh", "-c", f"i=0; while [ $i -lt {LINES} ]; do echo line $i; i=$((i+1)); done; "
         "sleep 120; echo never"]
WANT = "".join(f"line {i}\n" for i in range(LINES))


def _journal_lines(sandbox_id: str, run_id: str) -> int:
    async def read() -> int:
        handle = await DockerProvider().resume(sandbox_id)
        assert handle is not None
        data = await handle.read_journal(encode_run_id(run_id), "journal", 0)
        return (data or b"").count(b"\n")

    return anyio.run(read)


def test_cancel_of_a_detached_docker_run_logs_its_output_first(
        corral_cmd: list[str], cli_env: dict[str, str], corral_home: Path) -> None:
    cli = CliHome(corral_cmd, {**cli_env, "CORRAL_LEASE_TTL": "5"}, corral_home)
    out = cli.run("run", "--provider", "docker", "--detach", "--run-id", "dq", "--", *AGENT,
                  timeout=300)
    assert out.returncode == 0, out.stderr
    raw = cli.raw("dq")
    assert raw is not None
    sandbox_id = raw["sandbox_ref"]["id"]
    wait_until(lambda: _journal_lines(sandbox_id, "dq") >= LINES, "the agent's 40 lines",
               timeout=60)
    out = cli.run("cancel", "dq", timeout=300)
    assert out.returncode == 0, out.stderr
    record = json.loads(cli.run("show", "dq", "--json").stdout)
    assert record["status"] == "aborted" and record["cancel_requested"] is True
    log = cli.log("dq")
    # Before the fix: RUN_STARTED, TEXT_MESSAGE_START, RUN_ERROR only.
    assert cli.text("dq") == WANT
    assert log[-1]["type"] == "RUN_ERROR" and [e["type"] for e in log].count("RUN_ERROR") == 1
    assert cli.closed("dq")
    assert not _container_exists(sandbox_id)
