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

Stdlib-only at import time: it is the supervisor process's entry point.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral._errors import ConfigError, CorralError
from corral.journal._boot import set_non_dumpable as set_non_dumpable
from corral.journal._boot import start_agent
from corral.journal._layout import JournalPaths, SupervisorStatus, read_status, write_status
from corral.journal._sentinel import TIMEOUT_EXIT_CODE, format_trailer, normalize_nonce

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

_F_SETPIPE_SZ = 1031
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
    if not spec.argv or not all(isinstance(a, str) and "\0" not in a for a in spec.argv):
        raise ConfigError("agent argv must be a non-empty list of strings without NUL bytes")
    t = spec.timeout
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < 1e9):
        raise ConfigError(f"agent timeout must be a positive number of seconds, not {t!r}")
    try:
        normalize_nonce(nonce)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    paths.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    payload = json.dumps(
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
    try:
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(job_w, view) :]
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


# ---------------------------------------------------------------- the supervisor process


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def supervise(job: dict[str, Any], ready_fd: int, started: dict[str, Any] | None = None
              ) -> int:
    """The supervisor's work once it runs (see the module docstring); ``started``: what
    :func:`corral.journal._boot.start_agent` returned when the agent was started before
    this module was imported (``None``: start it now)."""
    if started is None:
        started = start_agent(job)
    nonce: str = job.pop("nonce")
    normalize_nonce(nonce)
    status_path = Path(job["status"])
    me, my_start = os.getpid(), process_start_time(os.getpid()) or 0
    # No O_APPEND: this process is the files' only writer (the agent's output comes through
    # it), and the kernel cannot splice into an O_APPEND file. Each starts at its end.
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    budget = _OutputBudget(job.get("max_output"))
    out = _Sink(_open_at_end(job["journal"], flags), budget)
    err = _Sink(_open_at_end(job["stderr"], flags), budget)
    timeout: float | None = job.get("timeout")
    redact: dict[str, str] = job.pop("redact", None) or {}
    agent: subprocess.Popen[bytes] | None = started["agent"]
    if agent is None:
        spawn_error: str = started["error"]
        err.write(f"corral supervisor: {spawn_error}\n".encode(), charge=False)
        write_status(
            status_path,
            SupervisorStatus("running", me, my_start, None, None, spawn_error=spawn_error),
        )
        report_ready(ready_fd, {"supervisor_pid": me, "agent_pid": None, "spawn_error": spawn_error})
        return _finish(out, err, status_path, nonce, me, my_start, None, None,
                       int(started["code"]), None, spawn_error, kill_stragglers=False)

    agent_start = process_start_time(agent.pid)
    budget.on_exceeded = lambda: _kill_group(agent.pid)
    write_status(status_path, SupervisorStatus("running", me, my_start, agent.pid, agent_start))
    report_ready(ready_fd, {"supervisor_pid": me, "agent_pid": agent.pid})
    pumps = []
    wake_r, wake_w = os.pipe()
    for pipe, sink in ((agent.stdout, out), (agent.stderr, err)):
        pump = threading.Thread(target=_pump, args=(pipe, sink, redact, wake_r), daemon=True)
        pump.start()
        pumps.append(pump)
    rc = _wait(agent, timeout, err)
    if budget.exceeded:
        err.write(f"\ncorral: stopped: the agent wrote more than {budget.limit} bytes of "
                  "output (the run's output limit)\n".encode(), charge=False)
    code, sig = (128 - rc, -rc) if rc < 0 else (rc, None)
    if rc == _TIMED_OUT:
        code, sig = TIMEOUT_EXIT_CODE, None
    kill_stragglers = bool(job.get("kill_stragglers", True))
    if kill_stragglers:
        _kill_group(agent.pid)
    # The pumps copy what is in the pipes now, then stop: an escaped straggler may hold
    # them open forever, and what it writes after this is dropped.
    os.write(wake_w, b"x")
    for pump in pumps:
        pump.join(timeout=2.0)
    return _finish(out, err, status_path, nonce, me, my_start, agent.pid, agent_start, code, sig,
                   None, kill_stragglers=kill_stragglers)


_TIMED_OUT = -(1 << 20)
_TIMEOUT_GRACE = 5.0


def _wait(agent: subprocess.Popen[bytes], timeout: float | None, err: _Sink) -> int:
    """The agent's return code, or ``_TIMED_OUT`` once it was stopped after ``timeout``
    seconds (SIGTERM to its group, SIGKILL ``_TIMEOUT_GRACE`` seconds later)."""
    rc = wait_exit(agent, timeout)
    if rc is not None:
        return rc
    err.write(f"\ncorral: stopped after the run's timeout of {timeout:g}s\n".encode(),
              charge=False)
    for sig, grace in ((signal.SIGTERM, _TIMEOUT_GRACE), (signal.SIGKILL, None)):
        try:
            os.killpg(agent.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        if wait_exit(agent, grace) is not None:
            break
    return _TIMED_OUT


def wait_exit(proc: subprocess.Popen[bytes], timeout: float | None) -> int | None:
    """``proc``'s return code, or ``None`` while it still runs after ``timeout`` seconds.

    Woken by the exit itself (a pidfd, Linux ≥ 5.3): ``Popen.wait(timeout)`` polls with
    sleeps growing to 50 ms, which every run's end waited through, ~25 ms on average, before
    the trailer was written. Elsewhere that polling wait."""
    if timeout is None:
        return proc.wait()
    try:
        fd = os.pidfd_open(proc.pid)  # ours and not yet reaped: the pid cannot be reused
    except (AttributeError, OSError):
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return proc.poll()
            # in slices: poll() takes an int of milliseconds (a day fits)
            if poller.poll(min(left, 86400.0) * 1000):
                return proc.wait()
    finally:
        os.close(fd)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _OutputBudget:
    """The bytes of output the agent may still put into the journal and the sidecar
    together (``None``: no limit). The journal lives on the host, outside the sandbox's
    disk quota: past the limit, output is dropped and ``on_exceeded`` (stop the agent)
    runs once."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._left = limit
        self._lock = threading.Lock()
        self.exceeded = False
        self.on_exceeded: Callable[[], None] = lambda: None

    def reserve(self, n: int, *, exact: bool = True) -> int:
        """Take up to ``n`` bytes; fewer (0 included) near the limit. ``exact``: ``n``
        bytes are really waiting to be written, so getting fewer means the limit is passed
        (a splice asks for room without knowing how much is there)."""
        with self._lock:
            if self._left is None:
                return n
            granted = min(n, self._left)
            self._left -= granted
        if exact and granted < n:
            self.overflow()
        return granted

    def overflow(self) -> None:
        with self._lock:
            first = not self.exceeded
            self.exceeded = True
        if first:
            self.on_exceeded()

    def refund(self, n: int) -> None:
        with self._lock:
            if self._left is not None:
                self._left += n


class _Sink:
    """An output file (journal or sidecar) the pumps and the supervisor write to. Once
    sealed, writes are dropped: a straggler's pump that outlives the trailer can neither
    write after it nor into whatever file later reuses the descriptor's number."""

    def __init__(self, fd: int, budget: _OutputBudget) -> None:
        self._fd = fd
        self._budget = budget
        self._lock = threading.Lock()
        self._sealed = False

    def write(self, data: bytes, *, charge: bool = True) -> None:
        """Append ``data`` (the agent's output is ``charge``d to the output budget; the
        supervisor's own notes are not)."""
        if charge:
            data = data[: self._budget.reserve(len(data))]
        with self._lock:
            if not self._sealed and data:
                _write_all(self._fd, data)

    def splice_from(self, src: int) -> int:
        """Move what the pipe ``src`` holds (up to 1 MiB) to the file in the kernel, without
        copying it through this process; the byte count, 0 at EOF. Raises
        :class:`BlockingIOError` when the pipe is empty, :class:`OSError` where the file
        system cannot splice. Past the output budget, what is read is dropped."""
        granted = self._budget.reserve(1 << 20, exact=False)
        with self._lock:
            if self._sealed or granted == 0:
                self._budget.refund(granted)
                dropped = os.read(src, 1 << 20)
                if dropped and not self._sealed:
                    self._budget.overflow()
                return len(dropped)
            try:
                moved = os.splice(src, self._fd, granted)
            except BaseException:
                self._budget.refund(granted)
                raise
        self._budget.refund(granted - moved)
        return moved

    def seal(self, last: bytes = b"") -> int:
        """Write ``last`` (in one write), close the file, and return the offset ``last``
        starts at."""
        with self._lock:
            start = os.fstat(self._fd).st_size
            if last:
                _write_all(self._fd, last)
            self._sealed = True
            os.close(self._fd)
            return start


def _open_at_end(path: str, flags: int) -> int:
    fd = os.open(path, flags, 0o600)
    os.lseek(fd, 0, os.SEEK_END)
    return fd


def _pump(pipe: Any, sink: _Sink, table: dict[str, str], wake: int) -> None:
    """Copy ``pipe`` to ``sink`` with every secret in ``table`` redacted, without delaying
    complete lines (only a possible secret prefix at the end of a partial line waits).
    Ends at EOF, or once ``wake`` is readable (the agent exited) and the pipe is empty."""
    redactor = StreamRedactor(table) if table else None
    fd = pipe.fileno()
    os.set_blocking(fd, False)
    with contextlib.suppress(OSError):  # fewer, larger reads (the default pipe holds 64 KiB)
        fcntl.fcntl(fd, _F_SETPIPE_SZ, 1 << 20)
    draining = eof = False
    splice = True
    try:
        while not eof:
            ready, _, _ = select.select([fd] if draining else [fd, wake], [], [],
                                        0 if draining else None)
            if fd not in ready:
                if draining:
                    break
                draining = True
                continue
            while True:  # all that is there now, then wait again
                try:
                    if redactor is None and splice:
                        try:
                            if sink.splice_from(fd) == 0:
                                eof = True
                                break
                            continue
                        except BlockingIOError:
                            break
                        except OSError:
                            splice = False  # this file system cannot: copy instead
                    chunk = os.read(fd, 1 << 20)
                except BlockingIOError:
                    break
                if not chunk:
                    eof = True
                    break
                data = redactor.feed(chunk) if redactor is not None else chunk
                if data:
                    sink.write(data)
        tail = redactor.flush() if redactor is not None else b""
        if tail:
            sink.write(tail)
    except OSError:
        pass


class StreamRedactor:
    """Redacts a byte stream chunk by chunk; a secret split across chunks is still found.

    Bytes are held back only while they could still be the start of a secret: at most the
    longest secret minus one byte, and none after a newline when no secret holds one.
    """

    def __init__(self, table: dict[str, str]) -> None:
        ordered = sorted(table, key=len, reverse=True)
        self._names = {v.encode(): n for v, n in table.items()}
        self._re = re.compile(b"|".join(re.escape(v.encode()) for v in ordered))
        self._hold = max((len(v.encode()) for v in ordered), default=1) - 1
        self._nl_safe = not any(b"\n" in v.encode() for v in ordered)
        self._buf = b""

    def _sub(self, data: bytes, safe: int) -> tuple[bytes, int]:
        out: list[bytes] = []
        pos = 0
        for m in self._re.finditer(data):
            if m.start() >= safe:
                break
            out.append(data[pos : m.start()])
            out.append(b"[REDACTED:" + self._names[m.group(0)].encode() + b"]")
            pos = m.end()
        end = max(pos, safe)
        out.append(data[pos:end])
        return b"".join(out), end

    def feed(self, chunk: bytes) -> bytes:
        data = self._buf + chunk
        safe = len(data) - self._hold
        if self._nl_safe:
            safe = max(safe, data.rfind(b"\n") + 1)
        safe = max(0, safe)
        out, end = self._sub(data, safe)
        self._buf = data[end:]
        return out

    def flush(self) -> bytes:
        out, _ = self._sub(self._buf, len(self._buf))
        self._buf = b""
        return out


def report_ready(fd: int, report: dict[str, Any]) -> None:
    try:
        _write_all(fd, json.dumps(report).encode())
        os.close(fd)
    except OSError:
        pass  # the launcher is gone; the run goes on regardless


def _finish(
    out: _Sink, err: _Sink, status_path: Path, nonce: str, me: int, my_start: int,
    agent_pid: int | None,
    agent_start: int | None, code: int, sig: int | None, spawn_error: str | None, *,
    kill_stragglers: bool,
) -> int:
    if kill_stragglers and agent_pid is not None:
        try:
            os.killpg(agent_pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    hint = out.seal(format_trailer(nonce, code, sig))
    err.seal()
    write_status(
        status_path,
        SupervisorStatus("exited", me, my_start, agent_pid, agent_start, code, sig, hint,
                         spawn_error),
    )
    return 0
