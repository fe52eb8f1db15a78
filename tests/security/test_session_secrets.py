"""Secret values must not reach disk through the agent CLIs' saved sessions.

A real agent run (Claude Code, Codex; real bubblewrap sandbox; the scripted model server
as the model) runs a command that prints a sandbox secret and then repeats it in its
answer. Corral saves the CLI's session transcript for the thread when the run ends; every
file corral wrote (``$CORRAL_HOME``, the shared directory, the bubblewrap files root) is
then scanned for the value and its encodings. The thread is then resumed in a fresh
sandbox: the CLI must accept the redacted transcript and continue the same session.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.agents._prepare import finish_agent_run
from corral.harness._claude_code import ClaudeCodeHarness
from corral.agents._sessions import load_session, redact_line, save_session
from corral.providers._local import LocalProvider
from corral.sandbox._redact import Redactor
from corral.stores import open_store
from corral.testing._leaks import assert_nothing_written_holds, find_secrets
from corral.testing._model_script import ModelRequest, Reply, Text, ToolCall
from corral.testing._model_server import ModelServer
from tests.agents.conftest import CLIS, agent_cli_env

pytestmark = pytest.mark.timeout(300)

NAME = "STAGING_PASSWORD"  # Codex hides *KEY*/*SECRET*/*TOKEN* variables from its shell
COMMAND = f'echo "pw=${NAME}"; printf %s "${NAME}" | base64'


def script(req: ModelRequest) -> Reply:
    """First prompt: run the command, then repeat its output in the answer. Second prompt
    (the resumed session): a plain answer."""
    if "second" in req.last_user_text:
        return Text("second answer")
    if req.tool_results:
        return Text("The command printed: " + "\n".join(req.tool_results).strip())
    return ToolCall(COMMAND, text="I'll run the command.")


def log_of(home: Path, run_id: str) -> list[dict[str, Any]]:
    with sqlite3.connect(home / "corral.db") as conn:
        rows = conn.execute("SELECT event FROM events WHERE run_id = ? ORDER BY offset",
                            (run_id,)).fetchall()
    return [json.loads(r[0]) for r in rows]


@pytest.mark.usefixtures("bwrap")
@pytest.mark.parametrize("cli", CLIS)
def test_saved_sessions_hold_no_secret_and_still_resume(
        cli: str, corral_cmd: list[str], cli_env: dict[str, str], corral_home: Path,
        model_server: ModelServer, bwfiles: Path, tmp_path: Path) -> None:
    value = f"pw-{secrets.token_hex(16)}"
    env = agent_cli_env(cli_env, bwfiles, model_server)
    env["CORRAL_TEST_SECRET"] = value
    env.pop("CORRAL_STORE", None)
    model_server.script = script
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "corral.toml").write_text(
        'id = "sessions"\n'
        f'[secrets]\n{NAME} = {{ env = "CORRAL_TEST_SECRET" }}\n'
        '[lifecycle]\nreuse = "none"\n'  # the second run gets a fresh sandbox
    )
    model = ["--model", "gpt-fake"] if cli == "codex" else []

    def corral(run_id: str, prompt: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*corral_cmd, "run", "--harness", cli, *model, "--run-id", run_id, "--thread", "T",
             "--workspace", str(ws), "--json", prompt],
            env=env, capture_output=True, text=True, timeout=240, check=False)

    first = corral("r1", "first prompt KESTREL-5: run the command")
    assert first.returncode == 0, first.stderr[-3000:]
    events = log_of(corral_home, "r1")
    results = [e["content"] for e in events if e["type"] == "TOOL_CALL_RESULT"]
    # the agent did run with the value (its output was redacted on the way to the log)
    assert any(f"pw=[REDACTED:{NAME}]" in r for r in results), results
    # the CLI session was saved for the thread, in the store (never in the home)...
    with sqlite3.connect(corral_home / "corral.db") as conn:
        saved = conn.execute("SELECT path, data FROM session_files WHERE thread_id = 'T'"
                             ).fetchall()
    assert any(path.endswith(".jsonl") for path, _data in saved), saved
    assert not (corral_home / "sessions").exists()
    # ...and nothing corral wrote holds the value, in any encoding (the store's raw file
    # and its write-ahead log among them)
    roots = assert_nothing_written_holds({NAME: value}, env)
    assert corral_home in roots and bwfiles in roots
    raw = b"".join(p.read_bytes() for p in corral_home.glob("corral.db*") if p.is_file())
    assert value.encode() not in raw
    # the transcript keeps the output, redacted the way events are, and the raw store file
    # shows it (so the scan above would have seen the value)
    assert any(f"[REDACTED:{NAME}]".encode() in data for _path, data in saved)
    assert b"KESTREL-5" in raw

    second = corral("r2", "second prompt")
    assert second.returncode == 0, second.stderr[-3000:]
    last = model_server.model_requests[-1]
    assert "second prompt" in last.last_user_text
    history = "\n".join(last.texts + last.tool_results)
    # the CLI resumed the redacted transcript: the first turn is in the model's context
    assert "first prompt KESTREL-5" in history, history[-2000:]
    assert f"[REDACTED:{NAME}]" in history and value not in history
    sessions = [e["value"]["sessionId"] for r in ("r1", "r2") for e in log_of(corral_home, r)
                if e["type"] == "CUSTOM" and e["name"] == "corral.session"]
    assert len(sessions) == 2 and sessions[0] == sessions[1]  # the same CLI session
    assert_nothing_written_holds({NAME: value}, env)
    assert not (corral_home / "sessions").exists()
    # the scan does see a copy where corral writes
    (corral_home / "planted").write_text(value)
    assert find_secrets([corral_home], {NAME: value})


# ----------------------------------------------------------------------------- the copy


def test_the_redacting_copy(corral_home: Path) -> None:
    """Through the local provider's real file API: JSON lines stay valid JSON, a line split
    across read chunks, a last line without a newline, raw text and a multi-line value."""
    value = "s3cr3t-" + secrets.token_hex(8)
    pem = "-----BEGIN KEY-----\n" + secrets.token_hex(20) + "\n-----END KEY-----"
    red = Redactor({"PW": value, "PEM": pem})
    lines = [
        json.dumps({"type": "tool_result", "content": f"pw={value}\n", "n": 1.5}),
        json.dumps({"nested": {"args": json.dumps({"cmd": f"echo {value}"})}}),
        json.dumps({"pad": "x" * ((1 << 20) - 10), "value": value}),  # crosses a chunk
        json.dumps({"untouched": "é ünïcode", "list": [1, None, True]}, ensure_ascii=False),
    ]
    transcript = "\n".join(lines).encode() + b"\n" + json.dumps({"last": value}).encode()
    raw = f"plain {value}\n{pem}\nend".encode()

    async def go() -> tuple[bytes, bytes, Any]:
        local = LocalProvider()
        box = await local.create()
        store = await open_store()
        try:
            await box.fs.write("/home/agent/.claude/projects/-workspace/s.jsonl", transcript)
            await box.fs.write("/home/agent/.claude/projects/notes.txt", raw)
            saved = await save_session(box, "claude-code", (".claude/projects",), "T", "sid",
                                       redactor=red, store=store)
            stored = await store.get_session("T", "claude-code")
        finally:
            await store.aclose()
            await local.destroy(box.ref)
        assert stored is not None
        return (stored.files[".claude/projects/-workspace/s.jsonl"],
                stored.files[".claude/projects/notes.txt"], saved)

    got, notes, saved = anyio.run(go)
    assert find_secrets([corral_home], {"PW": value, "PEM": pem}) == []
    out = got.split(b"\n")
    assert len(out) == 5 and out[3] == lines[3].encode()  # untouched lines stay byte-exact
    docs = [json.loads(line) for line in out]  # every line is still JSON
    assert docs[0] == {"type": "tool_result", "content": "pw=[REDACTED:PW]\n", "n": 1.5}
    assert json.loads(docs[1]["nested"]["args"]) == {"cmd": "echo [REDACTED:PW]"}
    assert docs[2]["value"] == "[REDACTED:PW]" and docs[4] == {"last": "[REDACTED:PW]"}
    assert notes == b"plain [REDACTED:PW]\n[REDACTED:PEM]\nend"
    assert saved.size == len(got) + len(notes)
    assert redact_line(b"no secret here\n", red) == b"no secret here\n"


def test_a_host_without_the_secret_saves_no_session(corral_home: Path) -> None:
    """A host that finishes a run without knowing all its secrets cannot redact the
    transcript, so it keeps none (the thread resumes from its last safe session)."""
    value = "pw-" + secrets.token_hex(8)

    async def go() -> Any:
        local = LocalProvider()
        box = await local.create()
        store = await open_store()
        try:
            await box.fs.write("/home/agent/.claude/projects/-workspace/s.jsonl",
                               json.dumps({"content": value}).encode() + b"\n")
            report = await finish_agent_run(
                ClaudeCodeHarness(), box, "T2", None, None, resumed_session="sid",
                sessions=store,
                redactor=Redactor({"OTHER": "other-value"}), secret_names=["PW", "OTHER"])
            return report, await load_session(store, "T2", "claude-code")
        finally:
            await store.aclose()
            await local.destroy(box.ref)

    report, kept = anyio.run(go)
    assert report.saved is None and kept is None
    assert any("PW" in e and "not saved" in e for e in report.errors), report.errors
    assert find_secrets([corral_home], {"PW": value}) == []
