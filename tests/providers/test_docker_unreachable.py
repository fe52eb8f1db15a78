"""A docker provider whose daemon does not answer fails with corral's one-line error, never
an SDK exception, on every path that talks to the daemon (no daemon needed here)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from corral.providers._docker import DockerProvider
from corral.providers._docker_client import DockerUnavailable
from corral.sandbox._contracts import SnapshotRef


@pytest.mark.anyio
@pytest.mark.parametrize("call", ["delete", "exists"])
async def test_snapshot_calls_on_a_dead_daemon_say_what_to_do(tmp_path: Path, call: str) -> None:
    provider = DockerProvider(docker_host=f"unix://{tmp_path}/no-daemon.sock")
    snaps = provider.snapshotter()
    ref = SnapshotRef("docker", "abc")
    with pytest.raises(DockerUnavailable) as err:
        if call == "delete":
            await snaps.delete(ref)
        else:
            await snaps.exists(ref)
    message = str(err.value)
    assert "\n" not in message and "start dockerd" in message


def _dead_daemon_env(cli_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    return {**cli_env, "DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock"}


def _one_line_with_the_fix(stderr: str, tmp_path: Path) -> None:
    assert stderr.count("\n") == 1 and stderr.endswith("\n"), stderr  # no traceback
    assert stderr.startswith(f"corral: error: the Docker daemon at unix://{tmp_path}/no-daemon"
                             ".sock did not answer (No such file or directory): start dockerd, "
                             "or set DOCKER_HOST / [provider] docker_host")


def test_exec_on_a_dead_daemon_is_one_line_with_the_fix(
    corral_cmd: list[str], cli_env: dict[str, str], tmp_path: Path
) -> None:
    r = subprocess.run([*corral_cmd, "exec", "--provider", "docker", "--", "true"],
                       env=_dead_daemon_env(cli_env, tmp_path), capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 2 and r.stdout == ""
    _one_line_with_the_fix(r.stderr, tmp_path)


def test_a_run_on_a_dead_daemon_is_refused_and_leaves_no_record(
    corral_cmd: list[str], cli_env: dict[str, str], corral_home: Path, tmp_path: Path
) -> None:
    env = _dead_daemon_env(cli_env, tmp_path)
    r = subprocess.run([*corral_cmd, "run", "--provider", "docker", "--", "true"], env=env,
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 2 and r.stdout == ""
    _one_line_with_the_fix(r.stderr, tmp_path)
    ls = subprocess.run([*corral_cmd, "ls", "--json"], env=env, capture_output=True, text=True,
                        timeout=120, check=False)
    assert (ls.returncode, ls.stdout) == (0, "[]\n")
