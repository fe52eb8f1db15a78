"""The journal supervisor: runs the agent detached from the driving process.

``launch_supervised`` starts ``python -I -S …/corral/journal/_boot.py`` in a new session
(see :mod:`._boot` for why a file of its own); that process reads its whole job (agent argv, env, cwd, stdin, file paths **and the nonce**) from
an inherited pipe, forks once more (double fork: the supervisor is reparented to init / the
nearest subreaper and is not a session leader), and exits. The grandchild, the supervisor:

1. marks itself non-dumpable (``PR_SET_DUMPABLE=0``: other non-root processes of the same uid
   cannot read its ``/proc/<pid>/{mem,environ,fd}``); its argv holds only fd numbers and its
   environment only ``PATH``/``PYTHONPATH``/locale, so the nonce lives in its memory alone;
2. opens the journal and the stderr sidecar (never truncating; it is their only writer)
   and starts the agent in its own session and process group, its stdout/stderr *piped* to
   this process, which appends them to those files (redacting the run's secrets; spliced in
   the kernel when there are none): the agent never holds a
   descriptor of the journal, so it cannot clear ``O_APPEND``, seek or truncate it. (Piping
   loses nothing when the driver dies: this process outlives it.) stdin is ``/dev/null`` or
   a pipe that gets the given bytes (after ``stdin_prefix``); no other fds;
3. writes the status file (pids + start times), reports readiness to the launcher, waits
   (at most ``timeout`` seconds: then it stops the agent and records exit code 124);
4. when the agent exits: SIGKILLs what is left of the agent's process group (stragglers must
   not write after the sentinel; what a child that escaped with ``setsid`` writes later is
   dropped), appends the trailer in one write, records the exit in the status file, and
   exits.

A SIGTERM/SIGINT sent to the supervisor is forwarded to the agent's process group (the
sentinel is still written). The driver can be SIGKILLed at any point after
``launch_supervised`` returned without affecting either process.

This module is the launcher's side (and the process probes both sides use); what the
supervisor process does once it runs is :mod:`corral.journal._supervise`'s. Stdlib-only at
import time: the supervisor process imports it too.
"""

from __future__ import annotations

import base64
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral._errors import ConfigError, CorralError
from corral.journal._boot import set_non_dumpable as set_non_dumpable
from corral.journal._layout import JournalPaths, read_status
from corral.journal._sentinel import normalize_nonce

__all__ = [
    "AgentSpec",
    "SupervisedRun",
    "SupervisorError",
    "is_ours",
    "kill_supervised",
    "kill_supervised_async",
    "launch_supervised",
    "launch_supervised_async",
    "process_start_time",
    "supervisor_alive",
]

_BOOT = str(Path(__file__).with_name("_boot.py"))
"""The supervisor's entry point: the agent starts before this module is imported."""


class SupervisorError(CorralError):
    """The supervisor could not be started (the message carries its diagnostics)."""


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """What the supervisor runs: a *host* argv (e.g. a provider's ``host_command``)."""

    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    """The agent's complete environment (nothing is inherited)."""
    cwd: str | None = None
    stdin: bytes | None = None
    """Bytes written to the agent's stdin, which is then closed; ``None`` = ``/dev/null``."""
    redact: Mapping[str, str] = field(default_factory=dict, repr=False)
    """``{secret value or encoding: name}``: the supervisor writes the agent's stdout and
    stderr to the journal and the sidecar with every occurrence replaced by
    ``[REDACTED:NAME]``, so secret values never reach a file."""
    stdin_prefix: bytes = field(default=b"", repr=False)
    """Written to the agent's stdin before ``stdin`` (``HostCommand.stdin_prefix``)."""
    timeout: float | None = None
    """Seconds the agent may run; then the supervisor (out of the agent's reach) stops it
    and records exit code 124 (:data:`~corral.sandbox._contracts.TIMEOUT_EXIT_CODE`)."""
    max_output: int | None = None
    """Bytes the agent may write to stdout and stderr together (the journal and sidecar
    live on the host, outside any sandbox quota); past it the supervisor stops the agent
    (SIGKILL) and says why on the sidecar. ``None``: no limit."""


@dataclass(frozen=True, slots=True)
class SupervisedRun:
    """What ``launch_supervised`` learned. ``spawn_error`` set = the agent never started
    (the journal still gets a sentinel: 127 not found, 126 not executable)."""

    paths: JournalPaths
    supervisor_pid: int
    agent_pid: int | None
    spawn_error: str | None = None


# ---------------------------------------------------------------- process identity


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """``(state, starttime)`` from ``/proc/<pid>/stat``, or ``None`` if there is no such pid."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # comm may contain spaces and parens: fields start after the *last* ')'.
    rest = raw[raw.rfind(b")") + 2 :].split()
    try:
        return rest[0].decode(), int(rest[19])
    except (IndexError, ValueError):
        return None


def process_alive(pid: int) -> bool:
    """``pid`` exists and is neither a zombie nor dead."""
    st = _proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def process_start_time(pid: int) -> int | None:
    """A process's start time in clock ticks since boot, ``None`` if it does not exist."""
    st = _proc_stat(pid)
    return st[1] if st else None


def is_ours(pid: int | None, start: int | None, *, zombie_ok: bool = False) -> bool:
    """``pid`` is still the process that started at ``start`` (not a reused pid); a zombie
    counts only with ``zombie_ok``."""
    if pid is None or start is None:
        return False
    st = _proc_stat(pid)
    if st is None or st[1] != start:
        return False
    return zombie_ok or st[0] not in ("Z", "X")


def supervisor_alive(paths: JournalPaths) -> bool:
    """Whether this run's supervisor process is still running (pid reuse is detected)."""
    st = read_status(paths.status)
    return st is not None and is_ours(st.supervisor_pid, st.supervisor_start)


# ---------------------------------------------------------------- launcher (driver side)


def child_env() -> dict[str, str]:
    """The environment of a detached corral helper process (supervisor, services daemon):
    only what the interpreter needs to import corral (and ``CORRAL_TEST_SESSION``, a test
    suite's marker, when set); never the driver's secrets."""
    src = str(Path(__file__).resolve().parents[2])
    env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "PYTHONPATH": src}
    env["LC_ALL"] = "C.UTF-8"
    # A test suite's marker (no secret: a session id) lets it find the helpers that outlive
    # it: these are detached from whoever started them, so only their environment tells.
    marker = os.environ.get("CORRAL_TEST_SESSION")
    if marker:
        env["CORRAL_TEST_SESSION"] = marker
    return env


def launch_supervised(
    spec: AgentSpec,
    paths: JournalPaths,
    nonce: str,
    *,
    kill_stragglers: bool = True,
    timeout: float = 30.0,
    python: str = sys.executable,
) -> SupervisedRun:
    """Start a detached supervisor that runs ``spec`` with its output going to ``paths``.

    Blocks until the agent has been spawned (typically ~0.1 s); use
    :func:`launch_supervised_async` from async code. The journal file exists when this
    returns. ``nonce`` goes to the supervisor over a pipe only. Raises
    :class:`~corral._errors.ConfigError` for a bad spec and :class:`SupervisorError` if the
    supervisor did not come up.
    """
    _check_spec(spec, nonce)
    paths.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    payload = _job(spec, paths, nonce, kill_stragglers)
    proc, job_w, ready_r = _start_boot(python, paths)
    try:
        try:
            write_all(job_w, payload)
        except BrokenPipeError:
            pass  # the supervisor died early; reported below from its log
        finally:
            os.close(job_w)
        report = read_ready_report(ready_r, timeout, "supervisor_pid")
    finally:
        os.close(ready_r)
        try:
            proc.wait(timeout=timeout)  # the intermediate exits right after forking
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if report is None:
        raise SupervisorError(
            f"the journal supervisor did not start within {timeout}s; its log "
            f"{paths.supervisor_log} says: {file_tail(paths.supervisor_log)!r}"
        )
    return SupervisedRun(
        paths=paths,
        supervisor_pid=int(report["supervisor_pid"]),
        agent_pid=report.get("agent_pid"),
        spawn_error=report.get("spawn_error"),
    )


def _check_spec(spec: AgentSpec, nonce: str) -> None:
    if not spec.argv or not all(isinstance(a, str) and "\0" not in a for a in spec.argv):
        raise ConfigError("agent argv must be a non-empty list of strings without NUL bytes")
    t = spec.timeout
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < 1e9):
        raise ConfigError(f"agent timeout must be a positive number of seconds, not {t!r}")
    try:
        normalize_nonce(nonce)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _job(spec: AgentSpec, paths: JournalPaths, nonce: str, kill_stragglers: bool) -> bytes:
    """The supervisor's whole job, as it reads it from its pipe (the nonce only there)."""
    return json.dumps(
        {
            "nonce": nonce,
            "argv": list(spec.argv),
            "env": dict(spec.env),
            "cwd": spec.cwd,
            "stdin": base64.b64encode(spec.stdin).decode() if spec.stdin is not None else None,
            "stdin_prefix": base64.b64encode(spec.stdin_prefix).decode(),
            "timeout": spec.timeout,
            "max_output": spec.max_output,
            "redact": dict(spec.redact),
            "journal": str(paths.journal),
            "stderr": str(paths.stderr),
            "status": str(paths.status),
            "kill_stragglers": kill_stragglers,
        }
    ).encode()


def _start_boot(python: str, paths: JournalPaths) -> tuple[subprocess.Popen[bytes], int, int]:
    """Start the supervisor's entry point in a new session; returns it, the write end of
    its job pipe and the read end of its readiness pipe (the caller closes both)."""
    job_r, job_w = os.pipe()
    ready_r, ready_w = os.pipe()
    log_fd = os.open(paths.supervisor_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        proc = subprocess.Popen(
            # by path, isolated (-I -S): see corral.journal._boot
            [python, "-I", "-S", _BOOT, "--job-fd", str(job_r), "--ready-fd", str(ready_w)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log_fd,
            pass_fds=(job_r, ready_w),
            close_fds=True,
            start_new_session=True,
            cwd="/",
            env=child_env(),
        )
    except OSError as exc:
        for fd in (job_r, job_w, ready_r, ready_w):
            os.close(fd)
        raise SupervisorError(f"cannot start the supervisor with {python!r}: {exc}") from exc
    finally:
        os.close(log_fd)
    os.close(job_r)
    os.close(ready_w)
    return proc, job_w, ready_r


async def launch_supervised_async(
    spec: AgentSpec, paths: JournalPaths, nonce: str, *, kill_stragglers: bool = True,
    timeout: float = 30.0,
) -> SupervisedRun:
    """:func:`launch_supervised` in a worker thread."""
    import anyio.to_thread  # lazy: keeps the supervisor process's start-up stdlib-only

    return await anyio.to_thread.run_sync(
        lambda: launch_supervised(
            spec, paths, nonce, kill_stragglers=kill_stragglers, timeout=timeout
        )
    )


def read_ready_report(fd: int, timeout: float, key: str) -> dict[str, Any] | None:
    """Read a detached child's one JSON readiness report from ``fd`` until EOF (bounded by
    ``timeout``); ``None`` if it never came, is not JSON, or lacks ``key``."""
    deadline = time.monotonic() + timeout
    buf = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        readable, _, _ = select.select([fd], [], [], left)
        if not readable:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
    try:
        report = json.loads(buf)
    except ValueError:
        return None
    return report if isinstance(report, dict) and key in report else None


def file_tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_bytes()[-n:].decode("utf-8", "replace").strip()
    except OSError:
        return ""


# ---------------------------------------------------------------- cancel


def kill_supervised(
    paths: JournalPaths, *, grace: float = 5.0, include_supervisor: bool = False
) -> bool:
    """Stop the agent of a supervised run from any process on the host.

    SIGTERM to the agent's process group, up to ``grace`` seconds for the supervisor to
    record the exit, then SIGKILL to the group and another ``grace``. The supervisor then
    writes the sentinel (code ``128 + N``). With ``include_supervisor`` (or if the supervisor
    is still alive after all that) the supervisor is SIGKILLed too, so no sentinel may be
    written. Returns whether the status file records the agent's exit. Pids are checked
    against their recorded start times, so a reused pid is never signalled.
    """

    st = read_status(paths.status)
    if st is None:
        return False

    def recorded() -> bool:
        now = read_status(paths.status)
        return now is not None and now.state == "exited"

    def settled() -> bool:
        # Done when the exit is recorded, or nobody is left to record it and the agent is
        # gone too (supervisor SIGKILLed earlier: the orphaned agent is reaped by init).
        if recorded():
            return True
        sup = is_ours(st.supervisor_pid, st.supervisor_start)
        return not sup and not is_ours(st.agent_pid, st.agent_start)

    for sig in (signal.SIGTERM, signal.SIGKILL):
        if settled():
            break
        # zombie_ok: an unreaped agent still pins its pid, so its group id is ours.
        if st.agent_pid is not None and is_ours(st.agent_pid, st.agent_start, zombie_ok=True):
            try:
                os.killpg(st.agent_pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + grace
        while not settled() and time.monotonic() < deadline:
            time.sleep(0.01)
    if (include_supervisor or not settled()) and is_ours(st.supervisor_pid, st.supervisor_start):
        try:
            os.kill(st.supervisor_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return recorded()


async def kill_supervised_async(
    paths: JournalPaths, *, grace: float = 5.0, include_supervisor: bool = False
) -> bool:
    """:func:`kill_supervised` in a worker thread."""
    import anyio.to_thread  # lazy, as in launch_supervised_async

    return await anyio.to_thread.run_sync(
        lambda: kill_supervised(paths, grace=grace, include_supervisor=include_supervisor)
    )


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def report_ready(fd: int, report: dict[str, Any]) -> None:
    try:
        write_all(fd, json.dumps(report).encode())
        os.close(fd)
    except OSError:
        pass  # the launcher is gone; the run goes on regardless
