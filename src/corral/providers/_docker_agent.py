"""A docker sandbox's agent: one long-lived process per handle that runs its commands.

Without it every ``exec``/``spawn``/file operation is a ``docker exec`` of a Python helper
(an exec create, a start, a hijacked stream, an inspect, Python's start-up: tens of
milliseconds). With it, a command is one request on a stream that is already open, and two
``fork``\\s inside the container.

What runs: corral's agent, the same C program and wire protocol as bubblewrap's
(:mod:`corral.providers._agent_client`, :data:`AGENT_SOURCE`), in its docker mode
(``agent stdio <uid>``). A handle opens ONE ``docker exec`` stream (the Engine API's
hijacked connection, ``exec_create`` + ``exec_start(socket=True)``) running as the
container's root; the stream first carries a small stdlib loader, which reads the agent's
binary (built and cached on the host by :mod:`corral.providers._bwrap_init`) into a
``memfd`` and executes it: nothing is written to the container's filesystem. The agent's
stdin and stdout ARE the channel: no socket, no path or name inside the container leads to
it. The processes of the agent's uid (1000, no capabilities) cannot open the pipes of a
root process that is not dumpable, signal it, trace it or read its memory; only a holder of
the Docker API reaches the stream. The hello is bubblewrap's: the key (64 random bytes, fresh
per agent) travels on the stream, never in an argv or environment, and the agent answers
nothing before the host proves it holds it.

Each command (docker mode, no pid namespace: the container grants no ``CAP_SYS_ADMIN``) gets
its own init, a root fork of the agent that is a child subreaper: every process the command
starts stays its descendant whatever it does (``setsid``, double forks), so when the command
ends, times out or is killed the init kills them all (found by parent pid in ``/proc``) and
only then reports the raw wait status on a pipe only the agent holds. The command itself runs
as the agent's uid with no groups and no capabilities, in its own session, first in line
for the OOM killer. The report also says whether the container's memory or pids counters
moved meanwhile (the limit hit) and whether the working directory was missing.

Lifetime: the first command of a handle (per event loop) starts its agent; it lives as long
as its stream. When the host closes the stream (the handle dropped, the host process gone)
the agent stays until its commands end, then exits; if the agent dies (killed, OOM), every
command's init sees its control pipe close and kills its command's tree, the stream ends,
running commands fail with :class:`~corral.providers._agent_client.AgentLost`, and the next
command starts a new agent. Where the agent cannot start (no compiled agent, a daemon of
another architecture or reached over TLS or ssh, an image without ``python3``'s
``os.memfd_create``), commands take ``docker exec`` as before; ``corral doctor`` says which.
"""

from __future__ import annotations

import platform
import secrets
import socket
import ssl
import struct
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import anyio
import anyio.to_thread

from corral._errors import ConfigError, CorralError
from corral.providers._agent_client import AgentConnection, AgentLost
from corral.providers._process import Outcome

__all__ = ["LOADER", "AgentUnavailable", "DockerAgentLink", "DockerStreamConnection",
           "agent_problem", "docker_outcome", "hello", "launch_fields", "loader_argv"]

LOADER = r"""
import os, sys
def rd(n):
    b = b""
    while len(b) < n:
        c = os.read(0, n - len(b))
        if not c:
            sys.exit(125)
        b += c
    return b
n = int(rd(12))
fd = os.memfd_create("corral-agent", os.MFD_CLOEXEC)
v = memoryview(rd(n))
while v:
    v = v[os.write(fd, v):]
os.execve(fd, ["corral-agent", "stdio", sys.argv[1]],
          {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"})
"""
"""Run in the container as root (``python3 -I -S -c``): reads the agent's binary from the
stream into a memfd and becomes it (stdin and stdout stay the stream)."""

MEMORY_HIT = 1 << 16
PIDS_HIT = 1 << 17
NO_CWD = 1 << 18
_LOG_KEEP = 4000


def launch_fields(cwd: str, env: Mapping[str, str], argv: Sequence[str]) -> bytes:
    """A command's start request (NUL-terminated: cwd, the number of variables,
    ``NAME=VALUE`` each, then argv; the environment, secrets included, travels only here)."""
    if not argv:
        raise ConfigError("empty command")
    items = [cwd, str(len(env)), *(f"{k}={v}" for k, v in env.items()), *argv]
    if any("\0" in i for i in items):
        raise ConfigError("a command, its environment and its cwd cannot contain NUL bytes")
    return b"".join(i.encode() + b"\0" for i in items)


class AgentUnavailable(CorralError):
    """The sandbox's agent could not be started (the reason says why)."""


def loader_argv(uid: int) -> list[str]:
    """The agent's exec: the loader, and the uid its commands run as (no secret)."""
    return ["python3", "-I", "-S", "-c", LOADER, str(uid)]


def docker_outcome(status: int | None, cwd: str) -> Outcome:
    """The outcome of a command from its init's report (see the module docstring)."""
    if status is None:  # could not start: the agent said why on the command's stderr
        return Outcome(exit_code=126)
    if status & NO_CWD:
        raise ConfigError(f"working directory {cwd!r} does not exist in the sandbox")
    limit = "memory" if status & MEMORY_HIT else "pids" if status & PIDS_HIT else None
    wait = status & 0xFFFF
    if wait & 0x7F:
        sig = wait & 0x7F
        return Outcome(exit_code=128 + sig, signal=sig, limit_hit=limit)
    return Outcome(exit_code=(wait >> 8) & 0xFF, limit_hit=limit)


def hello(binary: bytes, key: bytes) -> bytes:
    """What the loader reads on the stream first: the agent's binary (its length, then its
    bytes), then the key. No one-time token (bubblewrap's first connection skips the nonce's
    round trip with one): this stream is the agent's only connection, and in this mode it
    reads no token and accepts none; the HMAC hello is the only way in."""
    return b"%012d" % len(binary) + binary + key.hex().encode() + b"\n"


class DockerStreamConnection(AgentConnection):
    """An agent connection over a docker exec's hijacked stream: what the host sends is the
    agent's stdin as is; what comes back is the daemon's multiplexed format (8-byte frame
    headers: stream 1 is the agent's stdout, the channel; stream 2 its stderr, kept as
    its log)."""

    _logs: ClassVar[dict[int, bytearray]] = {}

    def __init__(self, sock: socket.socket, *, what: str) -> None:
        super().__init__(sock, what=what)
        self._raw = bytearray()
        self.log = self._logs.pop(id(sock), bytearray())

    def _recv(self) -> bytes:
        data = self._sock.recv(1 << 18)
        if not data:
            return b""
        raw = self._raw
        raw += data
        out = bytearray()
        off, size = 0, len(raw)
        while size - off >= 8:
            kind = raw[off]
            length = struct.unpack_from(">I", raw, off + 4)[0]
            if size - off - 8 < length:
                break
            if kind == 1:
                out += raw[off + 8:off + 8 + length]
            else:
                self.log += raw[off + 8:off + 8 + length]
                del self.log[:-_LOG_KEEP]
            off += 8 + length
        del raw[:off]
        if not out:
            raise BlockingIOError  # only frame headers or the log so far
        return bytes(out)


_binary: dict[Path, bytes] = {}


def _agent_binary(path: Path) -> bytes:
    data = _binary.get(path)
    if data is None:
        data = _binary[path] = path.read_bytes()
    return data


class DockerAgentLink:
    """A handle's way to its agent: opens the exec stream (starting the agent) when there
    is no live one on this event loop."""

    def __init__(self, api: Callable[[], Any], container: str, uid: int, what: str,
                 binary: Path) -> None:
        self._api = api
        self._container = container
        self._uid = uid
        self._what = what
        self._binary = binary
        self._conn: DockerStreamConnection | None = None
        self._raw: Any = None
        self.exec_id: str | None = None

    def live(self) -> DockerStreamConnection | None:
        """The connection of this event loop, if it is alive."""
        conn = self._conn
        return conn if conn is not None and conn.usable() else None

    async def connection(self) -> DockerStreamConnection:
        """The live connection of this event loop, made (and its agent started) if needed.
        Raises :class:`AgentUnavailable` when the agent does not answer."""
        conn = self._conn
        if conn is not None and conn.usable():
            return conn
        if conn is not None and conn.dead is None:
            conn.close()  # another event loop's: its agent ends once its commands have
        self._conn = None
        self._conn = await self._open()
        return self._conn

    async def _open(self) -> DockerStreamConnection:
        key = secrets.token_bytes(64)
        binary = _agent_binary(self._binary)

        def start() -> tuple[str, Any, socket.socket]:
            api = self._api()
            exec_id = api.exec_create(self._container, loader_argv(self._uid), stdin=True,
                                      stdout=True, stderr=True, tty=False, user="0:0")["Id"]
            raw = api.exec_start(exec_id, socket=True)
            sock = getattr(raw, "_sock", raw)
            if not isinstance(sock, socket.socket) or isinstance(sock, ssl.SSLSocket):
                with _quiet():
                    raw.close()
                raise AgentUnavailable("the daemon's exec stream is not a plain socket "
                                       "(TLS or ssh)")
            try:
                sock.sendall(hello(binary, key))
            except OSError:
                sock.close()
                raise
            return exec_id, raw, sock

        exec_id, raw, sock = await anyio.to_thread.run_sync(start)
        log = DockerStreamConnection._logs[id(sock)] = bytearray()
        try:
            opened = await DockerStreamConnection.open(sock, key,
                                                       what=f"{self._what}'s agent", timeout=30)
            assert isinstance(opened, DockerStreamConnection)
            conn = opened
        except AgentLost as exc:
            DockerStreamConnection._logs.pop(id(sock), None)
            text = " ".join(bytes(log).decode(errors="replace").split())[-300:]
            raise AgentUnavailable(f"{self._what}'s agent did not start "
                                   f"({text or exc})") from None
        self._raw, self.exec_id = raw, exec_id
        return conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def agent_problem(binary: Path | None, daemon_arch: str | None) -> str | None:
    """Why the agent cannot run in this daemon's containers, or None."""
    if binary is None:
        return "no compiled agent"
    if daemon_arch is not None and daemon_arch != platform.machine():
        return (f"the daemon runs {daemon_arch} containers, the agent was built for "
                f"{platform.machine()}")
    return None


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, tp: type[BaseException] | None, *_: object) -> bool:
        return tp is not None and issubclass(tp, Exception)
