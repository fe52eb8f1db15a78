"""`corral run --harness claude-code|codex`: the real CLIs as durable runs.

Real bubblewrap sandboxes, real SQLite, `corral` in subprocesses, the scripted model server
on 127.0.0.1 as the host's ``ANTHROPIC_BASE_URL`` / ``OPENAI_BASE_URL`` (the model proxy the
Runner starts forwards to it with the "real" key, which must never enter the sandbox or the
store).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
from collections.abc import Callable, Iterator

from pathlib import Path
from typing import Any

import pytest

from corral.journal._layout import JournalPaths, read_status
from corral.testing._model_script import ModelRequest, Reply, Text, ToolCall
from corral.testing._model_server import ModelServer

from .conftest import agent_cli_env
from tests.helpers import HelloServer, trusted, wait_until

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("bwrap")]

EDIT = "printf 'edited by the agent\\n' > note.txt && cat note.txt"
TOOL_EVENTS = ("TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT")


class Corral:
    """`corral` in subprocesses against one private home, the model server as upstream."""

    def __init__(self, cmd: list[str], env: dict[str, str], home: Path, srv: ModelServer
                 ) -> None:
        self.cmd, self.env, self.home, self.srv = cmd, env, home, srv
        self.db = home / "corral.db"

    def run(self, *args: str, timeout: float = 180, cwd: Path | None = None
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.cmd, *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout, cwd=cwd, check=False)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([*self.cmd, *args], env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def agent(self, cli: str, run_id: str, prompt: str, *extra: str
              ) -> subprocess.CompletedProcess[str]:
        return self.run("run", "--harness", cli, *model_args(cli), "--run-id", run_id,
                        "--json", *extra, prompt)

    def raw_record(self, run_id: str) -> dict[str, Any]:
        with sqlite3.connect(self.db) as conn:
            (doc,) = conn.execute("SELECT doc FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        data: dict[str, Any] = json.loads(doc)
        return data

    def log(self, run_id: str) -> list[dict[str, Any]]:
        with sqlite3.connect(self.db) as conn:
            rows = conn.execute("SELECT offset, event FROM events WHERE run_id = ? "
                                "ORDER BY offset", (run_id,)).fetchall()
        assert [r[0] for r in rows] == list(range(1, len(rows) + 1)), "log offsets must be gap-free"
        return [json.loads(r[1]) for r in rows]


@pytest.fixture
def corral(corral_cmd: list[str], cli_env: dict[str, str], corral_home: Path,
           model_server: ModelServer, bwfiles: Path) -> Iterator[Corral]:
    env = agent_cli_env(cli_env, bwfiles, model_server)
    c = Corral(corral_cmd, env, corral_home, model_server)
    yield c
    listed = c.run("sandboxes", "ls", "--json", timeout=60)
    ids = [row["id"] for row in json.loads(listed.stdout)]
    if ids:
        c.run("sandboxes", "rm", "--force", *ids, timeout=60)


def model_args(cli: str) -> list[str]:
    # Codex's default model sends tools in a shape the scripted server does not script;
    # gemini-cli without a model first makes a routing call (test_gemini_cli covers it).
    return {"codex": ["--model", "gpt-fake"], "gemini-cli": ["--model", "gemini-fake"]
            }.get(cli, [])


def ndjson(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def texts(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")



# ----------------------------------------------------------------------------- tests


def test_a_missing_key_or_cli_is_one_line_naming_the_fix(corral: Corral, tmp_path: Path
                                                          ) -> None:
    env = {k: v for k, v in corral.env.items() if k != "ANTHROPIC_API_KEY"}
    out = subprocess.run([*corral.cmd, "run", "--harness", "claude-code", "hi"], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "ANTHROPIC_API_KEY" in out.stderr
    empty = tmp_path / "no-agents"
    empty.mkdir()
    env = {**corral.env, "CORRAL_AGENTS_DIR": str(empty)}
    out = subprocess.run([*corral.cmd, "run", "--harness", "codex", "hi"], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "corral agents install codex" in out.stderr
    # Nothing was recorded for either.
    assert not corral.db.exists() or not sqlite3.connect(corral.db).execute(
        "SELECT count(*) FROM runs").fetchone()[0]


def _remembering(first_answer: str) -> Callable[[ModelRequest], Reply]:
    def script(req: ModelRequest) -> Reply:
        return Text("second answer" if "second" in req.last_user_text else first_answer)

    return script


def test_a_detached_run_finished_by_the_reaper_saves_its_session(corral: Corral) -> None:
    cli = "claude-code"
    corral.srv.script = _remembering("REAPED-ANSWER-9")
    out = corral.run("run", "--harness", cli, "--run-id", "d1", "--thread", "TR", "--detach",
                     "first prompt PLOVER-3")
    assert out.returncode == 0 and out.stdout.strip() == "d1", out.stderr[-3000:]
    rec = corral.raw_record("d1")
    paths = JournalPaths.for_run(rec["journal"]["dir"], "d1")
    wait_until(lambda: (s := read_status(paths.status)) is not None and s.state == "exited",
               "the detached agent to finish", timeout=60)
    reaped = corral.run("reap", "--json")
    assert reaped.returncode == 0, reaped.stderr[-3000:]
    rec = corral.raw_record("d1")
    assert rec["status"] == "completed" and rec["usage"]["requests"] == 1
    assert corral.log("d1")[-1]["type"] == "RUN_FINISHED"
    second = corral.agent(cli, "d2", "second prompt", "--thread", "TR")
    assert second.returncode == 0, second.stderr[-3000:]
    history = "\n".join(corral.srv.model_requests[-1].texts)
    assert "first prompt PLOVER-3" in history and "REAPED-ANSWER-9" in history


def test_the_sandbox_policy_reaches_the_harness(corral: Corral, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "corral.toml").write_text(
        'id = "pol"\n[policy]\ndefault = "allow"\ndeny = ["rm -rf *"]\n')
    # Codex cannot gate its file edits: refused before anything runs, in one line.
    ws2 = tmp_path / "ws2"
    ws2.mkdir()
    (ws2 / "corral.toml").write_text('id = "pol2"\n[policy]\nfile_write = "deny"\n')
    out = corral.run("run", "--harness", "codex", "--model", "gpt-fake", "--workspace",
                     str(ws2), "hello")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "file_write" in out.stderr and corral.srv.model_requests == []
    # Its commands are gated by corral (the command gate hook): the deny rule is accepted.
    corral.srv.script = lambda req: Text("ok")
    out = corral.agent("codex", "c1", "hello", "--workspace", str(ws), *trusted(ws))
    assert out.returncode == 0, out.stderr[-3000:]
    assert corral.raw_record("c1")["spec"]["permission_prompt"] is True
    # Claude Code enforces it (its prompts go to corral, which evaluates the policy).
    out = corral.agent("claude-code", "p1", "hello", "--workspace", str(ws), *trusted(ws))
    assert out.returncode == 0, out.stderr[-3000:]
    spec = corral.raw_record("p1")["spec"]
    assert spec["policy"]["deny"] == ["rm -rf *"] and spec["policy"]["default"] == "allow"
    # Without a policy the CLI runs with its prompts off; with this one, its prompts go to
    # corral's permission prompt tool (the policy decides each command live).
    session = next(e["value"] for e in corral.log("p1")
                   if e["type"] == "CUSTOM" and e["name"] == "corral.session")
    assert session["permissionMode"] == "default", session
    assert corral.raw_record("p1")["spec"]["permission_prompt"] is True
    assert corral.agent("claude-code", "p2", "hello").returncode == 0
    session = next(e["value"] for e in corral.log("p2")
                   if e["type"] == "CUSTOM" and e["name"] == "corral.session")
    assert session["permissionMode"] == "bypassPermissions", session
    assert "policy" not in corral.raw_record("p2")["spec"]


@pytest.fixture
def two_hosts() -> Iterator[tuple[str, HelloServer, HelloServer]]:
    # 127.0.0.2: host loopback, but not the 127.0.0.1 the harness exempts from proxying
    # (inside the sandbox that is its own loopback, where the model endpoint listens).
    servers = [HelloServer("127.0.0.2") for _ in range(2)]
    yield "127.0.0.2", servers[0], servers[1]
    for srv in servers:
        srv.stop()


def test_an_agent_run_reuses_a_thread_sandbox_a_command_made(corral: Corral,
                                                             tmp_path: Path) -> None:
    """A thread's sandbox made by a command run (say, a setup step) serves the thread's
    next agent run: it is created with the agent binds whatever runs first."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "corral.toml").write_text('id = "th"\n[lifecycle]\nreuse = "thread"\n')
    made = corral.run("run", "--workspace", str(ws), "--thread", "T1", "--", "sh", "-c",
                      "echo from-the-command > made.txt")
    assert made.returncode == 0, made.stderr
    corral.srv.script = lambda req: (
        Text("saw: " + "\n".join(req.tool_results)) if req.tool_results
        else ToolCall("cat made.txt"))
    out = corral.run("run", "--harness", "claude-code", "--workspace", str(ws), "--thread", "T1",
                     "--run-id", "ag1", "--json", "show me made.txt")
    assert out.returncode == 0, out.stderr[-3000:]
    result = next(e for e in corral.log("ag1") if e["type"] == "TOOL_CALL_RESULT")
    assert "from-the-command" in result["content"]


def test_a_dead_services_daemon_is_restarted_and_keeps_counting(corral: Corral) -> None:
    """The run's model proxy daemon is SIGKILLed between two model calls: the driver starts
    another on the same socket, the agent's next call goes through, and the usage (so the
    budget) counts both calls."""
    corral.srv.script = lambda req: (
        Text("done: " + "\n".join(req.tool_results)) if req.tool_results
        else ToolCall("sleep 3; echo slept"))
    driver = corral.popen("run", "--harness", "claude-code", "--run-id", "sv1", "--json", "go")
    usage_file: list[Path] = []

    def first_call_counted() -> bool:
        try:
            rec = corral.raw_record("sv1")
        except (TypeError, sqlite3.OperationalError):  # no store or no record yet
            return False
        agent = rec["spec"].get("agent") or {}
        if "services_pid" not in agent:
            return False
        paths = JournalPaths.for_run(rec["journal"]["dir"], "sv1")
        usage_file[:] = [paths.directory / f"{paths.token}.usage.json"]
        try:
            return json.loads(usage_file[0].read_text())["requests"] >= 1
        except (OSError, ValueError, KeyError):
            return False

    wait_until(first_call_counted, "the first model call to be metered", timeout=60)
    first_pid = corral.raw_record("sv1")["spec"]["agent"]["services_pid"]
    os.kill(first_pid, signal.SIGKILL)
    out, err = driver.communicate(timeout=180)
    assert driver.returncode == 0, err[-3000:]
    rec = corral.raw_record("sv1")
    assert rec["status"] == "completed"
    assert rec["spec"]["agent"]["services_pid"] != first_pid
    assert len(corral.srv.model_requests) == 2
    assert rec["usage"]["requests"] == 2  # counted across the restart
    assert "slept" in texts(corral.log("sv1"))


@pytest.mark.parametrize("cli", ["claude-code", "codex"])
def test_an_approval_outlives_the_driver_that_asked_it(corral: Corral, tmp_path: Path,
                                                       cli: str) -> None:
    """The driver is SIGKILLed while the command gate waits for an approval; the approval is
    answered with no driver; ``corral attach`` serves the run's tools again, the gate (which
    kept asking) gets the stored answer, the command runs, and the question was asked once."""
    from corral.tools._approvals import APPROVAL_REQUEST_EVENT, APPROVAL_RESOLVED_EVENT

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "corral.toml").write_text(
        'id = "askk"\n[policy]\ndefault = "deny"\nask = ["echo approved*"]\n')

    def script(req: ModelRequest) -> Reply:
        if req.tool_results:
            return Text("after: " + "\n".join(req.tool_results))
        if req.shell_tool is None:
            return Text("title")
        return ToolCall("echo approved-ran", text="running")

    corral.srv.script = script
    proc = corral.popen("run", "--harness", cli, *model_args(cli), "--run-id", "k1", "--json",
                        "--workspace", str(ws), "say it")

    def asked() -> list[dict[str, Any]]:
        try:
            return [e["value"] for e in corral.log("k1") if e["type"] == "CUSTOM"
                    and e["name"] == APPROVAL_REQUEST_EVENT]
        except sqlite3.OperationalError:  # no store yet
            return []

    wait_until(lambda: bool(asked()), "the approval request", timeout=120)
    proc.kill()
    proc.communicate(timeout=60)
    assert corral.raw_record("k1")["status"] == "running"
    out = corral.run("approve", "k1", asked()[0]["approvalId"], "--allow")
    assert out.returncode == 0, out.stderr
    att = corral.run("attach", "k1", "--json")
    assert att.returncode == 0, att.stderr[-3000:]
    log = corral.log("k1")
    assert [p["event"] for p in ndjson(att.stdout)] == log
    assert log[-1]["type"] == "RUN_FINISHED", log[-3:]
    assert len(asked()) == 1
    assert [e["value"]["decision"] for e in log if e["type"] == "CUSTOM"
            and e["name"] == APPROVAL_RESOLVED_EVENT] == ["allow"]
    results = [e["content"] for e in log if e["type"] == "TOOL_CALL_RESULT"]
    assert len(results) == 1 and "approved-ran" in results[0], results
    assert "after: " in texts(log)
