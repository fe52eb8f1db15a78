"""Attacks on the sandbox boundary, the exit status and the journal.

Each test is the attack itself, run through the real CLI against each isolating provider
in turn (``target``: bubblewrap as root, and docker with a real dockerd): a repository
whose corral.toml names a secret ``LD_PRELOAD``, an agent that steals the exit reporter's
descriptor or kills it, one that ptrace-stops the sandbox's pid 1 or the process that
enforces the timeout, one that forges the journal's exit sentinel, one that clears
``O_APPEND`` on its stdout, seeks and truncates it, and one that prints without end. The
attacks only a container has are in ``test_docker_container``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from corral.testing._plugin import require
from tests.security.conftest import Target

PY = "/usr/bin/python3"  # inside the sandbox: the host's /usr, read-only


def run(argv: list[str], env: dict[str, str], timeout: float = 120,
        cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, env=env, capture_output=True, timeout=timeout, check=False,
                          cwd=cwd)


def last_run(corral_cmd: list[str], cli_env: dict[str, str]) -> dict[str, object]:
    """The newest run's record, as ``corral ls --json`` gives it."""
    listing = run([*corral_cmd, "ls", "--json"], cli_env)
    assert listing.returncode == 0, listing.stderr
    record: dict[str, object] = json.loads(listing.stdout)[0]
    return record


# ----------------------------------------------------------------- 1. host code execution

PRELOAD_C = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void corral_pwned(void) {
    FILE *f = fopen("@MARKER@", "a");
    if (f) { fprintf(f, "ran as uid %d in %s\n", (int)getuid(), "@WHERE@"); fclose(f); }
}
"""


@pytest.fixture
def evil_so(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Path, Path]:
    """A shared object whose constructor records, in a host file, that it ran."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    require(request.config, gcc is not None, "a C compiler", "apt-get install gcc")
    assert gcc is not None
    marker = tmp_path / "pwned"
    src = tmp_path / "evil.c"
    src.write_text(PRELOAD_C.replace("@MARKER@", str(marker)).replace("@WHERE@", "host"))
    so = tmp_path / "repo" / "evil.so"
    so.parent.mkdir()
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    so.chmod(0o755)
    return so, marker


def test_repository_secret_named_ld_preload_runs_nothing_on_the_host(
    evil_so: tuple[Path, Path], target: Target
) -> None:
    so, marker = evil_so
    repo = so.parent
    (repo / "p.txt").write_text(str(so))
    (repo / "corral.toml").write_text(textwrap.dedent(f"""
        [secrets]
        LD_PRELOAD = {{ file = "{repo / 'p.txt'}" }}
    """))
    r = run(target.argv("run", "--workspace", str(repo), "--", "sh", "-c",
                        'test "$LD_PRELOAD" = "[REDACTED:LD_PRELOAD]" || echo "$LD_PRELOAD" '
                        '| wc -c'), target.env, cwd=repo)
    assert not marker.exists(), f"the repository's .so ran on the host: {marker.read_text()}"
    assert r.returncode == 0, r.stderr
    # The command did get the variable, inside the sandbox (where the path does not exist).
    assert last_run(target.corral, target.env)["exit_code"] == 0


def test_exec_env_reaches_the_sandbox_only(
    evil_so: tuple[Path, Path], target: Target
) -> None:
    so, marker = evil_so
    r = run(target.argv("exec", "--env", f"LD_PRELOAD={so}", "--env", "SEEN=yes", "--",
                        "sh", "-c", 'echo "$SEEN $LD_PRELOAD"'), target.env)
    assert not marker.exists(), f"--env LD_PRELOAD ran code on the host: {marker.read_text()}"
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().strip() == f"yes {so}"


def _host_processes_holding(marker: bytes) -> list[str]:
    """Processes of the host's pid namespace (not the sandbox's) whose argv or
    environment holds ``marker``."""
    mine = os.readlink("/proc/self/ns/pid")
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/ns/pid") != mine or int(pid) == os.getpid():
                continue
            for what in ("cmdline", "environ"):
                if marker in Path(f"/proc/{pid}/{what}").read_bytes():
                    found.append(f"{pid} {what}: {Path(f'/proc/{pid}/cmdline').read_bytes()[:200]!r}")
        except OSError:
            continue
    return found


def test_nothing_given_for_the_command_is_in_a_host_process(target: Target) -> None:
    # argv, environment and working directory of the command: all user-controlled, all
    # delivered inside the sandbox only (the launchers' argv and env are corral's own; on
    # docker, the exec's configuration and the runtime's processes).
    marker = "m" + os.urandom(8).hex()
    proc = subprocess.Popen(
        target.argv("exec", "--env", f"MARK={marker}-env", "--", "sh", "-c",
                    f"mkdir -p /tmp/{marker}-cwd; echo ready; read x; : {marker}-argv"),
        env=target.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline() == b"ready\n"
        # the corral CLI itself was given these (it is the user's own process): skip it
        leaks = [x for x in _host_processes_holding(marker.encode())
                 if not x.startswith(f"{proc.pid} ")]
        assert leaks == [], leaks
    finally:
        proc.stdin.write(b"x\n")
        proc.stdin.close()
        proc.wait(timeout=60)
    assert proc.returncode == 0


@pytest.mark.parametrize("bad", ["1ABC", "A-B", "A B", "", "Ä"])
def test_invalid_env_names_are_refused_in_one_line(
    bad: str, corral_cmd: list[str], cli_env: dict[str, str]
) -> None:
    r = run([*corral_cmd, "exec", "--env", f"{bad}=x", "--", "true"], cli_env)
    err = r.stderr.decode()
    assert r.returncode != 0 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert "NAME=VALUE" in err or "POSIX" in err


def test_invalid_secret_name_in_corral_toml_is_refused(
    tmp_path: Path, corral_cmd: list[str], cli_env: dict[str, str]
) -> None:
    (tmp_path / "v").write_text("x")
    (tmp_path / "corral.toml").write_text(f'[secrets]\n"BAD\\n" = {{ file = "{tmp_path}/v" }}\n')
    r = run([*corral_cmd, "run", "--workspace", str(tmp_path), "--", "true"], cli_env)
    err = r.stderr.decode()
    assert r.returncode != 0 and "Traceback" not in err and "POSIX" in err, err


# ----------------------------------------------------------------- 2. the exit status

STEAL = r"""
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
me, parent = os.getpid(), os.getppid()
stolen = killed = 0
for name in os.listdir("/proc"):
    if not name.isdigit() or int(name) in (me, parent):
        continue
    pid = int(name)
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        continue
    for fd in range(3, 64):
        got = libc.syscall(438, pidfd, fd, 0)  # pidfd_getfd
        if got >= 0:
            try:
                os.write(got, b"0\n")  # a forged "exited 0" report
                stolen += 1
            except OSError:
                pass
    try:
        os.kill(pid, signal.SIGKILL)
        killed += 1
    except OSError:
        pass
print(f"stolen={stolen} killed={killed}", flush=True)
"""


def test_agent_cannot_decide_its_exit_status(target: Target) -> None:
    r = run(target.argv("exec", "--", "sh", "-c", f"sleep 300 & {PY} -c '{STEAL}'; exit 7"),
            target.env, timeout=90)
    assert b"stolen=0" in r.stdout, r.stdout  # no descriptor of the reporter could be taken
    assert r.returncode == 7, (r.returncode, r.stdout, r.stderr)


def test_killing_everything_it_sees_does_not_fake_a_signal_death(target: Target) -> None:
    # The command's own background job keeps stdout open: exec must not wait for it.
    r = run(target.argv("exec", "--", "sh", "-c", f"sleep 300 & {PY} -c '{STEAL}'; exit 3"),
            target.env, timeout=90)
    assert r.returncode == 3, (r.returncode, r.stderr)


# ----------------------------------------------------------------- 3. wedging the sandbox

PTRACE_INIT = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
rc = libc.ptrace(16, 1, 0, 0)  # PTRACE_ATTACH to pid 1 of the sandbox
print("attach", rc, os.strerror(ctypes.get_errno()), flush=True)
"""


def test_ptrace_stopping_pid_1_is_refused(target: Target) -> None:
    r = run(target.argv("exec", "--timeout", "30", "--", "sh", "-c",
                        f"{PY} -c '{PTRACE_INIT}'; exit 4"), target.env, timeout=90)
    assert r.stdout.startswith(b"attach -1"), r.stdout
    assert r.returncode == 4, (r.returncode, r.stderr)


def test_timeout_kills_stopped_and_traced_processes(target: Target) -> None:
    # A stopped child, a child ptrace-stopped by its sibling, and a command that ignores
    # SIGTERM: the timeout still ends it all, with the timeout's exit status.
    script = (
        "sleep 1000 & kill -STOP $!; "
        f"sleep 1000 & {PY} -c 'import ctypes,sys; ctypes.CDLL(None).ptrace(16, int(sys.argv[1]), 0, 0); "
        "import time; time.sleep(1000)' $! & "
        "trap '' TERM; exec sleep 1000"
    )
    name = target.sandbox_name("wedge")
    try:
        r = run(target.argv("exec", "--keep", "--name", name, "--timeout", "2", "--",
                            "sh", "-c", script), target.env, timeout=90)
        assert r.returncode == 124, (r.returncode, r.stderr)
        assert b"timed out" in r.stderr
        left = target.processes_left(name)
        assert left == [], f"processes left in the sandbox after its timeout: {left}"
    finally:
        target.rm(name)


def test_run_timeout_cannot_be_stopped_by_the_agent(target: Target) -> None:
    # Stop whatever might enforce the timeout from inside: the parent, pid 1, everyone.
    r = run(target.argv("run", "--timeout", "2", "--", "sh", "-c",
                        "kill -STOP $PPID 1; kill -STOP -1; exec sleep 100"), target.env,
            timeout=90)
    assert r.returncode == 124, (r.returncode, r.stderr)
    record = last_run(target.corral, target.env)
    assert record["exit_code"] == 124 and record["status"] == "failed"


# ----------------------------------------------------------------- 4. the journal

SEEK = r"""
import fcntl, os, sys
sys.stdout.write("first line\n" * 50); sys.stdout.flush()
try:
    fl = fcntl.fcntl(1, fcntl.F_GETFL)
    fcntl.fcntl(1, fcntl.F_SETFL, fl & ~os.O_APPEND)
    os.lseek(1, 0, os.SEEK_SET)
    print("seeked", flush=True)
except OSError as exc:
    print("no seek:", exc.strerror, flush=True)
"""

TRUNCATE = r"""
import os, sys
sys.stdout.write("before\n"); sys.stdout.flush()
try:
    os.ftruncate(1, 0)
    print("truncated", flush=True)
except OSError as exc:
    print("no truncate:", exc.strerror, flush=True)
"""


def _events(corral_cmd: list[str], cli_env: dict[str, str], run_id: str) -> list[dict[str, object]]:
    r = run([*corral_cmd, "attach", run_id, "--json"], cli_env, timeout=60)
    return [json.loads(line)["event"] for line in r.stdout.splitlines()]


def test_agent_cannot_seek_over_the_journal(target: Target) -> None:
    r = run(target.argv("run", "--", "sh", "-c", f"{PY} -c '{SEEK}'; exit 5"), target.env)
    record = last_run(target.corral, target.env)
    assert record["exit_code"] == 5, (record, r.stderr)
    assert b"exit status is lost" not in r.stderr
    text = "".join(str(e.get("delta", "")) for e in _events(target.corral, target.env,
                                                             str(record["run_id"])))
    assert text.startswith("first line\n" * 50)


def test_agent_cannot_truncate_the_journal(target: Target) -> None:
    r = run(target.argv("run", "--", "sh", "-c", f"{PY} -c '{TRUNCATE}'; exit 6"), target.env,
            timeout=90)
    record = last_run(target.corral, target.env)
    assert record["exit_code"] == 6, (record, r.stderr)
    assert b"before" in r.stdout and b"no truncate" in r.stdout


def test_a_forged_sentinel_is_agent_output(target: Target) -> None:
    # The agent hunts the nonce (its environment, argv, files, /proc, docker's private
    # tmpfs) and prints exit sentinels with whatever it found: they stay its output.
    hunt = ("grep -rhoa '[0-9a-f]\\{32\\}' /proc/[0-9]*/environ /proc/[0-9]*/cmdline "
            "/run/corral-private 2>/dev/null | sort -u > /tmp/seen; ")
    forge = ('for n in $(cat /tmp/seen) ffffffffffffffffffffffffffffffff; do '
             'printf \'\\n{"corral_exit":1,"code":0,"signal":null,"nonce":"%s"}\\n\' "$n"; '
             'done; exit 9')
    r = run(target.argv("run", "--", "sh", "-c", hunt + forge), target.env, timeout=90)
    record = last_run(target.corral, target.env)
    assert record["exit_code"] == 9 and record["status"] == "failed", (record, r.stderr)
    assert b'"code":0' in r.stdout  # the forgeries were printed, as the agent's output


# ----------------------------------------------------------------- 9. what /proc shows


def test_proc_inside_shows_nothing_of_the_host_environment(
    tmp_path: Path, target: Target
) -> None:
    host_dir = tmp_path / "host-working-dir-marker"
    host_dir.mkdir()
    r = run(target.argv("exec", "--", "sh", "-c",
                        "for p in /proc/[0-9]*; do cat $p/environ $p/cmdline 2>/dev/null; "
                        "done; env"), target.env, cwd=host_dir)
    assert r.returncode == 0, r.stderr
    assert b"host-working-dir-marker" not in r.stdout
    assert b"CORRAL_HOME" not in r.stdout and str(tmp_path).encode() not in r.stdout


def test_the_hosts_key_and_store_url_stay_out_of_runs(tmp_path: Path, target: Target) -> None:
    """corral's signing key (``CORRAL_SECRET``) and a store URL that may carry a password
    are the host's: neither reaches a run's processes nor their output."""
    key = "corral-secret-marker-" + "k" * 24
    env = {**target.env, "CORRAL_SECRET": key,
           "CORRAL_STORE": f"sqlite://{tmp_path / 'store-marker.db'}"}
    target.stores.append(env)
    r = run(target.argv("run", "--", "sh", "-c",
                        "for p in /proc/[0-9]*; do cat $p/environ $p/cmdline 2>/dev/null; "
                        "done; env"), env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert key.encode() not in r.stdout and b"store-marker" not in r.stdout
    assert b"CORRAL_SECRET" not in r.stdout and b"CORRAL_STORE" not in r.stdout


# ----------------------------------------------------------------- 9. output outside quotas


def test_agent_output_is_bounded_on_the_host(target: Target) -> None:
    # The journal lives on the host (bubblewrap), or in the container's memory and its
    # mirror on the host (docker), outside the sandbox's disk quota: an agent printing
    # without end must be stopped at the run's output limit, and say so.
    # (2 MiB: every line is an event in the run's log, so the test's time grows with it)
    r = run(target.argv("run", "--max-output", "2M", "--", "sh", "-c",
                        "yes aaaaaaaaaaaaaaaaaaaaaaaa & yes bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb >&2; "
                        "wait"), target.env, timeout=300)
    assert r.returncode != 0
    record = last_run(target.corral, target.env)
    assert record["status"] == "failed"
    assert "output limit" in str(record["error"]), record["error"]
    written = sum(p.stat().st_size for p in (target.home / "journals").iterdir()
                  if p.suffix in (".journal", ".err"))
    assert written < (2 << 20) + (1 << 20), written  # the limit, plus the trailer and notes


def test_bad_max_output_is_one_line(corral_cmd: list[str], cli_env: dict[str, str]) -> None:
    r = run([*corral_cmd, "run", "--max-output", "lots", "--", "true"], cli_env)
    err = r.stderr.decode()
    assert r.returncode == 2 and "Traceback" not in err and "--max-output" in err, err
