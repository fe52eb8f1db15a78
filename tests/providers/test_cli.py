"""The sandbox CLI: corral exec, corral sandboxes, corral doctor (real subprocesses)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

PROVIDERS = ["local", "bubblewrap"]


def run(cmd: list[str], env: dict[str, str], stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(cmd, env=env, input=stdin, capture_output=True, timeout=120, check=False)


@pytest.fixture(params=PROVIDERS)
def provider_name(request: pytest.FixtureRequest) -> str:
    if request.param == "bubblewrap":
        request.getfixturevalue("need_bwrap")
    return str(request.param)


def test_exec_streams_and_exits_with_the_command_status(
    corral_cmd: list[str], cli_env: dict[str, str], provider_name: str, corral_home: Path
) -> None:
    r = run([*corral_cmd, "exec", "--provider", provider_name, "--",
             "sh", "-c", "echo out; echo err >&2; exit 7"], cli_env)
    assert (r.returncode, r.stdout, r.stderr) == (7, b"out\n", b"err\n")
    # A fresh sandbox is destroyed afterwards. (This provider's only: the docker daemon is
    # shared by every corral home on the machine, and lists their containers too.)
    ls = run([*corral_cmd, "sandboxes", "ls", "--json", "--provider", provider_name], cli_env)
    assert (ls.returncode, ls.stdout) == (0, b"[]\n")  # one document, also when empty
    # an empty listing for a person still says what the columns are
    ls = run([*corral_cmd, "sandboxes", "ls", "--provider", provider_name], cli_env)
    assert (ls.returncode, ls.stdout) == (0, b"ID                           PROVIDER    CREATED             STORE                  RUN\n")


def test_signal_death_exits_128_plus_n(corral_cmd: list[str], cli_env: dict[str, str], provider_name: str) -> None:
    r = run([*corral_cmd, "exec", "--provider", provider_name, "--", "sh", "-c", "kill -TERM $$"], cli_env)
    assert r.returncode == 143
    assert b"SIGTERM" in r.stderr


def test_keep_resume_stdin_and_rm(corral_cmd: list[str], cli_env: dict[str, str], provider_name: str) -> None:
    r = run([*corral_cmd, "exec", "--provider", provider_name, "--keep", "--",
             "sh", "-c", "echo kept > f"], cli_env)
    assert r.returncode == 0, r.stderr
    line = r.stderr.decode().strip().splitlines()[-1]
    assert line.startswith("corral: kept sandbox ")
    sandbox_id = line.split()[3]
    again = run([*corral_cmd, "exec", "--provider", provider_name, "--sandbox", sandbox_id, "--",
                 "sh", "-c", "cat f; cat"], cli_env, stdin=b"from stdin")
    assert (again.returncode, again.stdout) == (0, b"kept\nfrom stdin")
    ls = run([*corral_cmd, "sandboxes", "ls"], cli_env)
    assert sandbox_id.encode() in ls.stdout
    rm = run([*corral_cmd, "sandboxes", "rm", sandbox_id], cli_env)
    assert rm.returncode == 0
    gone = run([*corral_cmd, "exec", "--provider", provider_name, "--sandbox", sandbox_id, "--", "true"], cli_env)
    assert gone.returncode == 2 and b"Traceback" not in gone.stderr
    assert gone.stderr.count(b"\n") == 1 and sandbox_id.encode() in gone.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["exec"],
        ["exec", "--sandbox", "../etc", "--", "true"],
        ["exec", "--env", "NOEQUALS", "--", "true"],
        ["exec", "--provider", "local", "--cwd", "/nope", "--", "true"],
        ["exec", "--provider", "local", "--name", "bad/name", "--", "true"],
        ["sandboxes", "rm", "no-such-sandbox"],
    ],
)
def test_user_mistakes_are_one_line(corral_cmd: list[str], cli_env: dict[str, str], argv: list[str]) -> None:
    r = run([*corral_cmd, *argv], cli_env)
    assert r.returncode == 2
    assert b"Traceback" not in r.stderr
    assert r.stderr.startswith(b"corral: error: ") and r.stderr.count(b"\n") == 1, r.stderr


def test_timeout(corral_cmd: list[str], cli_env: dict[str, str], need_bwrap: None) -> None:
    r = run([*corral_cmd, "exec", "--timeout", "0.5", "--", "sleep", "30"], cli_env)
    assert r.returncode == 124 and b"timed out" in r.stderr  # as a run stopped by its timeout


def test_doctor(corral_cmd: list[str], cli_env: dict[str, str], need_bwrap: None) -> None:
    r = run([*corral_cmd, "doctor"], cli_env)
    out = r.stdout.decode()
    assert r.returncode == 0, out
    assert "[ ok ] bubblewrap" in out
    assert "NO isolation" in out
    assert "corral agents install claude" in out or "agent claude" in out
    for name in ("cgroups", "git", "python3", "npm", "node", "codex"):
        assert name in out
    from corral.stores._sqlite_tables import SCHEMA_VERSION

    assert "[ ok ] store" in out and "SQLite" in out and f"schema version {SCHEMA_VERSION}" in out
    # what does not exist yet is said once, not offered as a check that passes
    assert "not in this version: the Kubernetes" in out and "[ ok ] redis" not in out
    # ... and is true: nothing corral has is named there (the ACP harness was, once)
    stale = out.split("not in this version: ", 1)[1].split("\n", 1)[0]
    assert stale == "the Kubernetes provider, the Redis store"
    for harness in ("acp", "ACP", "claude-code", "codex", "gemini", "opencode"):
        assert harness not in stale
    as_json = run([*corral_cmd, "doctor", "--json"], cli_env)
    assert as_json.returncode == 0 and as_json.stdout.count(b"\n") == 1  # one document
    doc = json.loads(as_json.stdout)
    assert doc["ready"] is True and doc["not_in_this_version"] == [
        "the Kubernetes provider", "the Redis store"]
    assert {"name": "git", "status": "ok"}.items() <= next(
        c for c in doc["checks"] if c["name"] == "git").items()


def test_doctor_checks_the_docker_daemon_and_image(corral_cmd: list[str],
                                                   cli_env: dict[str, str],
                                                   need_docker: None) -> None:
    r = run([*corral_cmd, "doctor"], cli_env)
    out = r.stdout.decode()
    assert "[ ok ] docker " in out and "daemon " in out
    assert "[ ok ] docker image" in out and "corral-base:" in out
    # how a test container's commands ran: through its agent (the compiled agent is there)
    assert "[ ok ] docker commands    through the sandbox's agent" in out, out
    gone = run([*corral_cmd, "doctor"], {**cli_env, "DOCKER_HOST": "unix:///nonexistent.sock"})
    assert "[warn] docker " in gone.stdout.decode() and "start dockerd" in gone.stdout.decode()


def test_doctor_names_a_store_it_cannot_open(corral_cmd: list[str], cli_env: dict[str, str],
                                            tmp_path: Path, need_bwrap: None) -> None:
    r = run([*corral_cmd, "doctor", "--store", f"sqlite://{tmp_path}/no/such/dir/x.db"],
            cli_env)
    out = r.stdout.decode()
    assert r.returncode == 1, out
    assert "[MISS] store" in out and "does not exist" in out
    assert "fix the URL (--store or CORRAL_STORE)" in out
    assert "cannot run isolated sandboxes here: fix store" in out


def test_doctor_checks_a_postgres_store(corral_cmd: list[str], cli_env: dict[str, str],
                                        need_bwrap: None) -> None:
    from tests.helpers import drop_postgres_schema, postgres_schema

    schema, url = postgres_schema()
    try:
        r = run([*corral_cmd, "doctor", "--store", url], cli_env)
        out = r.stdout.decode()
        assert r.returncode == 0, out
        (line,) = [x for x in out.splitlines() if x.startswith("[ ok ] store")]
        assert "PostgreSQL" in line and "schema version" in line and "NOTIFY" in line, line
    finally:
        drop_postgres_schema(schema)


def test_doctor_names_the_cgroup_mount_option_that_makes_moves_quick() -> None:
    from corral.cli._doctor import _cgroup_migrations

    plain = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,relatime 0 0\n"
    slow = _cgroup_migrations(plain, in_group="no C compiler")
    assert slow is not None and slow.status == "warn" and "no C compiler" in slow.detail
    assert slow.fix.startswith("mount -o remount,favordynmods /sys/fs/cgroup ")
    assert "gcc" in slow.fix
    # local commands born in their group: only the fallback paths still move one
    born = _cgroup_migrations(plain, in_group=None)
    assert born is not None and born.status == "ok" and "fallback" in born.detail
    assert born.fix.startswith("mount -o remount,favordynmods")
    quick = _cgroup_migrations("cgroup2 /sys/fs/cgroup/unified cgroup2 rw,favordynmods 0 0\n",
                               in_group="no C compiler")
    assert quick is not None and quick.status == "ok"
    assert _cgroup_migrations("cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n", in_group=None) is None
