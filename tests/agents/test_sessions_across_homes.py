"""A thread's conversation outlives its host: the second turn of a Claude Code thread runs
from another ``$CORRAL_HOME`` (another host, as far as corral can tell) sharing only the
store, in a fresh bubblewrap sandbox, and the real CLI resumes the first turn's session,
restored from the store. Neither home keeps a session of its own."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.stores import open_store
from corral.testing._model_script import ModelRequest, Reply, Text
from corral.testing._model_server import ModelServer
from tests.agents.conftest import agent_cli_env
from tests.helpers import pg_schema_url

pytestmark = pytest.mark.timeout(300)


def script(req: ModelRequest) -> Reply:
    return Text("SECOND-ANSWER" if "second" in req.last_user_text else "FIRST-ANSWER-42")


@contextlib.contextmanager
def shared_store(kind: str, tmp_path: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite://{tmp_path / 'shared.db'}"
    else:
        with pg_schema_url() as url:
            yield url


async def _saved(url: str) -> Any:
    store = await open_store(url)
    try:
        return await store.list_sessions("T")
    finally:
        await store.aclose()


@pytest.mark.usefixtures("bwrap")
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_the_second_turn_on_another_home_resumes_the_conversation(
        kind: str, corral_cmd: list[str], cli_env: dict[str, str],
        model_server: ModelServer, bwfiles: Path, tmp_path: Path) -> None:
    model_server.script = script
    ws = tmp_path / "ws"
    ws.mkdir()
    # a fresh sandbox for every turn: nothing of turn 1 but the store reaches turn 2
    (ws / "corral.toml").write_text('id = "homes"\n[lifecycle]\nreuse = "none"\n')
    homes = [tmp_path / "home-a", tmp_path / "home-b"]
    with shared_store(kind, tmp_path) as url:

        def corral(home: Path, run_id: str, prompt: str) -> subprocess.CompletedProcess[str]:
            home.mkdir(exist_ok=True)
            env = {**agent_cli_env(cli_env, bwfiles, model_server), "CORRAL_HOME": str(home),
                   "CORRAL_STORE": url}
            return subprocess.run(
                [*corral_cmd, "run", "--harness", "claude-code", "--run-id", run_id,
                 "--thread", "T", "--workspace", str(ws), "--json", prompt],
                env=env, capture_output=True, text=True, timeout=240, check=False)

        first = corral(homes[0], "r1", "first prompt KESTREL-5")
        assert first.returncode == 0, first.stderr[-3000:]
        [saved] = anyio.run(_saved, url)
        assert saved.harness == "claude-code" and saved.run_id == "r1" and saved.files >= 1
        before = len(model_server.model_requests)

        second = corral(homes[1], "r2", "second prompt")
        assert second.returncode == 0, second.stderr[-3000:]
        [again] = anyio.run(_saved, url)
    turn2 = model_server.model_requests[before:]
    last = turn2[-1]
    assert "second prompt" in last.last_user_text
    history = "\n".join(last.texts)
    # the model got turn 1 back: the CLI resumed the session restored from the store
    assert "first prompt KESTREL-5" in history and "FIRST-ANSWER-42" in history, history
    assert again.session_id == saved.session_id and again.run_id == "r2"
    for home in homes:
        assert not (home / "sessions").exists(), list(home.iterdir())
    for out in (first, second):
        done = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        assert done, out.stdout[-2000:]
