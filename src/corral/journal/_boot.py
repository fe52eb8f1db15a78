"""The journal supervisor's first moments: ``python -I -S <this file> --job-fd N --ready-fd M``.

Stdlib only, and run by path in isolated mode: it reads the job (the nonce included) from
its pipe, forks once more (the double fork of :mod:`corral.journal._supervisor`), starts the
agent and feeds its stdin, and only then imports :mod:`corral.journal._supervise` — from
the corral tree this file belongs to, never from ``PYTHONPATH`` or a site directory — for
everything else (journal files, status, readiness report, pumps, the wait, the trailer).

Why a file of its own: importing the supervisor module (dataclasses, pathlib, hashlib and
corral's journal modules) took a fresh interpreter ~60-80 ms, and every run's agent waited
for it before it could start. Here the agent starts after ~15 ms of imports; the rest
overlaps its start-up. Its output waits in the pipes until the pumps run; nothing is lost.
"""

from __future__ import annotations

import binascii
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs a fresh interpreter ~5 ms before the agent starts
    from typing import Any

_PR_SET_DUMPABLE = 4


def set_non_dumpable() -> None:
    """Other non-root processes of this uid cannot read this one's memory (the nonce)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # best effort: the real barrier is that the agent cannot see this process


def read_all(fd: int) -> bytes:
    """Everything until EOF on ``fd``."""
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _feed(pipe: Any, data: bytes) -> None:
    try:
        pipe.write(data)
    except OSError:
        pass
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def start_agent(job: dict[str, Any]) -> dict[str, Any]:
    """Start the job's agent in its own session, stdout/stderr piped to this process, its
    stdin fed ``stdin_prefix`` + ``stdin`` (or ``/dev/null``); SIGTERM/SIGINT to this
    process are forwarded to the agent's process group from now on (one that arrives
    before the agent exists is forwarded once it does).

    Returns ``{"agent": Popen | None, "error": str | None, "code": int | None}`` (``error``
    and ``code``: why and with which exit status the agent could not start)."""
    stdin_data = binascii.a2b_base64(job["stdin"]) if job.get("stdin") is not None else None
    prefix = binascii.a2b_base64(job.get("stdin_prefix") or "")
    holder: list[subprocess.Popen[bytes]] = []
    pending: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if not holder:
            pending.append(signum)
            return
        try:
            os.killpg(holder[0].pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        agent = subprocess.Popen(
            job["argv"],
            env=job["env"],
            cwd=job.get("cwd"),
            stdin=subprocess.PIPE if stdin_data is not None or prefix else subprocess.DEVNULL,
            # Always through this process, never the files themselves: an agent holding the
            # journal's open file description could clear O_APPEND, seek or truncate it.
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            close_fds=True,
            start_new_session=True,
        )
    except OSError as exc:
        what = f"{exc.strerror}: {exc.filename!r}" if exc.filename else str(exc.strerror or exc)
        return {"agent": None, "error": f"cannot start agent {job['argv'][0]!r}: {what}",
                "code": 127 if isinstance(exc, FileNotFoundError) else 126}
    holder.append(agent)
    for signum in pending:
        forward(signum, None)
    if agent.stdin is not None:
        threading.Thread(target=_feed, args=(agent.stdin, prefix + (stdin_data or b"")),
                         daemon=True).start()
    return {"agent": agent, "error": None, "code": None}


def main(argv: list[str]) -> int:
    """Read the job, fork, start the agent, then hand over to the supervisor module."""
    try:
        job_fd = int(argv[argv.index("--job-fd") + 1])
        ready_fd = int(argv[argv.index("--ready-fd") + 1])
    except (ValueError, IndexError):
        sys.stderr.write("usage: python -I -S _boot.py --job-fd N --ready-fd M\n")
        return 2
    set_non_dumpable()
    job = json.loads(read_all(job_fd))
    os.close(job_fd)
    if os.fork() > 0:
        os._exit(0)  # the intermediate: the launcher reaps it; the supervisor is orphaned
    started: dict[str, Any] = {"agent": None}
    try:
        started = start_agent(job)
        # corral's own tree (…/corral/journal/_boot.py → …), ahead of anything else
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))))
        from corral.journal._supervise import supervise

        return supervise(job, ready_fd, started)
    except BaseException as exc:  # noqa: BLE001 - last words go to the supervisor log
        agent = started.get("agent")
        if agent is not None:  # no supervisor, no journal: the agent must not run on
            try:
                os.killpg(agent.pid, signal.SIGKILL)
            except OSError:
                pass
        sys.stderr.write(f"corral supervisor failed: {exc!r}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
