"""A bubblewrap sandbox's agent: one long-lived process that runs its commands.

Without it every ``exec``/``spawn`` starts a launcher chain (the uid drop, ``bwrap``,
the init: ~7 ms) and moves it into the sandbox's cgroups (after an idle moment the kernel
makes that move wait for an RCU grace period). With it, a command is one request on a
connection that is already open, and one ``clone`` inside the sandbox.

What runs: corral's agent (a small static C program, :data:`AGENT_SOURCE`, built and
cached with the init by :mod:`corral.providers._bwrap_init`), started once per sandbox by
the same launcher chain as a command (so it is born in the sandbox's cgroups, under the
uid drop, the rlimits, the seccomp filter and every namespace of a command), as pid 1 of
the sandbox's pid namespace, with ``CAP_SYS_ADMIN`` in the sandbox's own user namespace
(``bwrap --cap-add``) and nothing else. It uses that capability for one thing: each
command gets a new pid namespace (``clone3(CLONE_NEWPID)``) whose init (a fork of the
agent that keeps no capability, no descriptor of the agent's and no file of the host) runs
the command exactly as the per-command init does (:mod:`corral.providers._bwrap_init`):
non-dumpable, reaping orphans, reporting the raw wait status on a pipe only the agent
holds; its death kills everything the command started. The agent makes that init ahead,
between requests (a warm spare: namespaces, ``/proc`` and its covers done, the command's
process forked and waiting on a pipe for its launch fields), so a request costs one exec;
requests larger than the spare's pipe, or arriving when it is gone, make one at once, and
a spare that dies unused is replaced. The agent itself is non-dumpable
and a namespace's init: the sandbox's processes can neither trace it, read its memory or
descriptors, nor signal it.

The channel: a unix socket on the host, ``<sandbox dir>/private/agent.sock``, in the
sandbox's private directory (mode 0700, corral's; never mounted into the sandbox). corral
binds and listens on it and hands the listening descriptor to the agent; the sandbox has
no path to it and, in its own network namespace, no abstract name either. Each connection
starts with a challenge (a fresh random nonce) that only a holder of the agent's key can
answer (HMAC-SHA256); the key is 64 random bytes made at each agent start, written to
``private/agent.key`` (0600) and given to the agent on its stdin, never in an argv or
environment. Every host process of corral connects the same way (a handle made by
``resume`` in another process included); one connection per handle and event loop.

Lifetime: started at create (and again by a command that finds none, under
``private/agent.lock``, so that two host processes start one agent), it lives with the
sandbox; ``destroy`` kills it with the rest of the cgroup. After 10 minutes with no
connection and no command it exits by itself (a sandbox nobody uses keeps no process). When it is gone (killed, the sandbox's OOM killer), the connection closes:
commands running over it report :class:`~corral.providers._agent_client.AgentLost` (they
died with it: the agent is their pid namespaces' ancestor), and the next command starts a
new agent. Where the agent cannot start at all (no compiled agent: the perl init; a kernel
that refuses the capability), commands take the launcher chain as before; ``corral
doctor`` says which path is in use and why.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import socket
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import anyio

from corral._errors import CorralError
from corral.providers._agent_client import AgentConnection, AgentLost
from corral.providers._agent_source import AGENT_SOURCE

__all__ = ["AGENT_SOURCE", "AgentUnavailable", "BwrapAgentLink", "Launch", "agent_argv", "connect_unix"]

_MAX_SUN_PATH = 100

Launch = Callable[[int, bytes, int], "subprocess.Popen[bytes]"]
"""``launch(listen_fd, stdin_data, log_fd)``: the handle starts its agent (see
:class:`BwrapAgentLink`)."""


class AgentUnavailable(CorralError):
    """The sandbox's agent could not be started (the reason says why)."""


def _sock_path(path: Path) -> tuple[str, int | None]:
    """A path ``bind``/``connect`` accept (108 bytes at most): the path itself, or
    ``/proc/self/fd/N/<name>`` through a descriptor of its directory (returned, to close)."""
    text = str(path)
    if len(text.encode()) < _MAX_SUN_PATH:
        return text, None
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    return f"/proc/self/fd/{fd}/{path.name}", fd


def connect_unix(path: Path) -> socket.socket:
    """A connected stream socket to the unix socket at ``path``, however long the path."""
    name, fd = _sock_path(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.connect(name)
    except BaseException:
        sock.close()
        raise
    finally:
        if fd is not None:
            os.close(fd)
    return sock


class BwrapAgentLink:
    """A handle's way to its sandbox's agent: connects, starts it when it is not there.

    ``launch(argv_tail, pass_fds, stdin_data, stderr_fd)`` is the handle's launcher: it
    starts the launcher chain and ``bwrap`` with the agent's options, moves it into the
    sandbox's cgroups before bwrap forks, and returns the process."""

    def __init__(self, private: Path, what: str) -> None:
        self._private = private
        self._what = what
        self._conn: AgentConnection | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._token: bytes | None = None  # of an agent started ahead, not yet connected to

    @property
    def socket_path(self) -> Path:
        return self._private / "agent.sock"

    def _key(self) -> bytes | None:
        try:
            fd = os.open(self._private / "agent.key", os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read()
        return bytes.fromhex(raw.decode().strip()) if raw else None

    async def connection(self, launch: Launch) -> AgentConnection:
        """The live connection of this event loop, made (and the agent started) if needed.
        Raises :class:`AgentUnavailable` when a fresh agent does not answer."""
        conn = self._conn
        if conn is not None and conn.usable():
            return conn
        if conn is not None and conn.dead is None:
            conn.close()  # another event loop's: its commands stay on it
        self._conn = None
        if self._token is not None:  # started ahead (prestart): its token is still good
            token, self._token = self._token, None
            with contextlib.suppress(OSError):
                self._conn = AgentConnection.with_token(
                    connect_unix(self.socket_path), token, what=f"{self._what}'s agent")
                return self._conn
        with contextlib.suppress(OSError, AgentLost, ValueError):
            self._conn = await self._open()
            return self._conn
        started = self._start(launch)
        try:
            if started is None:  # another process started it meanwhile
                self._conn = await self._open()
            else:
                # Ours: its one-time token goes with the first request, no round trip.
                self._proc, token = started
                self._conn = AgentConnection.with_token(
                    connect_unix(self.socket_path), token, what=f"{self._what}'s agent")
        except (OSError, AgentLost, ValueError) as exc:
            raise AgentUnavailable(
                f"{self._what}'s agent did not start ({self._log() or exc})") from None
        return self._conn

    async def failed_start(self) -> str | None:
        """Why the agent this link started never served anything, or None: its ``bwrap``
        exited 1 (bwrap could not make the sandbox) or 125 (the agent refused to start),
        both before the agent runs any command. (A killed agent makes bwrap exit with
        128 + its signal.) Called when the connection was lost: bwrap, if it is ending,
        is given 5 s to be reaped."""
        proc = self._proc
        if proc is None:
            return None
        with anyio.move_on_after(5):
            while proc.poll() is None:
                await anyio.sleep(0.005)
        if proc.returncode not in (1, 125):
            return None
        return f"{self._what}'s agent did not start ({self._log() or 'no message'})"

    def prestart(self, launch: Launch) -> None:
        """Start the agent now (at create), without waiting for it: it comes up while the
        caller does other work (``ensure`` writes its records), and the first command finds
        it ready. Best effort: a failure here is met again, and reported, by that command."""
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            started = self._start(launch)
            if started is not None:
                self._proc, self._token = started

    async def _open(self) -> AgentConnection:
        key = self._key()
        if key is None:
            raise FileNotFoundError("no agent key")
        sock = connect_unix(self.socket_path)
        return await AgentConnection.open(sock, key, what=f"{self._what}'s agent")

    def _log(self) -> str:
        with contextlib.suppress(OSError):
            text = (self._private / "agent.log").read_bytes()[-2000:].decode(errors="replace")
            return " ".join(text.split())
        return ""

    def _start(self, launch: Launch) -> tuple[subprocess.Popen[bytes], bytes] | None:
        """Start the agent unless another process did meanwhile (under the lock)."""
        if self._proc is not None:
            self._proc.poll()  # reap an earlier agent's bwrap
        lock = os.open(self._private / "agent.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            with contextlib.suppress(OSError):
                connect_unix(self.socket_path).close()
                return None  # someone else's agent listens now
            key, token = secrets.token_bytes(64), secrets.token_bytes(32)
            tmp = self._private / f".agent.key.{os.getpid()}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW,
                         0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(key.hex())
            os.rename(tmp, self._private / "agent.key")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            log = os.open(self._private / "agent.log",
                          os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                name, dfd = _sock_path(self.socket_path)
                old = os.umask(0o177)  # the socket is 0600 before it exists
                try:
                    listener.bind(name)
                finally:
                    os.umask(old)
                    if dfd is not None:
                        os.close(dfd)
                listener.listen(128)
                stdin = key.hex().encode() + b"\n" + token.hex().encode() + b"\n"
                return launch(listener.fileno(), stdin, log), token
            finally:
                listener.close()  # the agent holds it now (or nobody: connect is refused)
                os.close(log)
        finally:
            os.close(lock)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def agent_argv(listen_fd: int, filter_hex: str) -> Sequence[str]:
    """The agent's argv inside the sandbox: the listening descriptor and the seccomp filter
    (hex, or ``-``); its key comes on stdin."""
    from corral.providers._bwrap_init import AGENT_INSIDE_PATH

    return [AGENT_INSIDE_PATH, str(listen_fd), filter_hex]
