"""The journal supervisor's own work, in its process: started by :mod:`corral.journal._boot`
(the agent already running), it pumps the agent's output into the journal and the stderr
sidecar (redacting the run's secrets, within the output limit), waits for the agent (up to
its timeout), stops what is left of its process group, and appends the exit trailer
(:mod:`corral.journal._supervisor` says the whole story, and starts it).

Stdlib-only at import time: it runs in the supervisor process.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corral.journal._boot import start_agent
from corral.journal._layout import SupervisorStatus, write_status
from corral.journal._sentinel import TIMEOUT_EXIT_CODE, format_trailer, normalize_nonce
from corral.journal._supervisor import process_start_time, report_ready, write_all

__all__ = ["StreamRedactor", "supervise", "wait_exit"]

_F_SETPIPE_SZ = 1031


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
                write_all(self._fd, data)

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
                write_all(self._fd, last)
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
