"""A thread outlives its host (#27): a three-turn Claude Code thread (the real CLI against
the scripted model server) whose turns run on three ``$CORRAL_HOME``s sharing one
PostgreSQL store, each turn in a fresh bubblewrap sandbox (``reuse = "none"``: nothing of
an earlier turn reaches the next but the store). Every turn sees the earlier turns' files
and conversation; ``corral threads undo`` on the third home brings back the state after
turn 2 (files and conversation); ``corral threads fork --at`` turn 1 on the first home
starts a thread with turn 1's state in a sandbox of its own."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from corral.testing._model_script import ModelRequest, Reply, Text, ToolCall
from corral.testing._model_server import ModelServer
from tests.agents.conftest import agent_cli_env
from tests.helpers import pg_schema_url

pytestmark = pytest.mark.timeout(600)

# What each turn's prompt asks the agent to run (its shell tool), keyed by a word in it.
COMMANDS = {
    "TURN-ONE": "echo one > one.txt && echo wrote-one",
    "TURN-TWO": "cat one.txt && echo two > two.txt",
    "TURN-THREE": "echo three > three.txt && ls",
    "CHECK": "ls *.txt | tr '\\n' ' '",
}


def script(req: ModelRequest) -> Reply:
    prompt = req.last_user_text
    key = next((k for k in COMMANDS if k in prompt), None)
    if key is None or req.shell_tool is None:
        return Text("ok")  # the CLI's own side requests (titles, …)
    if req.tool_results:
        return Text(f"{key}-ANSWER: " + " ".join(req.tool_results).strip())
    return ToolCall(COMMANDS[key], text="Running it.")


def _turn_requests(srv: ModelServer, start: int, key: str) -> list[ModelRequest]:
    return [r for r in srv.model_requests[start:] if key in r.last_user_text]


def _result_of(srv: ModelServer, start: int, key: str) -> str:
    """What the agent's shell tool printed in turn ``key`` (as the model got it back)."""
    done = [r for r in _turn_requests(srv, start, key) if r.tool_results]
    assert done, [r.reply for r in srv.model_requests[start:]]
    return " ".join(done[-1].tool_results)


def _history(srv: ModelServer, start: int, key: str) -> str:
    """The whole conversation the model received in turn ``key``'s first request."""
    reqs = _turn_requests(srv, start, key)
    assert reqs
    return "\n".join(reqs[0].texts)


@pytest.mark.usefixtures("bwrap")
def test_a_thread_continues_on_three_homes_then_undo_and_fork(
        corral_cmd: list[str], cli_env: dict[str, str], model_server: ModelServer,
        bwfiles: Path, tmp_path: Path) -> None:
    # a fresh sandbox for every turn: nothing of an earlier turn but the store reaches it
    thread_scenario(corral_cmd, agent_cli_env(cli_env, bwfiles, model_server), model_server,
                    tmp_path, toml='id = "threads"\n[lifecycle]\nreuse = "none"\n')


def thread_scenario(corral_cmd: list[str], base_env: dict[str, str],
                    model_server: ModelServer, tmp_path: Path, *, toml: str,
                    provider: tuple[str, ...] = (),
                    between: Callable[[dict[str, str], str], None] | None = None) -> None:
    """The three homes, undo and fork; ``between(env, run_id)`` runs after each turn (the
    docker variant deletes the turn's container there)."""
    model_server.script = script
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "corral.toml").write_text(toml)
    homes = {n: tmp_path / f"home-{n}" for n in "abc"}
    with pg_schema_url() as url:

        def env_of(home: str) -> dict[str, str]:
            homes[home].mkdir(exist_ok=True)
            return {**base_env, "CORRAL_HOME": str(homes[home]), "CORRAL_STORE": url}

        def corral(home: str, *args: str) -> subprocess.CompletedProcess[str]:
            out = subprocess.run([*corral_cmd, *args], env=env_of(home), capture_output=True,
                                 text=True, timeout=240, check=False, cwd=ws)
            assert out.returncode == 0, out.stderr[-3000:]
            return out

        def turn(home: str, thread: str, run_id: str, prompt: str) -> int:
            start = len(model_server.model_requests)
            corral(home, "run", *provider, "--harness", "claude-code", "--run-id", run_id,
                   "--thread", thread, "--workspace", str(ws), "--json", prompt)
            if between is not None:
                between(env_of(home), run_id)
            return start

        turn("a", "T", "r1", "TURN-ONE please")
        s2 = turn("b", "T", "r2", "TURN-TWO please")
        # home b's fresh sandbox has turn 1's file, and the model got turn 1 back
        assert "one" in _result_of(model_server, s2, "TURN-TWO")
        assert "TURN-ONE please" in _history(model_server, s2, "TURN-TWO")
        s3 = turn("c", "T", "r3", "TURN-THREE please")
        assert "one.txt" in _result_of(model_server, s3, "TURN-THREE")
        assert "two.txt" in _result_of(model_server, s3, "TURN-THREE")
        history = _history(model_server, s3, "TURN-THREE")
        assert "TURN-ONE please" in history and "TURN-TWO please" in history

        # undo on the third home: the state after turn 2, files and conversation
        undone = json.loads(corral("c", "threads", "undo", "T", "--json").stdout)
        assert [r["run_id"] for r in undone["runs"] if r.get("undone_at")] == ["r3"]
        s4 = turn("c", "T", "r4", "CHECK after undo")
        listed = _result_of(model_server, s4, "CHECK")
        assert "one.txt" in listed and "two.txt" in listed and "three.txt" not in listed
        history = _history(model_server, s4, "CHECK")
        assert "TURN-TWO please" in history and "TURN-THREE please" not in history, history

        # fork from turn 1 on the first home: turn 1's state, in a new sandbox
        forked = json.loads(corral("a", "threads", "fork", "T", "--as", "F", "--at", "r1",
                                   "--json").stdout)
        assert forked["thread_id"] == "F" and forked["head"]
        s5 = turn("a", "F", "r5", "CHECK the fork")
        listed = _result_of(model_server, s5, "CHECK")
        assert "one.txt" in listed and "two.txt" not in listed, listed
        history = _history(model_server, s5, "CHECK")
        assert "TURN-ONE please" in history and "TURN-TWO please" not in history, history

        shown = json.loads(corral("b", "threads", "show", "T", "--json").stdout)
        assert [r["run_id"] for r in shown["runs"]] == ["r1", "r2", "r3", "r4"]
        assert all("id" in r["checkpoint"] for r in shown["runs"])
        listing = json.loads(corral("b", "threads", "ls", "--json").stdout)
        assert [t["thread_id"] for t in listing] == ["F", "T"]
        assert listing[1]["title"] == "TURN-ONE please" and listing[1]["runs"] == 4
    for home in homes.values():
        assert not (home / "sessions").exists()
