"""A viewer that closes its pipe leaves; the run goes on (issue #26, defect 1), CLI level.

``corral run … | head -2``: the reader of corral's standard output goes away mid-run. As
``git log | head`` does, the command exits quietly (status 141, 128 + SIGPIPE; no
traceback), and the run goes on as a detached run: attachable, reapable, its sandbox
reclaimed when it ends, nothing lost. Every command that prints exits quietly the same way.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path

import anyio
import pytest

from corral.journal._layout import read_status
from corral.providers._bubblewrap import BubblewrapProvider
from tests.helpers import wait_until
from tests.runs.test_runner_e2e import Cli, live_sandboxes

pytestmark = pytest.mark.usefixtures("need_bwrap_runs")

VIEWER_LEFT = 141  # 128 + SIGPIPE, as a shell reports for `git log | head` (pipefail)

# Two lines, then the test's go-ahead (a file in the sandbox's workspace), then 40 more.
AGENT = ["sh", "-c", "echo one; echo two; while [ ! -e go ]; do sleep 0.05; done; "
         "i=0; while [ $i -lt 40 ]; do echo tick $i; i=$((i+1)); done"]
WANT = "one\ntwo\n" + "".join(f"tick {i}\n" for i in range(40))


@pytest.fixture
def cli(corral_cmd: list[str], cli_env: dict[str, str], corral_home: Path) -> Cli:
    cli_env["CORRAL_LEASE_TTL"] = "3"
    return Cli(corral_cmd, cli_env, corral_home)


def _go(home: Path, sandbox_id: str) -> None:
    async def go() -> None:
        handle = await BubblewrapProvider(home=home).resume(sandbox_id)
        assert handle is not None
        await handle.fs.write("go", b"")

    anyio.run(go)


def _agent_exited(cli: Cli, run_id: str) -> bool:
    status = read_status(cli.journal(run_id).status)
    return status is not None and status.state == "exited"


def _run_then_close_the_pipe(cli: Cli, run_id: str) -> str:
    """``corral run --json … | head -4``: read until the agent's two lines are printed, close
    the pipe, let the agent go on; return the run's sandbox id once the command exited."""
    proc = cli.popen("run", "--run-id", run_id, "--json", "--", *AGENT)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        seen = ""
        while "two" not in seen:
            line = proc.stdout.readline()
            assert line, "corral run ended before printing the agent's lines"
            seen += json.loads(line)["event"].get("delta", "")
        proc.stdout.close()  # the viewer leaves (head -N exits)
        sandbox_id = cli.raw_record(run_id)["sandbox_ref"]["id"]
        _go(cli.home, sandbox_id)  # more output: corral's next write finds the pipe closed
        err = proc.stderr.read()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Before the fix: a 60-line BrokenPipeError traceback, and the run ended aborted.
    assert proc.returncode == VIEWER_LEFT, err
    assert "Traceback" not in err and "Error" not in err, err
    assert err.strip().splitlines() == [
        f"corral: run {run_id} started (thread {run_id}); Ctrl-C detaches, twice cancels"], err
    record = cli.raw_record(run_id)
    assert record["status"] == "running", record
    assert record.get("detached_since") is not None and not record.get("cancel_requested")
    assert not cli.closed(run_id)
    return str(sandbox_id)


def test_a_closed_pipe_detaches_the_run_and_attach_finishes_it(cli: Cli) -> None:
    sandbox_id = _run_then_close_the_pipe(cli, "piped")
    out = cli.run("attach", "piped", "--json")
    assert out.returncode == 0, out.stderr
    assert cli.text("piped") == WANT  # nothing lost, nothing repeated
    assert cli.log("piped")[-1]["type"] == "RUN_FINISHED"
    assert sandbox_id not in live_sandboxes()


def test_a_closed_pipe_leaves_a_run_the_reaper_finishes(cli: Cli) -> None:
    sandbox_id = _run_then_close_the_pipe(cli, "reaped")
    wait_until(lambda: _agent_exited(cli, "reaped"), "the agent's exit", timeout=60)
    out = cli.run("reap", "--json")
    assert out.returncode == 0, out.stderr
    [entry] = json.loads(out.stdout)["runs"]
    assert (entry["run_id"], entry["outcome"], entry["status"]) == (
        "reaped", "finalized", "completed")
    assert cli.text("reaped") == WANT
    assert sandbox_id not in live_sandboxes()  # nothing leaked


def _with_closed_stdout(cli: Cli, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``corral ARGS`` whose standard output is a pipe nobody reads any more."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([*cli.cmd, *args], env=cli.env, stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120, check=False,
                              cwd=cli.home)
    finally:
        os.close(write_end)


def test_every_command_that_prints_exits_quietly_on_a_closed_pipe(cli: Cli) -> None:
    assert cli.run("run", "--run-id", "done", "--", "echo", "hi").returncode == 0
    for args in (["show", "done"], ["show", "done", "--json"], ["ls"], ["ls", "--json"],
                 ["attach", "done"], ["attach", "done", "--json"], ["reap", "--json"],
                 ["run", "--run-id", "fresh", "--json", "--", "echo", "hi"],
                 ["run", "--detach", "--run-id", "bg", "--", "true"], ["sandboxes", "ls"],
                 ["exec", "--", "echo", "hi"]):
        out = _with_closed_stdout(cli, *args)
        # Before the fix: a BrokenPipeError traceback (or "Exception ignored"), status 1/120.
        assert out.returncode == VIEWER_LEFT, (args, out.returncode, out.stderr)
        assert "Traceback" not in out.stderr and "Exception" not in out.stderr, (
            args, out.stderr)
    for args in (["--help"], ["--version"], ["ls", "--help"]):
        out = _with_closed_stdout(cli, *args)  # argparse's output: quiet on its own
        assert out.returncode in (0, VIEWER_LEFT) and out.stderr == "", (args, out)
    # The runs whose viewer was never there went on, detached; the reaper finishes them
    # once their agents exited, and no sandbox is left (exec's was destroyed at once).
    for run_id in ("fresh", "bg"):
        wait_until(functools.partial(_agent_exited, cli, run_id), f"{run_id}'s agent to exit",
                   timeout=60)
    reaped = cli.run("reap", "--json")
    assert reaped.returncode == 0, reaped.stderr
    for run_id in ("done", "fresh", "bg"):
        assert cli.raw_record(run_id)["status"] == "completed", run_id
    assert cli.text("fresh") == "hi\n"
    assert live_sandboxes() == []
