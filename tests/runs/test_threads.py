"""Threads (#27) with the command harness on bubblewrap, through the real CLI: each turn in a
fresh sandbox gets the thread's workspace from its checkpoints; undo (down to the state
before the first turn), refused while a run is active; the size cap; a secret never enters
a thread's checkpoint; ``corral threads rm`` (with ``--runs``: the runs and their logs
too)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.corral_cli import CliHome
from tests.helpers import one_line_refusal, wait_until

pytestmark = pytest.mark.usefixtures("need_bwrap_runs")


class Cli(CliHome):
    def ok(self, *args: str) -> subprocess.CompletedProcess[str]:
        out = self.run(*args)
        assert out.returncode == 0, out.stderr[-3000:]
        return out

    def turn(self, thread: str, run_id: str, script: str, ws: Path) -> str:
        """Run ``script`` as a turn of ``thread``; its output."""
        out = self.ok("run", "--thread", thread, "--run-id", run_id, "--workspace", str(ws),
                      "--", "sh", "-c", script)
        return out.stdout

    def show(self, thread: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.ok("threads", "show", thread, "--json").stdout)
        return data


@pytest.fixture
def cli(corral_cmd: list[str], cli_env: dict[str, str], corral_home: Path) -> Cli:
    cli_env["CORRAL_LEASE_TTL"] = "3"
    return Cli(corral_cmd, cli_env, corral_home)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "seed.txt").write_text("seed\n")
    return ws


def test_each_turn_continues_the_workspace_and_undo_goes_back_to_the_start(
        cli: Cli, ws: Path) -> None:
    # reuse "none" (the CLI's default without a corral.toml): a fresh sandbox every turn
    cli.turn("T", "r1", "echo a > f.txt", ws)
    assert cli.turn("T", "r2", "cat f.txt; echo b > f.txt", ws).strip() == "a"
    assert cli.turn("T", "r3", "cat f.txt", ws).strip() == "b"
    shown = cli.show("T")
    assert [r["checkpoint"].keys() >= {"id", "bytes"} for r in shown["runs"]] == [True] * 3
    # undo r3 (read only: the state after r2), then r2 (the state after r1), then r1
    cli.ok("threads", "undo", "T")
    assert cli.turn("T", "r4", "cat f.txt", ws).strip() == "b"
    for _ in range(3):  # r4, r2, r1
        cli.ok("threads", "undo", "T")
    assert cli.turn("T", "r5", "ls", ws).split() == ["seed.txt"]
    undone = {r["run_id"] for r in cli.show("T")["runs"] if r.get("undone_at")}
    assert undone == {"r1", "r2", "r3", "r4"}
    # r5 is the one live turn: undo it, and nothing is left
    cli.ok("threads", "undo", "T")
    refused = cli.run("threads", "undo", "T")
    one_line_refusal(refused, "no turn left to undo")
    # the run history is kept, marked
    listed = json.loads(cli.ok("threads", "ls", "--json").stdout)
    assert listed[0]["thread_id"] == "T" and listed[0]["runs"] == 5


def test_undo_is_refused_while_a_run_of_the_thread_is_active(cli: Cli, ws: Path) -> None:
    cli.turn("T", "r1", "echo a > f.txt", ws)
    running = cli.popen("run", "--thread", "T", "--run-id", "r2", "--workspace", str(ws),
                        "--", "sleep", "600", quiet=True)
    try:
        wait_until(lambda: (cli.raw("r2") or {}).get("sandbox_ref") is not None
                   and (cli.raw("r2") or {}).get("status") == "running", "r2 running",
                   timeout=60)
        for args in (("undo", "T"), ("rm", "T"), ("rm", "T", "--runs")):
            refused = cli.run("threads", *args)
            one_line_refusal(refused, "active run (r2)", "corral cancel r2")
        # a fork reads only finished turns' checkpoints: the state before r2
        cli.ok("threads", "fork", "T", "--as", "F")
    finally:
        cli.ok("cancel", "r2")
        running.wait(60)
    cli.ok("threads", "undo", "T")  # r1 (r2 was cancelled: aborted runs are turns too)


def test_a_workspace_over_the_checkpoint_cap_is_skipped_or_an_error_never_a_failed_run(
        cli: Cli, ws: Path) -> None:
    for choice in ("skip", "error"):
        (ws / "corral.toml").write_text(
            f'id = "cap"\n[lifecycle]\nreuse = "none"\ncheckpoint_max_size = "4KiB"\n'
            f'on_checkpoint_too_large = "{choice}"\n')
        thread = f"T-{choice}"
        cli.turn(thread, f"r-{choice}", "head -c 20000 /dev/zero > big", ws)
        [run] = cli.show(thread)["runs"]
        assert run["status"] == "completed"
        if choice == "skip":
            assert "over the checkpoint size cap" in run["checkpoint"]["skipped"]
        else:
            assert "over the checkpoint size cap of 4096 bytes" in run["checkpoint"]["error"]
        refused = cli.run("threads", "fork", thread, "--as", f"F-{choice}", "--at",
                          f"r-{choice}")
        one_line_refusal(refused, "no checkpoint of its state after run", "none was taken")


def test_a_secret_never_enters_a_threads_checkpoint(cli: Cli, ws: Path) -> None:
    """The agent writes a secret's value into the workspace: the thread's checkpoint leaves
    that file out (the next turn's fresh sandbox does not have it), and the store's file
    never holds the value."""
    value = "sk-THREADSECRET-5b7d1e"
    cli.env["CORRAL_TEST_SECRET"] = value
    (ws / "corral.toml").write_text(
        'id = "leak"\n[secrets]\nTOKEN = { env = "CORRAL_TEST_SECRET" }\n'
        '[lifecycle]\nreuse = "none"\n')
    cli.turn("T", "r1", 'echo "$TOKEN" > leak.txt; echo fine > ok.txt', ws)
    assert cli.turn("T", "r2", "ls", ws).split() == ["corral.toml", "ok.txt", "seed.txt"]
    with sqlite3.connect(cli.db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for path in [p for p in cli.home.glob("corral.db*") if p.is_file()]:
        assert value.encode() not in path.read_bytes(), path


def test_rm_removes_checkpoints_sessions_and_keeps_runs(cli: Cli, ws: Path) -> None:
    cli.turn("T", "r1", "echo a > f.txt", ws)
    removed = json.loads(cli.ok("threads", "rm", "T", "--json").stdout)
    assert removed["checkpoints"] == 2  # the state before r1, and after it
    shown = cli.show("T")
    assert shown["checkpoints"] == [] and [r["run_id"] for r in shown["runs"]] == ["r1"]
    assert cli.turn("T", "r2", "ls", ws).split() == ["seed.txt"]
    one_line_refusal(cli.run("threads", "show", "nope"), "no thread 'nope'")
    one_line_refusal(cli.run("threads", "fork", "T", "--as", "../x"), "is not allowed")


def test_rm_with_runs_removes_the_runs_and_their_logs_too(cli: Cli, ws: Path) -> None:
    cli.turn("T", "r1", "echo a > f.txt", ws)
    cli.turn("T", "r2", "cat f.txt", ws)
    cli.turn("U", "u1", "echo u > u.txt", ws)  # another thread: untouched
    removed = json.loads(cli.ok("threads", "rm", "T", "--runs", "--json").stdout)
    assert removed["runs"] == 2 and removed["checkpoints"] == 3, removed
    one_line_refusal(cli.run("threads", "show", "T"), "no thread 'T'")
    with sqlite3.connect(cli.db) as conn:
        for table in ("runs", "events", "approvals"):
            assert conn.execute(f"SELECT count(*) FROM {table} WHERE run_id IN "
                                "('r1', 'r2')").fetchone() == (0,), table
        assert conn.execute("SELECT count(*) FROM events WHERE run_id = 'u1'"
                            ).fetchone()[0] > 0
    assert cli.raw("r1") is None
    assert [r["run_id"] for r in cli.show("U")["runs"]] == ["u1"]
    assert cli.turn("U", "u2", "cat u.txt", ws).strip() == "u"
    # the run ids may be used again, for a new thread's first turn
    assert cli.turn("T", "r1", "ls", ws).split() == ["seed.txt"]
