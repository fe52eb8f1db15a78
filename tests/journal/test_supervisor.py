"""The supervisor with real processes: exit codes, signals, cancel, surviving its launcher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from corral._errors import ConfigError
from corral.journal._reader import Exit, Line, probe_journal_tail, read_journal
from corral.journal._layout import JournalPaths, read_status
from corral.journal._sentinel import new_nonce
from corral.journal._supervisor import (
    AgentSpec,
    kill_supervised,
    launch_supervised,
    process_start_time,
    supervisor_alive,
)

from corral.testing import wait_until

from .conftest import run_async, BASE_ENV, PY, Launched, wait_exited

SRC = Path(__file__).resolve().parents[2] / "src"


def collect(launched: Launched, **kw: object) -> tuple[list[Line], Exit | None]:
    async def go() -> tuple[list[Line], Exit | None]:
        lines: list[Line] = []
        async for item in read_journal(launched.paths, nonce=launched.nonce, **kw):  # type: ignore[arg-type]
            if isinstance(item, Exit):
                return lines, item
            lines.append(item)
        return lines, None

    return run_async(go)


def stdout_of(lines: list[Line]) -> bytes:
    return b"\n".join(line.data for line in lines)


def test_exit_code_stdout_and_stderr_sidecar(launch) -> None:
    run = launch(["sh", "-c", "echo one; echo two >&2; printf three; exit 3"])
    lines, exit = collect(run)
    assert stdout_of(lines) == b"one\nthree"
    assert exit is not None and (exit.code, exit.signal) == (3, None)
    assert exit.stderr_tail == b"two\n"
    wait_exited(run.paths)  # the status is written after the trailer (module docstring)
    st = read_status(run.paths.status)
    assert st is not None and st.exit_code == 3
    assert run.paths.stderr.read_bytes() == b"two\n"


def test_stdin_bytes_reach_the_agent(launch) -> None:
    run = launch(["cat"], stdin=b"hello\nworld")
    lines, exit = collect(run)
    assert stdout_of(lines) == b"hello\nworld"
    assert exit is not None and exit.code == 0


def test_signal_death_is_128_plus_n_with_the_signal(launch) -> None:
    run = launch(["sh", "-c", "echo before; kill -KILL $$"])
    lines, exit = collect(run)
    assert stdout_of(lines) == b"before\n"
    assert exit is not None and (exit.code, exit.signal) == (137, signal.SIGKILL)


def test_spawn_failure_still_ends_with_a_sentinel(launch) -> None:
    run = launch(["/nonexistent/agent-binary"])
    assert run.run.spawn_error and "agent-binary" in run.run.spawn_error
    lines, exit = collect(run)
    assert stdout_of(lines) == b""
    assert exit is not None and exit.code == 127
    assert b"cannot start agent" in exit.stderr_tail


def test_kill_supervised_terminates_agent_and_sentinel_records_the_signal(launch) -> None:
    run = launch(["sh", "-c", "echo started; exec sleep 600"])
    wait_until(lambda: run.paths.journal.read_bytes() == b"started\n", "first line", timeout=20.0)
    assert supervisor_alive(run.paths)
    assert probe_journal_tail(run.paths, run.nonce).state == "producing"
    assert kill_supervised(run.paths, grace=5.0) is True
    lines, exit = collect(run)
    assert stdout_of(lines) == b"started\n"
    assert exit is not None and (exit.code, exit.signal) == (143, signal.SIGTERM)
    wait_until(lambda: not supervisor_alive(run.paths), "supervisor exit", timeout=20.0)
    probe = probe_journal_tail(run.paths, run.nonce)
    assert (probe.state, probe.code, probe.signal) == ("finished", 143, signal.SIGTERM)


def test_kill_supervised_escalates_to_sigkill(launch) -> None:
    script = "import signal,time,sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); " \
             "print('armed', flush=True); time.sleep(600)"
    run = launch([PY, "-c", script])
    wait_until(lambda: run.paths.journal.read_bytes() == b"armed\n", "agent armed", timeout=20.0)
    assert kill_supervised(run.paths, grace=0.5) is True
    _, exit = collect(run)
    assert exit is not None and exit.signal == signal.SIGKILL


def test_sigterm_to_the_supervisor_is_forwarded_and_the_sentinel_written(launch) -> None:
    run = launch(["sh", "-c", "echo up; exec sleep 600"])
    wait_until(lambda: run.paths.journal.read_bytes() == b"up\n", "agent up", timeout=20.0)
    os.kill(run.run.supervisor_pid, signal.SIGTERM)
    _, exit = collect(run)
    assert exit is not None and exit.signal == signal.SIGTERM


def test_pid_reuse_is_detected(launch) -> None:
    run = launch(["true"])
    wait_exited(run.paths)
    st = read_status(run.paths.status)
    assert st is not None
    # A live process whose pid matches but whose start time does not is not "ours".
    forged = json.loads(run.paths.status.read_text())
    forged.update(state="running", supervisor_pid=os.getpid(), supervisor_start=1)
    run.paths.status.write_text(json.dumps(forged))
    assert process_start_time(os.getpid()) != 1
    assert not supervisor_alive(run.paths)


def test_bad_launch_arguments_raise_config_errors(jdir: Path) -> None:
    paths = JournalPaths.for_run(jdir, "bad")
    with pytest.raises(ConfigError, match="argv"):
        launch_supervised(AgentSpec(argv=[]), paths, new_nonce())
    with pytest.raises(ConfigError, match="nonce"):
        launch_supervised(AgentSpec(argv=["true"]), paths, "not-a-nonce")


LAUNCHER = r"""
import json, sys, time
from corral.journal._layout import JournalPaths
from corral.journal._supervisor import AgentSpec, launch_supervised
cfg = json.loads(sys.stdin.read())
run = launch_supervised(AgentSpec(cfg["argv"], cfg["env"]), JournalPaths.for_run(cfg["dir"], "survivor"), cfg["nonce"])
print(json.dumps({"supervisor_pid": run.supervisor_pid, "agent_pid": run.agent_pid}), flush=True)
time.sleep(600)
"""


def test_supervisor_and_agent_survive_sigkill_of_the_launcher(jdir: Path, tmp_path: Path) -> None:
    go = tmp_path / "go"
    nonce = new_nonce()
    agent = ["sh", "-c", f"echo waiting; while [ ! -e {go} ]; do sleep 0.01; done; echo done; exit 5"]
    env = dict(os.environ, PYTHONPATH=str(SRC))
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    paths = JournalPaths.for_run(jdir, "survivor")
    try:
        assert launcher.stdin is not None and launcher.stdout is not None
        launcher.stdin.write(json.dumps(
            {"argv": agent, "env": BASE_ENV, "dir": str(jdir), "nonce": nonce}).encode())
        launcher.stdin.close()
        info = json.loads(launcher.stdout.readline())
        launcher.send_signal(signal.SIGKILL)
        assert launcher.wait(10) == -signal.SIGKILL
        # The launcher is dead; its descendants are not.
        assert supervisor_alive(paths)
        assert process_start_time(info["agent_pid"]) is not None
        wait_until(lambda: paths.journal.read_bytes().startswith(b"waiting\n"),
                   "agent", timeout=20.0)
        go.touch()
        wait_exited(paths)
        data = paths.journal.read_bytes()
        assert data == b"waiting\ndone\n\n" + (
            b'{"corral_exit":1,"code":5,"signal":null,"nonce":"' + nonce.encode() + b'"}\n'
        )
        probe = probe_journal_tail(paths, nonce)
        assert (probe.state, probe.code) == ("finished", 5)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        kill_supervised(paths, grace=1.0, include_supervisor=True)


def test_kill_supervised_stops_an_orphaned_agent_after_supervisor_death(launch) -> None:
    run = launch(["sh", "-c", "echo up; exec sleep 600"])
    wait_until(lambda: run.paths.journal.read_bytes() == b"up\n", "agent up", timeout=20.0)
    os.kill(run.run.supervisor_pid, signal.SIGKILL)
    wait_until(lambda: not supervisor_alive(run.paths), "supervisor death", timeout=20.0)
    agent = run.run.agent_pid
    assert agent is not None and process_start_time(agent) is not None
    assert kill_supervised(run.paths, grace=5.0) is False  # no exit can be recorded any more
    wait_until(lambda: process_start_time(agent) is None, "orphaned agent reaped", timeout=20.0)
    probe = probe_journal_tail(run.paths, run.nonce, now=10**12)
    assert probe.state == "unknown"
