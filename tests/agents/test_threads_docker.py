"""The thread of ``test_threads_across_homes`` with docker as the provider (#27): the
thread keeps its sandbox (``reuse = "thread"``), and its container is deleted after every
turn (``docker rm -f``), so each next turn, on another home, gets a fresh container and
the thread's state from the store (workspace checkpoint, saved session)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from corral.providers._docker import container_name, volume_names
from corral.testing._model_server import ModelServer
from tests.agents.conftest import agent_cli_env
from tests.agents.test_threads_across_homes import thread_scenario

pytestmark = [pytest.mark.timeout(900), pytest.mark.usefixtures("need_docker",
                                                                 "agent_installs")]


def test_a_thread_continues_after_its_container_is_deleted_then_undo_and_fork(
        corral_cmd: list[str], cli_env: dict[str, str], model_server: ModelServer,
        bwfiles: Path, tmp_path: Path) -> None:
    deleted: list[str] = []

    def delete_container(env: dict[str, str], run_id: str) -> None:
        shown = subprocess.run([*corral_cmd, "show", run_id, "--json"], env=env,
                               capture_output=True, text=True, timeout=60, check=True)
        ref = json.loads(shown.stdout)["sandbox_ref"]
        assert ref["provider"] == "docker", ref
        subprocess.run(["docker", "rm", "-f", container_name(ref["id"])],
                       capture_output=True, timeout=120, check=True)
        deleted.append(ref["id"])

    try:
        thread_scenario(corral_cmd, agent_cli_env(cli_env, bwfiles, model_server),
                        model_server, tmp_path, provider=("--provider", "docker"),
                        toml='id = "threads-docker"\n[lifecycle]\nreuse = "thread"\n',
                        between=delete_container)
    finally:
        # the containers are gone; their workspace volumes go with gc, here at once
        for sandbox_id in deleted:
            subprocess.run(["docker", "volume", "rm", "-f",
                            *volume_names(sandbox_id).values()],
                           capture_output=True, timeout=120, check=False)
    assert len(deleted) == 5
