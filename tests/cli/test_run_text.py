"""``corral ls`` and ``corral show`` for a person (issue #31, item 6): local times with the
zone, "3 min ago", durations, the command cut to fit, aligned; ``--json`` keeps the machine
form. Text checked exactly."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.cli._records import ls_table, show_text
from corral.stores._records import RunError, RunRecord, RunStatus
from tests.corral_cli import CliHome

T0 = 1_780_000_000.0  # 2026-05-28 20:26:40 UTC


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _record(run_id: str, **kw: object) -> RunRecord:
    base: dict[str, object] = dict(run_id=run_id, thread_id="t1", status=RunStatus.COMPLETED,
                                   started_at=T0, updated_at=T0 + 2, finished_at=T0 + 1.25,
                                   exit_code=0, harness="command",
                                   spec={"argv": ["sh", "-c", "echo hello; make test"]})
    base.update(kw)
    return RunRecord(**base)  # type: ignore[arg-type]


def test_ls_has_command_and_duration_columns_aligned_and_cut() -> None:
    runs = [_record("run-a"),
            _record("run-b", status=RunStatus.RUNNING, finished_at=None, exit_code=None,
                    harness="claude-code", spec={"harness_options": {"model": "opus"}},
                    detached_since=T0 + 5),
            _record("run-c", spec={"argv": ["python", "-c", "x" * 200]})]
    lines = ls_table(runs, now=T0 + 185, width=100)
    assert lines == [
        "RUN_ID  THREAD  STATUS              EXIT  STARTED    DURATION   COMMAND",
        "run-a   t1      completed           0     3 min ago  1.2 s      sh -c 'echo hello; make test'",
        "run-b   t1      running (detached)        3 min ago  3 min 5 s  [claude-code opus]",
        "run-c   t1      completed           0     3 min ago  1.2 s      python -c "
        + "x" * 25 + "…",
    ]
    assert all(len(line) <= 100 for line in lines)


def test_an_empty_ls_still_prints_its_header() -> None:
    assert ls_table([], now=T0, width=80) == [
        "RUN_ID  THREAD  STATUS  EXIT  STARTED  DURATION  COMMAND"]


def test_show_is_for_people() -> None:
    record = _record("run-f", status=RunStatus.FAILED, exit_code=3,
                     error=RunError("command exited with code 3", "exit:3"),
                     sandbox_ref={"provider": "bubblewrap", "id": "sb-1"})
    assert "\n".join(show_text(record, ["tokens            1 in, 2 out"], now=T0 + 7200)) + "\n" \
        == (
        "run run-f: failed (exit 3)\n"
        "  thread            t1\n"
        "  command           sh -c 'echo hello; make test'\n"
        "  started           2026-05-28 20:26:40 UTC (2 h ago)\n"
        "  finished          2026-05-28 20:26:41 UTC (took 1.2 s)\n"
        "  error             command exited with code 3 [exit:3]\n"
        "  sandbox           bubblewrap sb-1\n"
        "  tokens            1 in, 2 out\n")


@pytest.mark.usefixtures("need_bwrap_runs")
def test_the_cli_prints_the_human_forms_and_json_keeps_the_machine_form(
        corral_cmd: list[str], cli_env: dict[str, str], corral_home: Path) -> None:
    cli = CliHome(corral_cmd, {**cli_env, "TZ": "UTC"}, corral_home)
    empty = cli.run("ls")
    assert (empty.returncode, empty.stdout) == (
        0, "RUN_ID  THREAD  STATUS  EXIT  STARTED  DURATION  COMMAND\n")
    assert cli.run("run", "--run-id", "r1", "--", "echo", "hi there").returncode == 0
    listed = cli.run("ls").stdout.splitlines()
    assert listed[0].split() == ["RUN_ID", "THREAD", "STATUS", "EXIT", "STARTED", "DURATION",
                                 "COMMAND"]
    assert listed[1].startswith("r1  ") and listed[1].endswith("  echo 'hi there'")
    shown = cli.run("show", "r1").stdout
    assert shown.startswith("run r1: completed (exit 0)\n  thread            r1\n"
                            "  command           echo 'hi there'\n  started           ")
    assert " UTC (" in shown and shown.endswith("\n") and "False" not in shown
    machine = json.loads(cli.run("show", "r1", "--json").stdout)
    assert machine["status"] == "completed" and isinstance(machine["started_at"], float)
    assert machine["cancel_requested"] is False
