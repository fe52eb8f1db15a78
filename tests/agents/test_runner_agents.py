"""`corral run --harness claude-code|codex`: the real CLIs as durable runs.

Real bubblewrap sandboxes, real SQLite, `corral` in subprocesses, the scripted model server
on 127.0.0.1 as the host's ``ANTHROPIC_BASE_URL`` / ``OPENAI_BASE_URL`` (the model proxy the
Runner starts forwards to it with the "real" key, which must never enter the sandbox or the
store).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import threading
from collections.abc import Callable, Iterator

from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.harness._base import RunContext, translate_run
from corral.harness._events import event_to_dict
from corral.harness._registry import build_harness
from corral.runs._launch import with_prompt
from corral.runs._request import RunRequest
from corral.runs._spec import RunSpec
from corral.journal._layout import JournalPaths, read_status
from corral.testing._leaks import assert_no_secrets, find_secrets
from corral.testing._model_server import (
    ModelRequest,
    ModelServer,
    Reply,
    Text,
    ToolCall,
    shell_then_text,
)

from .conftest import CLIS, REAL_KEY, agent_cli_env
from tests.helpers import HelloServer, wait_until
from corral.journal._supervisor import process_alive

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
    ids = [json.loads(line)["id"] for line in listed.stdout.splitlines() if line.strip()]
    if ids:
        c.run("sandboxes", "rm", *ids, timeout=60)


def model_args(cli: str) -> list[str]:
    # Codex's default model sends tools in a shape the scripted server does not script;
    # gemini-cli without a model first makes a routing call (test_gemini_cli covers it).
    return {"codex": ["--model", "gpt-fake"], "gemini-cli": ["--model", "gemini-fake"]
            }.get(cli, [])


def ndjson(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def texts(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


def retranslated(c: Corral, run_id: str, prompt: str) -> list[dict[str, Any]]:
    """The run's whole journal translated afresh in one go, after the start batch the run's
    first driver logs (``RUN_STARTED``, the prompt): what an uninterrupted driver would have
    logged from this journal."""
    rec = c.raw_record(run_id)
    paths = JournalPaths.for_run(rec["journal"]["dir"], run_id)
    harness = build_harness(rec["harness"], RunSpec.parse(rec["spec"]).harness_config())

    async def go() -> list[dict[str, Any]]:
        out: list[Any] = []
        async for batch in translate_run(harness, RunContext(run_id, rec["thread_id"]), paths,
                                         nonce=rec["journal"]["nonce"]):
            out += batch.events
        request = RunRequest(prompt=prompt, harness=rec["harness"])
        return [event_to_dict(e) for e in with_prompt(out, request)]

    return anyio.run(go)


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("cli", CLIS)
def test_corral_run_drives_the_cli_through_a_tool_call(cli: str, corral: Corral,
                                                       tmp_path: Path) -> None:
    corral.srv.script = lambda req: (
        Text("All done: " + "\n".join(req.tool_results).strip()) if req.tool_results
        else ToolCall(EDIT, text="I'll edit the file."))
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "note.txt").write_text("original\n")
    out = corral.agent(cli, "r1", "please edit note.txt", "--workspace", str(ws))
    assert out.returncode == 0, out.stderr[-3000:]
    printed = ndjson(out.stdout)
    events = [p["event"] for p in printed]
    assert events == corral.log("r1")
    kinds = [e["type"] for e in events]
    assert kinds[0] == "RUN_STARTED" and kinds[-1] == "RUN_FINISHED"
    for kind in TOOL_EVENTS:
        assert kinds.count(kind) == 1, (kind, kinds)
    assert [kinds.index(k) for k in TOOL_EVENTS] == sorted(kinds.index(k) for k in TOOL_EVENTS)
    result = next(e for e in events if e["type"] == "TOOL_CALL_RESULT")
    assert "edited by the agent" in result["content"]  # the tool ran in the workspace copy
    final = texts(events).split("All done:", 1)
    assert len(final) == 2 and "edited by the agent" in final[1]  # the model saw the result
    finished = events[-1]
    assert finished["usage"] and finished["usage"][0]["outputTokens"], finished
    rec = corral.raw_record("r1")
    assert rec["status"] == "completed" and rec["harness"] == cli
    # The model proxy metered exactly what the server streamed: 2 x (100 in, 20 out).
    assert rec["usage"]["requests"] == 2
    assert (rec["usage"]["input_tokens"], rec["usage"]["output_tokens"]) == (200, 40)
    # ... per model, priced from corral's table (or listed as unpriced, never guessed)
    models = rec["usage"]["models"]
    assert sum(m["requests"] for m in models.values()) == 2
    assert sum(m["input_tokens"] for m in models.values()) == 200
    assert set(rec["usage"]["cost_by_model"]) | set(rec["usage"]["unpriced"]) == set(models)
    assert rec["usage"]["cost_usd"] == pytest.approx(sum(rec["usage"]["cost_by_model"].values()))
    shown = corral.run("show", "r1").stdout
    assert "200 in, 40 out, 0 cache read, 0 cache write (2 requests)" in shown
    if rec["usage"]["cost_by_model"]:
        assert f"${rec['usage']['cost_usd']:.4f}" in shown
    else:  # the scripted models (gpt-fake, gemini-fake) have no price: never shown as $0
        assert "cost              unknown (no price for" in shown
    assert all(f"  {model}" in shown for model in models)
    # The upstream got the real key; nothing corral wrote holds it.
    assert [r.api_key for r in corral.srv.model_requests] == [REAL_KEY, REAL_KEY]
    assert REAL_KEY not in out.stdout + out.stderr
    written = [corral.home, Path(corral.env["CORRAL_BWRAP_FILES"])]
    assert_no_secrets(written, {"MODEL_KEY": REAL_KEY})
    (corral.home / "planted").write_text(REAL_KEY)  # the scan does find a copy
    assert find_secrets(written, {"MODEL_KEY": REAL_KEY})


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


class Gate:
    """A script whose second model call waits until the test opens the gate."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.waiting = threading.Event()

    def __call__(self, req: ModelRequest) -> Reply:
        if req.tool_results:
            self.waiting.set()
            assert self.open.wait(120), "the gate was never opened"
            return Text("Finished: " + "\n".join(req.tool_results).strip())
        return ToolCall("echo step-one && echo step-two", text="Running it.")


def kill_after_tool_result(proc: subprocess.Popen[str], gate: Gate) -> None:
    """Read the driver's events until the tool result, wait for the held second model
    call, then SIGKILL the driver."""
    assert proc.stdout is not None
    seen: list[str] = []
    while "TOOL_CALL_RESULT" not in seen:
        line = proc.stdout.readline()
        assert line, proc.communicate()[1][-3000:]
        seen.append(json.loads(line)["event"]["type"])
    assert gate.waiting.wait(60), "the second model call never came"
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def attach_after_driverless_finish(corral: Corral, run_id: str, gate: Gate, prompt: str,
                                   what: str) -> list[dict[str, Any]]:
    """After :func:`kill_after_tool_result`: the run is still ``running``; open ``gate``
    (nobody drives the run now, the model proxy daemon still answers the agent), wait for
    the agent to exit, then check ``corral attach`` prints the whole log once and that log
    is the journal translated afresh (no duplicate, no gap). Returns the log."""
    rec = corral.raw_record(run_id)
    assert rec["status"] == "running"
    gate.open.set()
    paths = JournalPaths.for_run(rec["journal"]["dir"], run_id)

    def exited() -> bool:
        status = read_status(paths.status)
        return status is not None and status.state == "exited"

    wait_until(exited, f"{what} to finish without a driver", timeout=60)
    att = corral.run("attach", run_id, "--json")
    assert att.returncode == 0, att.stderr[-3000:]
    log = corral.log(run_id)
    assert [p["event"] for p in ndjson(att.stdout)] == log  # attach printed it all, once
    assert log == retranslated(corral, run_id, prompt)  # no duplicate, no gap
    return log


def _normalized(events: list[dict[str, Any]], run_id: str) -> list[str]:
    """Events with the run id and the CLI's own per-session values (session id, timings,
    cost) blanked: what an identical script must reproduce exactly."""
    volatile = {"sessionId", "session_id", "duration_ms", "duration_api_ms", "total_cost_usd",
                "uuid", "timestamp", "durationMs", "durationApiMs"}

    def clean(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: ("*" if k in volatile else clean(x)) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    # The scripted server numbers its message and tool ids over its lifetime.
    ids: dict[str, str] = {}

    def renumber(m: re.Match[str]) -> str:
        return ids.setdefault(m.group(0), f"{m.group(1)}#{len(ids)}")

    # gemini-cli's tool ids carry a timestamp, its shell results the process group id
    return [re.sub(r"PGID: \d+", "PGID: *", re.sub(
                r"(msg_corral|toolu_corral|call_corral|resp_corral|run_shell_command_)\w+",
                renumber, json.dumps(clean(e), sort_keys=True).replace(run_id, "RUN")))
            for e in events]


@pytest.mark.parametrize("cli", ["claude-code", "gemini-cli"])
def test_sigkill_of_the_driver_then_attach_delivers_the_rest(cli: str, corral: Corral) -> None:
    gate = Gate()
    gate.open.set()
    corral.srv.script = gate
    ref = corral.agent(cli, "ref", "run the two steps")
    assert ref.returncode == 0, ref.stderr[-3000:]
    reference = corral.log("ref")

    gate = Gate()
    corral.srv.script = gate
    proc = corral.popen("run", "--harness", cli, *model_args(cli), "--run-id", "k1", "--json",
                        "run the two steps")
    kill_after_tool_result(proc, gate)
    log = attach_after_driverless_finish(corral, "k1", gate, "run the two steps", "the agent")
    assert _normalized(log, "k1") == _normalized(reference, "ref")
    assert "step-one\nstep-two" in texts(log).split("Finished: ", 1)[1]
    rec = corral.raw_record("k1")
    assert rec["status"] == "completed"
    assert rec["usage"]["requests"] == 2  # metered by the daemon while nobody drove


def _remembering(first_answer: str) -> Callable[[ModelRequest], Reply]:
    def script(req: ModelRequest) -> Reply:
        return Text("second answer" if "second" in req.last_user_text else first_answer)

    return script


@pytest.mark.parametrize("cli", CLIS)
@pytest.mark.parametrize("reuse", ["none", "thread"])
def test_a_second_prompt_on_the_thread_resumes_the_cli_session(
        cli: str, reuse: str, corral: Corral, tmp_path: Path) -> None:
    corral.srv.script = _remembering("FIRST-ANSWER-42")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "corral.toml").write_text(f'id = "resume"\n[lifecycle]\nreuse = "{reuse}"\n')
    first = corral.agent(cli, "r1", "first prompt XYZZY-7", "--thread", "T",
                         "--workspace", str(ws))
    assert first.returncode == 0, first.stderr[-3000:]
    second = corral.agent(cli, "r2", "second prompt", "--thread", "T", "--workspace", str(ws))
    assert second.returncode == 0, second.stderr[-3000:]
    box1 = corral.raw_record("r1")["sandbox_ref"]["id"]
    box2 = corral.raw_record("r2")["sandbox_ref"]["id"]
    assert (box1 == box2) == (reuse == "thread")
    last = corral.srv.model_requests[-1]
    assert "second prompt" in last.last_user_text
    history = "\n".join(last.texts)
    assert "first prompt XYZZY-7" in history and "FIRST-ANSWER-42" in history
    sessions = [e["value"]["sessionId"] for r in ("r1", "r2") for e in corral.log(r)
                if e["type"] == "CUSTOM" and e["name"] == "corral.session"]
    assert len(sessions) == 2 and sessions[0] == sessions[1]  # the same CLI session


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
    out = corral.agent("codex", "c1", "hello", "--workspace", str(ws))
    assert out.returncode == 0, out.stderr[-3000:]
    assert corral.raw_record("c1")["spec"]["permission_prompt"] is True
    # Claude Code enforces it (its prompts go to corral, which evaluates the policy).
    out = corral.agent("claude-code", "p1", "hello", "--workspace", str(ws))
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


def check_cancel_stops_the_agent_and_its_model_proxy(corral: Corral, gate: Gate,
                                                     harness_args: list[str]) -> None:
    """A detached run (``harness_args``: ``--harness`` and its options) held at its second
    model call by ``gate`` is cancelled: the run is aborted with ``RUN_ERROR`` last, and
    the model proxy daemon and the agent stop."""
    corral.srv.script = gate
    try:
        out = corral.run("run", *harness_args, "--run-id", "c1", "--detach",
                         "run the two steps")
        assert out.returncode == 0, out.stderr[-3000:]
        assert gate.waiting.wait(60), "the second model call never came"
        rec = corral.raw_record("c1")
        services = rec["spec"]["agent"]["services_pid"]
        status = read_status(JournalPaths.for_run(rec["journal"]["dir"], "c1").status)
        assert status is not None and status.agent_pid is not None
        agent = status.agent_pid
        assert process_alive(services)
        cancelled = corral.run("cancel", "c1")
        assert cancelled.returncode == 0, cancelled.stderr
        rec = corral.raw_record("c1")
        assert rec["status"] == "aborted"
        assert corral.log("c1")[-1]["type"] == "RUN_ERROR"
        wait_until(lambda: not process_alive(services),
                   "the model proxy daemon to stop", timeout=10)
        wait_until(lambda: not process_alive(agent), "the agent to stop", timeout=10)
    finally:
        gate.open.set()


def test_cancel_of_an_agent_run_stops_the_agent_and_its_model_proxy(corral: Corral) -> None:
    check_cancel_stops_the_agent_and_its_model_proxy(corral, Gate(),
                                                     ["--harness", "claude-code"])


@pytest.fixture
def two_hosts() -> Iterator[tuple[str, HelloServer, HelloServer]]:
    # 127.0.0.2: host loopback, but not the 127.0.0.1 the harness exempts from proxying
    # (inside the sandbox that is its own loopback, where the model endpoint listens).
    servers = [HelloServer("127.0.0.2") for _ in range(2)]
    yield "127.0.0.2", servers[0], servers[1]
    for srv in servers:
        srv.stop()


@pytest.mark.parametrize("cli", ["claude-code", "gemini-cli"])
def test_policy_allow_hosts_is_the_runs_only_way_out(
        cli: str, corral: Corral, tmp_path: Path,
        two_hosts: tuple[str, HelloServer, HelloServer]) -> None:
    host, a, b = two_hosts
    pa, pb = a.server_address[1], b.server_address[1]
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "corral.toml").write_text(
        f'id = "egress"\n[policy]\ndefault = "allow"\nnetwork = "allow"\n'
        f'allow_hosts = ["{host}:{pa}"]\n')
    corral.srv.script = shell_then_text(
        f"curl -s -m 5 http://{host}:{pa}/; echo; curl -s -m 5 http://{host}:{pb}/; echo; "
        f"curl -s -m 3 --noproxy '*' http://{host}:{pa}/ || echo direct-failed",
        "Fetched: {output}")
    # the test's hosts are loopback addresses: only a config the user names may allow them
    out = corral.agent(cli, "e1", "fetch both", "--workspace", str(ws),
                       "--config", str(ws / "corral.toml"))
    assert out.returncode == 0, out.stderr[-3000:]
    events = corral.log("e1")
    assert events[-1]["type"] == "RUN_FINISHED", events[-1]
    results = [e["content"] for e in events if e["type"] == "TOOL_CALL_RESULT"]
    assert len(results) == 1, results
    # the allowed host answered through the proxy; the other got the proxy's refusal
    assert f"hello from {pa}" in results[0], results
    assert f"corral egress proxy: connections to {host}:{pb} are not allowed" in results[0]
    # and there is no way around the proxy: the sandbox has no network of its own
    assert "direct-failed" in results[0]
    assert (a.hits, b.hits) == (1, 0)  # type: ignore[attr-defined]
    # the model saw the refusal too
    assert f"connections to {host}:{pb} are not allowed" in texts(events)
    spec = corral.raw_record("e1")["spec"]
    assert spec["policy"]["allow_hosts"] == [f"{host}:{pa}"]
    assert any("/egress-" in s for s in spec["agent"]["sockets"]), spec["agent"]


@pytest.mark.parametrize("cli", CLIS)
def test_token_budget_stops_model_calls_past_it(cli: str, corral: Corral) -> None:
    # Each scripted model call uses 120 tokens: the first crosses a budget of 150 only
    # with the second, so the third is refused; an unlimited run would make all three.
    corral.srv.script = lambda req: (
        Text("All done.") if len(req.tool_results) >= 2
        else ToolCall(f"echo step {len(req.tool_results)}"))
    out = corral.agent(cli, "b1", "run two steps", "--token-budget", "150")
    assert out.returncode != 0
    events = corral.log("b1")
    assert events[-1]["type"] == "RUN_ERROR", events[-3:]
    assert len(corral.srv.model_requests) == 2  # the refused call never reached upstream
    rec = corral.raw_record("b1")
    assert rec["status"] == "failed" and rec["usage"]["requests"] == 2
    assert "token budget" in json.dumps([events[-1], rec.get("error")]), events[-1]


@pytest.mark.parametrize("cli", CLIS)
def test_file_events_of_an_agent_run(cli: str, corral: Corral, tmp_path: Path) -> None:
    """The agent's edit shows as a sandbox.file event with its patch; what corral itself
    puts in place for the CLI does not."""
    corral.srv.script = lambda req: (
        Text("done") if req.tool_results else ToolCall(EDIT, text="editing"))
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "note.txt").write_text("original\n")
    out = corral.agent(cli, "fe1", "edit note.txt", "--workspace", str(ws),
                       "--file-events", "diff")
    assert out.returncode == 0, out.stderr[-3000:]
    events = corral.log("fe1")
    files = [(e["value"]["type"], e["value"]["path"]) for e in events
             if e["type"] == "CUSTOM" and e["name"] == "sandbox.file"]
    assert files == [("change", "note.txt")], files
    (patch,) = [e["value"]["diff"] for e in events
                if e["type"] == "CUSTOM" and e["name"] == "sandbox.file.diff"]
    assert "-original" in patch and "+edited by the agent" in patch
    assert events[-1]["type"] == "RUN_FINISHED"


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
