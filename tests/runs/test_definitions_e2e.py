"""`corral run` with a sandbox definition (corral.toml): setup, thread reuse, secrets.

Real bubblewrap sandboxes, real SQLite, the CLI in subprocesses.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from corral.testing._leaks import assert_no_secrets, find_secrets

pytestmark = pytest.mark.usefixtures("need_bwrap_runs")

SECRET = "tok-9f2c41d0e7b64aa3-SECRET"


@pytest.fixture
def env(cli_env: dict[str, str], bwfiles: Path) -> dict[str, str]:
    cli_env["CORRAL_BWRAP_FILES"] = str(bwfiles)
    cli_env["CORRAL_TEST_SECRET"] = SECRET
    return cli_env


def run(cmd: list[str], env: dict[str, str], *args: str, cwd: Path | None = None,
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cmd, *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False)


def log_of(home: Path, run_id: str) -> list[dict[str, Any]]:
    with sqlite3.connect(home / "corral.db") as conn:
        rows = conn.execute("SELECT event FROM events WHERE run_id = ? ORDER BY offset",
                            (run_id,)).fetchall()
    return [json.loads(r[0]) for r in rows]


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


def test_corral_toml_in_the_current_directory_is_used(
    corral_cmd: list[str], env: dict[str, str], corral_home: Path, tmp_path: Path
) -> None:
    ws = tmp_path / "project"
    ws.mkdir()
    (ws / "data.txt").write_text("from the host\n")
    (ws / "corral.toml").write_text(
        'id = "e2e"\n'
        "[workspace]\n"
        'instructions = "Be brief."\n'
        'setup = ["mkdir -p build && cd build", "export STAGE=built", '
        '"echo $STAGE > stage.txt"]\n'
        "[lifecycle]\n"
        'reuse = "thread"\n'
    )
    first = run(corral_cmd, env, "run", "--run-id", "t1", "--thread", "th", "--", "sh", "-c",
                "cat data.txt build/stage.txt; test -f AGENTS.md && echo has-agents; "
                "echo kept > left.txt", cwd=ws)
    assert first.returncode == 0, first.stderr
    assert text_of(log_of(corral_home, "t1")) == "from the host\nbuilt\nhas-agents\n"
    # Same thread: the same sandbox (the file the first run left is there).
    second = run(corral_cmd, env, "run", "--run-id", "t2", "--thread", "th", "--", "cat",
                 "left.txt", cwd=ws)
    assert second.returncode == 0, second.stderr
    assert text_of(log_of(corral_home, "t2")) == "kept\n"
    # Another thread: a fresh sandbox.
    other = run(corral_cmd, env, "run", "--run-id", "t3", "--thread", "other", "--", "sh",
                "-c", "test -e left.txt && echo leaked || echo fresh", cwd=ws)
    assert text_of(log_of(corral_home, "t3")) == "fresh\n", other.stderr
    shown = json.loads(run(corral_cmd, env, "show", "t2", "--json").stdout)
    assert shown["sandbox_key"] and len(shown["sandbox_key"]) == 64


def test_a_bad_corral_toml_is_one_clear_line(
    corral_cmd: list[str], env: dict[str, str], tmp_path: Path
) -> None:
    ws = tmp_path / "bad"
    ws.mkdir()
    (ws / "corral.toml").write_text('id = "x"\n\n[lifecycle]\nreuse = "thread"\nkeepalive = 3\n')
    out = run(corral_cmd, env, "run", "--workspace", str(ws), "--", "true")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert "keepalive" in out.stderr and "corral.toml:5:" in out.stderr


def test_secret_values_never_reach_anything_corral_writes(
    corral_cmd: list[str], env: dict[str, str], corral_home: Path, tmp_path: Path
) -> None:
    ws = tmp_path / "secret-ws"
    ws.mkdir()
    (ws / "corral.toml").write_text(
        'id = "secrets"\n'
        "[secrets]\n"
        'API_TOKEN = { env = "CORRAL_TEST_SECRET" }\n'
        "[workspace]\n"
        'setup = ["echo setup-sees-$API_TOKEN"]\n'
        "[lifecycle]\n"
        'reuse = "thread"\n'
        'snapshot = "after-run"\n'
    )
    agent = (
        'echo "token=$API_TOKEN"; printf %s "$API_TOKEN" | base64; '
        'env | grep API_TOKEN; '
        'echo "stderr $API_TOKEN" >&2; exit 3'
    )
    out = run(corral_cmd, env, "run", "--run-id", "sec", "--workspace", str(ws), "--json",
              "--", "sh", "-c", agent)
    assert out.returncode == 3, out.stderr
    events = log_of(corral_home, "sec")
    text = text_of(events)
    # The agent did see the value (it ran with it) but every copy was redacted.
    assert "token=[REDACTED:API_TOKEN]" in text
    assert "[REDACTED:API_TOKEN]" in events[-1]["message"]
    assert SECRET not in out.stdout and SECRET not in out.stderr
    # Every byte corral wrote: store, journals, sidecars, sandbox state, snapshots.
    written = [corral_home, Path(env["CORRAL_BWRAP_FILES"])]
    assert_no_secrets(written, {"API_TOKEN": SECRET})
    # The scan itself works: a planted copy is found.
    (corral_home / "planted.txt").write_text(f"x {SECRET} y")
    assert find_secrets(written, {"API_TOKEN": SECRET})
