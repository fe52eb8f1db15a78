"""A run whose sandbox is removed under it (issue #26, 5): ``docker rm -f`` of its
container, or a bubblewrap sandbox destroyed underneath. Whatever the phase, and whether
its driver is alive or was killed, the run ends ``failed`` within a bounded time with
"the sandbox is gone (<provider> <name>)", code ``sandbox_gone``, and no host path in any
event. Two homes share one store; home B never saw the run before."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.providers._bubblewrap import BubblewrapProvider
from corral.journal._layout import encode_run_id
from corral.providers._docker import DockerProvider, container_name
from tests.corral_cli import CliHome
from tests.helpers import wait_until
from tests.plugins import read_until

# Prints two lines, waits for a file that never comes (the sandbox goes first).
SCRIPT = "echo one; echo two; while [ ! -e go ]; do sleep 0.05; done; echo three"
BOUND = 60.0
"""Seconds a run may take to end once its sandbox is gone (it takes about one second)."""


@pytest.fixture(params=["docker", "bubblewrap"])
def provider(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    request.getfixturevalue("need_docker" if name == "docker" else "need_bwrap_runs")
    return name


def _hosts(tmp_path: Path, corral_cmd: list[str], cli_env: dict[str, str]
           ) -> tuple[CliHome, CliHome]:
    (tmp_path / "shared").mkdir()
    url = f"sqlite://{tmp_path / 'shared' / 'corral.db'}"
    made = []
    for name in ("a", "b"):
        home = tmp_path / f"home-{name}"
        home.mkdir()
        host = CliHome(corral_cmd, {**cli_env, "CORRAL_HOME": str(home), "CORRAL_STORE": url,
                                    "CORRAL_LEASE_TTL": "3"}, home)
        host.db = tmp_path / "shared" / "corral.db"
        made.append(host)
    return made[0], made[1]


def _remove(provider: str, home: Path, sandbox_id: str) -> None:
    """Take the sandbox away underneath the run, as an operator or another host would."""
    if provider == "docker":
        subprocess.run(["docker", "rm", "-f", container_name(sandbox_id)], check=True,
                       capture_output=True, timeout=60)
    else:
        anyio.run(BubblewrapProvider(home).destroy, sandbox_id)


def _sandbox_id(host: CliHome, run_id: str) -> str:
    wait_until(lambda: (host.raw(run_id) or {}).get("sandbox_ref"), "the sandbox recorded",
               timeout=60)
    record = host.raw(run_id)
    assert record is not None
    sandbox_id: str = record["sandbox_ref"]["id"]
    return sandbox_id


def _supervisor_state(sandbox_id: str, run_id: str) -> Any:
    async def ask() -> Any:
        handle = await DockerProvider().resume(sandbox_id)
        assert handle is not None
        return (await handle.supervisor_status(encode_run_id(run_id))).get("state")

    return anyio.run(ask)


def _check_gone(host: CliHome, run_id: str, provider: str, sandbox_id: str,
                tmp_path: Path) -> None:
    record = host.raw(run_id)
    assert record is not None and record["status"] == "failed", record
    what = f"docker container {container_name(sandbox_id)}" if provider == "docker" \
        else f"bubblewrap sandbox {sandbox_id}"
    assert record["error"]["message"].startswith(f"the sandbox is gone ({what})"), record
    assert record["error"]["code"] == "sandbox_gone", record
    events = host.log(run_id)
    assert [e["type"] for e in events].count("RUN_ERROR") == 1
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "sandbox_gone"
    assert str(tmp_path) not in json.dumps(events), "a host path in the run's events"
    assert host.closed(run_id)


def test_removed_mid_output_with_the_driver_alive(
    provider: str, tmp_path: Path, corral_cmd: list[str], cli_env: dict[str, str]
) -> None:
    a, _ = _hosts(tmp_path, corral_cmd, cli_env)
    driver = a.popen("run", "--provider", provider, "--run-id", "g1", "--json", "--",
                     "sh", "-c", SCRIPT)
    try:
        read_until(driver, "two")
        sandbox_id = _sandbox_id(a, "g1")
        _remove(provider, a.home, sandbox_id)
        printed, err = driver.communicate(timeout=BOUND)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode != 0
    assert "the sandbox is gone" in printed + err, (printed, err)
    _check_gone(a, "g1", provider, sandbox_id, tmp_path)
    text = "".join(e.get("delta", "") for e in a.log("g1") if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text.startswith("one\ntwo")  # what was printed is kept


@pytest.mark.parametrize("successor", ["same home", "other home"])
def test_removed_mid_output_with_the_driver_killed(
    provider: str, successor: str, tmp_path: Path, corral_cmd: list[str],
    cli_env: dict[str, str]
) -> None:
    if provider == "bubblewrap" and successor == "other home" and os.geteuid() != 0:
        pytest.skip("another home reaches a bubblewrap sandbox as root only")
    a, b = _hosts(tmp_path, corral_cmd, cli_env)
    driver = a.popen("run", "--provider", provider, "--run-id", "g2", "--json", "--",
                     "sh", "-c", SCRIPT)
    read_until(driver, "two")
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    sandbox_id = _sandbox_id(a, "g2")
    _remove(provider, a.home, sandbox_id)
    host = a if successor == "same home" else b
    out = host.run("attach", "g2", "--json", timeout=BOUND)
    assert "the sandbox is gone" in out.stdout + out.stderr, (out.stdout, out.stderr)
    _check_gone(host, "g2", provider, sandbox_id, tmp_path)


def test_a_detached_run_whose_sandbox_was_removed_is_ended_by_one_sweep(
    provider: str, tmp_path: Path, corral_cmd: list[str], cli_env: dict[str, str]
) -> None:
    if provider == "bubblewrap" and os.geteuid() != 0:
        pytest.skip("another home reaches a bubblewrap sandbox as root only")
    a, b = _hosts(tmp_path, corral_cmd, cli_env)
    out = a.run("run", "--provider", provider, "--run-id", "g3", "--detach", "--",
                "sh", "-c", SCRIPT)
    assert out.returncode == 0, out.stderr
    sandbox_id = _sandbox_id(a, "g3")
    wait_until(lambda: a.raw("g3")["detached_since"] is not None,  # type: ignore[index]
               "the run detached", timeout=30)
    _remove(provider, a.home, sandbox_id)
    out = b.run("reap", "--json", timeout=BOUND)
    assert out.returncode == 0, out.stderr
    runs: list[dict[str, Any]] = json.loads(out.stdout)["runs"]
    assert [(r["run_id"], r["outcome"], r["status"]) for r in runs] == [
        ("g3", "finalized", "failed")], runs
    _check_gone(b, "g3", provider, sandbox_id, tmp_path)


def test_removed_after_the_agent_exited_before_anyone_logged_it(
    tmp_path: Path, corral_cmd: list[str], cli_env: dict[str, str], need_docker: None
) -> None:
    """The journal went with the container: the exit is lost, and the run says why
    (docker only: a bubblewrap run's journal is on the host, so its end is kept)."""
    a, b = _hosts(tmp_path, corral_cmd, cli_env)
    out = a.run("run", "--provider", "docker", "--run-id", "g4", "--detach", "--",
                "sh", "-c", "echo one; echo two")
    assert out.returncode == 0, out.stderr
    sandbox_id = _sandbox_id(a, "g4")
    wait_until(lambda: _supervisor_state(sandbox_id, "g4") == "exited", "the agent to exit",
               timeout=60)
    _remove("docker", a.home, sandbox_id)
    out = b.run("reap", "--json", timeout=BOUND)
    assert out.returncode == 0, out.stderr
    runs = json.loads(out.stdout)["runs"]
    assert [(r["run_id"], r["status"]) for r in runs] == [("g4", "failed")], runs
    _check_gone(b, "g4", "docker", sandbox_id, tmp_path)


def test_removed_before_launch_with_the_driver_alive(
    tmp_path: Path, corral_cmd: list[str], cli_env: dict[str, str], need_docker: None
) -> None:
    """The container goes while the workspace's setup runs (before the agent is launched):
    the run ends ``failed`` with the gone story, not a setup or Docker API error. (A killed
    driver before launch is the starter's death, told as such: test_reaper covers it.)"""
    a, _ = _hosts(tmp_path, corral_cmd, cli_env)
    run_id = f"g0-{os.getpid()}-{tmp_path.name}"[:100]
    (tmp_path / "def").mkdir()
    config = tmp_path / "def" / "slow-setup.toml"
    config.write_text('id = "slow-setup"\n[provider]\nname = "docker"\n[workspace]\n'
                      'setup = ["touch /tmp/setup-started; '
                      'while [ ! -e /tmp/go ]; do sleep 0.05; done"]\n')
    driver = a.popen("run", "--config", str(config), "--run-id", run_id, "--json", "--",
                     "sh", "-c", SCRIPT)
    try:
        seen: list[str] = []

        def setup_running() -> bool:
            found = subprocess.run(
                ["docker", "ps", "-q", "--filter", f"label=corral.run={run_id}"],
                capture_output=True, text=True, timeout=30, check=True).stdout.split()
            for cid in found:
                probe = subprocess.run(["docker", "exec", cid, "test", "-e",
                                        "/tmp/setup-started"], capture_output=True,
                                       timeout=30, check=False)
                if probe.returncode == 0:
                    seen.append(cid)
                    return True
            return False

        wait_until(setup_running, "the setup step to run", timeout=120, interval=0.2)
        container = seen[0]
        name = subprocess.run(["docker", "inspect", "-f", "{{index .Config.Labels "
                               "\"corral.sandbox\"}}", container], capture_output=True,
                              text=True, timeout=30, check=True).stdout.strip()
        subprocess.run(["docker", "rm", "-f", container], check=True, capture_output=True,
                       timeout=60)
        printed, err = driver.communicate(timeout=BOUND)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode != 0
    assert "the sandbox is gone" in printed + err, (printed, err)
    _check_gone(a, run_id, "docker", name, tmp_path)
