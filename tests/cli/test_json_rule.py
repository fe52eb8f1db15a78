"""One ``--json`` rule (issue #31, item 7): a command that gives one answer prints one JSON
document (``ls``, ``show``, ``cancel``, ``doctor``, ``gc``, ``agents ls/install``,
``images build``, ``approve --list``), a command that streams prints JSON lines (``run``,
``attach``, ``exec``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.corral_cli import CliHome


def test_exec_streams_json_lines_and_ends_with_the_outcome(
        corral_cmd: list[str], cli_env: dict[str, str]) -> None:
    r = subprocess.run([*corral_cmd, "exec", "--provider", "local", "--json", "--", "sh", "-c",
                        "echo out; exit 3"], env=cli_env, capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 3
    assert r.stdout == ('{"stream":"stdout","data":"out\\n"}\n'
                        '{"exit_code":3,"signal":null,"timed_out":false}\n')


@pytest.mark.usefixtures("need_bwrap_runs")
def test_cancel_and_ls_answer_with_one_document(
        corral_cmd: list[str], cli_env: dict[str, str], corral_home: Path) -> None:
    cli = CliHome(corral_cmd, {**cli_env, "CORRAL_LEASE_TTL": "3"}, corral_home)
    started = cli.run("run", "--run-id", "c1", "--detach", "--json", "--", "sleep", "60")
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout)["run_id"] == "c1"
    cancelled = cli.run("cancel", "c1", "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.count("\n") == 1
    assert json.loads(cancelled.stdout)["status"] == "aborted"
    listed = cli.run("ls", "--json")
    assert listed.stdout.count("\n") == 1 and [r["run_id"] for r in json.loads(listed.stdout)] \
        == ["c1"]
