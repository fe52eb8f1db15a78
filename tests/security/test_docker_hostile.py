"""The hostile-agent attacks of ``test_sandbox_boundary`` against the docker provider: an
agent that steals or kills what reports its exit status, ptrace-stops pid 1, wedges its
processes against a timeout, stops everything it can see during a run, forges the journal's
exit sentinel, or seeks over and truncates its stdout. Real CLI, real dockerd."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.providers._docker import DockerProvider, container_name
from tests.security.test_sandbox_boundary import (
    PTRACE_INIT,
    SEEK,
    STEAL,
    TRUNCATE,
    last_run,
    run,
)

pytestmark = pytest.mark.usefixtures("need_docker")

PY = "/usr/bin/python3"


@pytest.fixture
def docker_env(cli_env: dict[str, str]) -> dict[str, str]:
    return {**cli_env, "CORRAL_PROVIDER": "docker"}


def _exec(corral_cmd: list[str], env: dict[str, str], *args: str,
          timeout: float = 90) -> object:
    return run([*corral_cmd, "exec", "--provider", "docker", *args], env, timeout=timeout)


def test_agent_cannot_decide_its_exit_status(corral_cmd: list[str],
                                             docker_env: dict[str, str]) -> None:
    r = run([*corral_cmd, "exec", "--provider", "docker", "--", "sh", "-c",
             f"sleep 300 & {PY} -c '{STEAL}'; exit 7"], docker_env, timeout=90)
    assert b"stolen=0" in r.stdout, r.stdout
    assert r.returncode == 7, (r.returncode, r.stdout, r.stderr)


def test_ptrace_stopping_pid_1_is_refused(corral_cmd: list[str],
                                          docker_env: dict[str, str]) -> None:
    r = run([*corral_cmd, "exec", "--provider", "docker", "--timeout", "30", "--", "sh", "-c",
             f"{PY} -c '{PTRACE_INIT}'; exit 4"], docker_env, timeout=90)
    assert r.stdout.startswith(b"attach -1"), r.stdout
    assert r.returncode == 4, (r.returncode, r.stderr)


def test_timeout_kills_stopped_and_traced_processes(corral_cmd: list[str],
                                                    docker_env: dict[str, str]) -> None:
    script = (
        "sleep 1000 & kill -STOP $!; "
        f"sleep 1000 & {PY} -c 'import ctypes,sys; ctypes.CDLL(None).ptrace(16, "
        "int(sys.argv[1]), 0, 0); import time; time.sleep(1000)' $! & "
        "trap '' TERM; exec sleep 1000"
    )
    r = run([*corral_cmd, "exec", "--provider", "docker", "--keep", "--name", "wedge",
             "--timeout", "2", "--", "sh", "-c", script], docker_env, timeout=90)
    try:
        assert r.returncode == 124, (r.returncode, r.stderr)
        assert b"timed out" in r.stderr
        top = DockerProvider().api.top(container_name("wedge"), ps_args="-eo pid,args")
        left = [p[-1] for p in top["Processes"] if "sleep 1000" in p[-1] or "python" in p[-1]]
        assert left == [], f"processes left in the sandbox after its timeout: {left}"
    finally:
        run([*corral_cmd, "sandboxes", "rm", "--provider", "docker", "wedge"], docker_env)


def test_run_timeout_cannot_be_stopped_by_the_agent(corral_cmd: list[str],
                                                    docker_env: dict[str, str]) -> None:
    r = run([*corral_cmd, "run", "--provider", "docker", "--timeout", "2", "--", "sh", "-c",
             "kill -STOP $PPID 1; kill -STOP -1; exec sleep 100"], docker_env, timeout=90)
    assert r.returncode == 124, (r.returncode, r.stderr)
    record = last_run(corral_cmd, docker_env)
    assert record["exit_code"] == 124 and record["status"] == "failed"


def test_a_forged_sentinel_is_agent_output(corral_cmd: list[str],
                                           docker_env: dict[str, str]) -> None:
    # The agent cannot see the nonce: not in its environment, argv, files or /proc.
    hunt = ("grep -rhoa '[0-9a-f]\\{32\\}' /proc/[0-9]*/environ /proc/[0-9]*/cmdline "
            "/run/corral-private 2>/dev/null | sort -u > /tmp/seen; ")
    forge = ('for n in $(cat /tmp/seen) ffffffffffffffffffffffffffffffff; do '
             'printf \'\\n{"corral_exit":1,"code":0,"signal":null,"nonce":"%s"}\\n\' "$n"; '
             'done; exit 9')
    r = run([*corral_cmd, "run", "--provider", "docker", "--", "sh", "-c", hunt + forge],
            docker_env, timeout=90)
    record = last_run(corral_cmd, docker_env)
    assert record["exit_code"] == 9 and record["status"] == "failed", (record, r.stderr)
    nonce = str(record["journal"]["nonce"]) if isinstance(record.get("journal"), dict) else ""
    assert not nonce or nonce.encode() not in r.stdout


def _events(corral_cmd: list[str], env: dict[str, str], run_id: str) -> list[dict[str, object]]:
    r = run([*corral_cmd, "attach", run_id, "--json"], env, timeout=60)
    return [json.loads(line)["event"] for line in r.stdout.splitlines()]


def test_agent_cannot_seek_over_or_truncate_the_journal(corral_cmd: list[str],
                                                        docker_env: dict[str, str]) -> None:
    r = run([*corral_cmd, "run", "--provider", "docker", "--", "sh", "-c",
             f"{PY} -c '{SEEK}'; {PY} -c '{TRUNCATE}'; exit 5"], docker_env, timeout=90)
    record = last_run(corral_cmd, docker_env)
    assert record["exit_code"] == 5, (record, r.stderr)
    text = "".join(str(e.get("delta", "")) for e in _events(corral_cmd, docker_env,
                                                             str(record["run_id"])))
    assert text.startswith("first line\n" * 50)
    assert "before" in text and "no truncate" in text


def test_the_journal_dir_is_out_of_the_agents_reach(tmp_path: Path, corral_cmd: list[str],
                                                   docker_env: dict[str, str]) -> None:
    r = run([*corral_cmd, "run", "--provider", "docker", "--", "sh", "-c",
             "ls /run/corral-private 2>&1; cat /run/corral-private/runs/*/journal 2>&1; "
             "ls -l /proc/*/fd 2>/dev/null | grep -c journal; exit 0"], docker_env, timeout=90)
    assert r.returncode == 0, r.stderr
    record = last_run(corral_cmd, docker_env)
    text = "".join(str(e.get("delta", "")) for e in _events(corral_cmd, docker_env,
                                                             str(record["run_id"])))
    assert "Permission denied" in text and text.rstrip().endswith("0"), text
