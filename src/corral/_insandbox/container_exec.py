"""In-container helper of the Docker provider: run a command, kill a command's tree.

Run inside the container as ``python3 -I -S -c <this file's source> run|kill`` (stdlib
only, Python 3.8 compatible). It is on every command's round trip, so it imports nothing but
``os`` and ``sys`` (its start-up is most of the round trip). The header comes on stdin: 8
ASCII digits giving the length of NUL-separated fields.

* ``run`` (as root) — fields ``nonce, token, uid, cwd, argc, argv..., KEY=VALUE...``: start
  ``argv`` as ``uid`` (no groups, no capabilities) in its own session with exactly that
  environment (plus ``CORRAL_EXEC=<token>``, by which ``kill``
  finds the whole tree), inheriting the rest of stdin, stdout and stderr; wait; kill what it
  left running; then append to stderr the trailer ``\\0corral-exit:<nonce>:e<code>\\0``
  (``s<signal>`` for a death by signal; ``:memory``/``:pids`` when the container's cgroup
  counted a limit hit meanwhile). The nonce never reaches the command: it is in the memory
  of this process only, which stays root, so the command (another uid, no capabilities) can
  neither ptrace it, read its ``/proc`` files nor signal it; it cannot forge or suppress
  how it ended. The environment never appears in an argv or in the
  exec's configuration (which the daemon keeps and ``docker inspect`` shows).
* ``kill`` — fields ``token, signal``: signal every process whose environment carries
  ``CORRAL_EXEC=<token>``.

``kill`` runs with the agent's uid, so it can do nothing the agent could not do itself.
"""

from __future__ import annotations

import os
import sys

SIGKILL = 9  # Linux numbers: ``signal`` imports ``enum``, which costs a command's start-up
SIGPIPE = 13
SIG_DFL = 0


def _read_exact(n: int) -> bytes:
    out = b""
    while len(out) < n:
        got = os.read(0, n - len(out))
        if not got:
            raise SystemExit("corral: truncated header")
        out += got
    return out


def _fields() -> list[bytes]:
    """The ``run``/``kill`` header: NUL-separated fields (no JSON: its import is slow)."""
    size = int(_read_exact(8))
    return _read_exact(size).split(b"\0")


_COUNTERS = {  # which limit a counter of the container's cgroup counts hits of (v1, v2)
    "memory": (("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill"),
               ("/sys/fs/cgroup/memory.events", "oom_kill")),
    "pids": (("/sys/fs/cgroup/pids/pids.events", "max"), ("/sys/fs/cgroup/pids.events", "max")),
}


def _counters() -> dict[str, int]:
    out = {}
    for limit, places in _COUNTERS.items():
        for path, key in places:
            try:
                with open(path) as fh:
                    rows = dict(line.split() for line in fh if len(line.split()) == 2)
                out[limit] = int(rows[key])
                break
            except (OSError, KeyError, ValueError):
                continue
    return out


def run() -> None:
    # nonce, token, uid, cwd, argc, argv..., then KEY=VALUE environment entries
    f = _fields()
    nonce, token, uid, cwd, argc = f[0], f[1].decode(), int(f[2]), f[3], int(f[4])
    argv = f[5:5 + argc]
    env = dict(e.split(b"=", 1) for e in f[5 + argc:] if b"=" in e)
    env[b"CORRAL_EXEC"] = token.encode()
    import _signal  # type: ignore[import-not-found]  # the C module: no enum

    _signal.signal(SIGPIPE, SIG_DFL)

    def trailer(kind: bytes, n: int, limit: str = "") -> None:
        os.write(2, b"\0corral-exit:" + nonce + b":" + kind + str(n).encode()
                 + (b":" + limit.encode() if limit else b"") + b"\0")

    if not os.path.isdir(cwd):
        trailer(b"c", 0)
        return
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # the command: the agent's uid, own session, the given cwd and environment
        try:
            os.close(err_r)
            os.setsid()
            _oom_first()
            _become(uid)
            os.chdir(cwd)
            os.execvpe(argv[0], argv, env)
        except OSError as exc:
            os.write(err_w, str(exc.errno).encode())
        os._exit(127)
    os.close(err_w)
    failed = os.read(err_r, 64)
    os.close(err_r)
    # the child has its own stdin now: ours must not keep it open
    os.close(0)
    before = _counters()
    _, status = os.waitpid(pid, 0)
    after = _counters()
    # what the command left running ends with it (background processes are spawned)
    _sweep_as(uid, token)
    if failed:
        code = 126 if int(failed) in (1, 13) else 127  # EPERM, EACCES: found, not runnable
        what = "permission denied" if code == 126 else "command not found"
        os.write(2, f"corral: {what}: {argv[0].decode(errors='replace')}\n".encode())
        trailer(b"e", code)
        return
    # a limit hit while the command ran (another command's hit would be counted too)
    hit = next((k for k in ("memory", "pids") if after.get(k, 0) > before.get(k, 0)), "")
    if os.WIFSIGNALED(status):
        trailer(b"s", os.WTERMSIG(status), hit)
    else:
        trailer(b"e", os.WEXITSTATUS(status), hit)


def _oom_first() -> None:
    """Make the command the OOM killer's first choice (``oom_score_adj`` 1000, inherited by
    all it starts): out of memory, the container loses the agent's processes, not the
    root helper that reports its status. (A hostile command can lower its score back to
    0: making it a floor needs ``CAP_SYS_RESOURCE``, which the container does not get.)"""
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("1000")
    except OSError:
        pass


def _become(uid: int) -> None:
    """Drop from root to the agent's uid (no groups; no capabilities are left)."""
    if os.getuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def _sweep_as(uid: int, token: str) -> None:
    """Kill the command's leftovers with the agent's uid: only a process of the same uid
    may read their environments (this one, root without CAP_SYS_PTRACE, may not)."""
    pid = os.fork()
    if pid == 0:
        try:
            _become(uid)
            _sweep(token, SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _sweep(token: str, sig: int) -> None:
    """Signal every process whose environment carries ``CORRAL_EXEC=<token>``."""
    mark = f"CORRAL_EXEC={token}".encode()
    me = os.getpid()
    for _ in range(3):  # a forking tree: sweep until nothing carrying the mark is left
        hit = 0
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == me:
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    if mark not in fh.read().split(b"\0"):
                        continue
                os.kill(int(pid), sig)
                hit += 1
            except OSError:
                continue
        if not hit or sig != SIGKILL:
            return


def kill() -> None:
    f = _fields()
    _sweep(f[0].decode(), int(f[1]))


if __name__ == "__main__":
    MODES = {"run": run, "kill": kill}
    MODES[sys.argv[1]]()
