"""The durable-run supervisor inside a container (the docker provider), and its readers.

Run as root in the container as ``python3 -I -S -c <this file's source> <mode>`` (stdlib
only, Python 3.8 compatible), the job as a JSON header on stdin (8 ASCII digits giving its
length, then the object). The run's files live in ``/run/corral-private/runs/<run>/`` (a
root-only tmpfs; ``<run>`` is the host's encoding of the run id, ``[A-Za-z0-9_.-]``): ``journal``
(the agent's stdout, then the exit trailer), ``journal.err`` (its stderr) and ``status``.

* ``start`` — ``{"run", "argv", "env", "cwd", "uid", "nonce", "stdin", "timeout",
  "max_output", "redact"}``: detach (double fork, new session, the exec's streams closed, so
  the exec ends and the supervisor lives on under the container's init), start the agent as
  ``uid`` (no supplementary groups, no capabilities: a plain setuid from root) in its own
  session with the given environment and cwd, its stdout and stderr piped to this process,
  which appends them to the journal and its sidecar, replacing the run's secret values
  (``redact``: value → name). The agent never holds a descriptor of either file, cannot
  read the directory, and never sees the nonce (it is in this process's memory only; a
  process of another uid cannot ptrace it or read its ``/proc`` files). The agent's
  ``oom_score_adj`` is 1000: when the container runs out of memory, the OOM killer takes
  the agent's processes before this one (unless the agent lowers its score back to 0). When the agent exits (or
  ``timeout`` passes: exit code 124; or its output passes ``max_output``, or what the
  private tmpfs has room for: it is stopped and the run fails naming the limit), what is
  left of its session is killed and the trailer is appended in one write. Prints
  ``{"pid": <supervisor pid>}`` once running.
* ``read`` — ``{"run", "name", "offset", "limit"}``: the bytes of ``journal`` or
  ``journal.err`` from ``offset`` (at most ``limit``); exit status 4 when the file does
  not exist.
* ``status`` — ``{"run"}``: the status file's JSON (``{}`` when there is none).
* ``stop`` — ``{"run", "grace"}``: SIGTERM the agent's session, SIGKILL it after ``grace``
  seconds (the supervisor then writes the trailer), wait for the trailer.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time

ROOT = "/run/corral-private/runs"
SIGTERM = 15
SIGKILL = 9
TIMEOUT_EXIT_CODE = 124
RESERVE = 1 << 20
"""Bytes of the private tmpfs kept free of output: the trailer, the notes and the status
file must always fit (the tmpfs is sized below the container's memory limit)."""


def _read_exact(n: int) -> bytes:
    out = b""
    while len(out) < n:
        got = os.read(0, n - len(out))
        if not got:
            raise SystemExit("corral: truncated header")
        out += got
    return out


def _job() -> dict:  # type: ignore[type-arg]
    job: dict = json.loads(_read_exact(int(_read_exact(8))))  # type: ignore[type-arg]
    run = str(job["run"])
    if not run or run.startswith(".") or any(
            not (c.isalnum() or c in "_.-~") for c in run):
        raise SystemExit("corral: bad run name")
    job["dir"] = f"{ROOT}/{run}"
    return job


def _trailer(nonce: str, code: int, sig: int | None) -> bytes:
    # the same bytes as corral.journal._sentinel.format_trailer
    s = "null" if sig is None else str(sig)
    return (f'\n{{"corral_exit":1,"code":{code},"signal":{s},"nonce":"{nonce}"}}\n').encode()


def _status(d: str, doc: dict) -> None:  # type: ignore[type-arg]
    tmp = f"{d}/status.tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh)
    os.replace(tmp, f"{d}/status")


def output_budget(max_output: int | None, d: str) -> int:
    """What the agent may write: ``max_output``, and never more than the private tmpfs
    has room for (less a reserve for the trailer)."""
    st = os.statvfs(d)
    room = max(0, st.f_bavail * st.f_frsize - RESERVE)
    return room if max_output is None else min(int(max_output), room)


def _oom_first() -> None:
    """Make this process (the agent, before it drops root) the OOM killer's first choice.
    (A hostile agent can lower its score back to 0: a floor needs ``CAP_SYS_RESOURCE``.)"""
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("1000")
    except OSError:
        pass


class _Sink:
    """Appends to one file, redacting secret values across chunk boundaries, within a byte
    budget shared by both streams (``budget``: ``[bytes left, exceeded]``)."""

    def __init__(self, path: str, table: dict, budget: list) -> None:  # type: ignore[type-arg]
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        self.table = sorted(((k.encode(), f"[REDACTED:{v}]".encode())
                             for k, v in table.items() if k), key=lambda kv: -len(kv[0]))
        self.pending = b""
        self.budget = budget

    def _sub(self, data: bytes) -> bytes:
        for value, name in self.table:
            data = data.replace(value, name)
        return data

    def feed(self, chunk: bytes) -> None:
        data = self._sub(self.pending + chunk)
        # hold back the longest tail that may be the start of a secret value
        hold = 0
        for value, _ in self.table:
            for k in range(min(len(value) - 1, len(data)), hold, -1):
                if data.endswith(value[:k]):
                    hold = k
                    break
        self.pending = data[len(data) - hold:] if hold else b""
        self._write(data[:len(data) - hold])

    def flush(self) -> None:
        if self.pending:
            self._write(self._sub(self.pending))
            self.pending = b""

    def _write(self, data: bytes, charge: bool = True) -> None:
        if charge:
            if len(data) > self.budget[0]:
                self.budget[1] = True
            data = data[:max(0, self.budget[0])]
            self.budget[0] -= len(data)
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]


def _kill_session(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except OSError:
        pass


def _supervise(job: dict, ready_w: int) -> None:  # type: ignore[type-arg]
    d = job["dir"]
    limit = output_budget(job.get("max_output"), d)
    budget = [limit, False]
    out = _Sink(f"{d}/journal", job.get("redact") or {}, budget)
    err = _Sink(f"{d}/journal.err", job.get("redact") or {}, budget)
    pid, out_r, err_r = _start_agent(job)
    _status(d, {"state": "running", "supervisor_pid": os.getpid(), "agent_pid": pid})
    os.write(ready_w, json.dumps({"pid": os.getpid()}).encode())
    os.close(ready_w)
    deadline = time.monotonic() + job["timeout"] if job.get("timeout") else None
    open_fds = {out_r: out, err_r: err}
    status, timed_out = _pump_until_exit(pid, deadline, open_fds, budget)
    # stragglers of the agent's session must not write after the trailer
    _kill_session(pid, SIGKILL)
    _drain(open_fds)
    out.flush()
    err.flush()
    if budget[1]:
        err._write(f"\ncorral: stopped: the agent wrote more than {limit} bytes of output "
                   "(the run's output limit)\n".encode(), charge=False)
    if timed_out:
        code, sig = TIMEOUT_EXIT_CODE, None
    elif os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        code = 128 + sig
    else:
        code, sig = os.WEXITSTATUS(status), None
    os.write(out.fd, _trailer(job["nonce"], code, sig))
    _status(d, {"state": "exited", "code": code, "signal": sig, "agent_pid": pid})


def _start_agent(job: dict) -> tuple[int, int, int]:  # type: ignore[type-arg]
    """Fork the agent as the job's uid in its own session, its output piped to this
    process and the job's stdin written to it; returns its pid and the read ends of its
    stdout and stderr."""
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    in_r, in_w = os.pipe2(os.O_CLOEXEC)
    uid = int(job["uid"])
    argv = [a.encode() for a in job["argv"]]
    env = {k.encode(): v.encode() for k, v in job["env"].items()}
    pid = os.fork()
    if pid == 0:  # the agent
        try:
            os.setsid()
            _oom_first()
            os.dup2(in_r, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.chdir(job["cwd"])
            os.execvpe(argv[0], argv, env)
        except OSError as exc:
            os.write(2, f"corral: cannot start {job['argv'][0]}: {exc.strerror}\n".encode())
            os._exit(127 if exc.errno == 2 else 126)
    for fd in (in_r, out_w, err_w):
        os.close(fd)
    data = job.get("stdin") or ""
    if data:
        try:
            os.write(in_w, data.encode("latin-1"))
        except OSError:
            pass
    os.close(in_w)
    return pid, out_r, err_r


def _pump_until_exit(pid: int, deadline: float | None, open_fds: dict[int, _Sink],
                     budget: list) -> tuple[int, bool]:  # type: ignore[type-arg]
    """Feed the agent's output to its sinks until it exits (stopped past the output limit
    or the deadline); returns its wait status and whether the deadline stopped it."""
    status: int | None = None
    timed_out = over = False
    while status is None:
        wait = 0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic()))
        ready, _, _ = select.select(list(open_fds), [], [], wait) if open_fds else ([], [], [])
        if not open_fds:
            time.sleep(wait)
        for fd in ready:
            chunk = os.read(fd, 65536)
            if chunk:
                open_fds[fd].feed(chunk)
            else:
                del open_fds[fd]
        if budget[1] and not over:
            over = True  # the output limit: the agent is stopped, the run fails
            _kill_session(pid, SIGKILL)
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
        elif deadline is not None and time.monotonic() >= deadline:
            timed_out = True
            _kill_session(pid, SIGKILL)
            _, status = os.waitpid(pid, 0)
    return status, timed_out


def _drain(open_fds: dict[int, _Sink]) -> None:
    """What is still in the pipes, without waiting for a straggler that holds them."""
    for fd, sink in list(open_fds.items()):
        os.set_blocking(fd, False)
        try:
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                sink.feed(chunk)
        except OSError:
            pass


def start() -> None:
    job = _job()
    os.makedirs(job["dir"], mode=0o700, exist_ok=False)
    ready_r, ready_w = os.pipe()
    if os.fork() == 0:
        os.close(ready_r)
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        devnull = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)  # the exec's streams end with the launcher
        try:
            _supervise(job, ready_w)
        finally:
            os._exit(0)
    os.close(ready_w)
    report = b""
    while True:
        chunk = os.read(ready_r, 4096)
        if not chunk:
            break
        report += chunk
    if not report:
        raise SystemExit("corral: the supervisor did not start")
    sys.stdout.write(report.decode() + "\n")


def read() -> None:
    job = _job()
    name = "journal" if job["name"] == "journal" else "journal.err"
    try:
        fd = os.open(f"{job['dir']}/{name}", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        sys.exit(4)
    os.lseek(fd, int(job["offset"]), 0)
    left = int(job["limit"])
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        left -= len(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(1, view):]


def status() -> None:
    job = _job()
    try:
        with open(f"{job['dir']}/status") as fh:
            sys.stdout.write(fh.read())
    except FileNotFoundError:
        sys.stdout.write("{}")


def stop() -> None:
    job = _job()
    try:
        with open(f"{job['dir']}/status") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return
    if doc.get("state") != "running":
        return
    agent = int(doc["agent_pid"])
    _kill_session(agent, SIGTERM)
    deadline = time.monotonic() + float(job.get("grace", 2.0))
    killed = False
    while time.monotonic() < deadline + 10:
        with open(f"{job['dir']}/status") as fh:
            if json.load(fh).get("state") == "exited":
                return
        if not killed and time.monotonic() >= deadline:
            _kill_session(agent, SIGKILL)
            killed = True
        time.sleep(0.05)


if __name__ == "__main__":
    MODES = {"start": start, "read": read, "status": status, "stop": stop}
    MODES[sys.argv[1]]()
