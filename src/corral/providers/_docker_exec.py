"""Commands in a Docker container through the Engine API's exec endpoints.

Every command runs under the in-container helper (:mod:`corral._insandbox.container_exec`),
which gets the argv, environment and cwd on stdin (never in the exec's configuration, which
the daemon keeps and ``docker inspect`` shows) and reports how the command ended in a trailer
on stderr, keyed by a nonce the command never sees, so a death by signal is told apart from
``exit 143``. The attach stream is the daemon's multiplexed format (8-byte frame headers);
one reader thread per process demultiplexes it, since the SDK's calls block.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import json
import math
import secrets
import signal
import socket
import struct
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import anyio
import anyio.to_thread

from corral._errors import ConfigError
from corral._insandbox import container as fs_helper
from corral._insandbox import container_exec as exec_helper
from corral._insandbox import container_supervisor as supervisor
from corral.providers._process import drain, feed_stdin
from corral.sandbox._contracts import TIMEOUT_EXIT_CODE, ExecResult, Process, SandboxGoneError

__all__ = ["DockerProcess", "collect", "fields", "header", "helper_argv", "open_exec",
           "run_to_end", "start_exec", "start_helper"]

_SOURCES = {"fs": inspect.getsource(fs_helper), "serve": inspect.getsource(fs_helper), "run": inspect.getsource(exec_helper),
            "kill": inspect.getsource(exec_helper),
            **dict.fromkeys(("start", "read", "status", "stop"), inspect.getsource(supervisor))}
_MARK = b"\0corral-exit:"


def header(obj: Mapping[str, Any]) -> bytes:
    """The helper's stdin header for ``obj`` (its ``fs`` mode)."""
    body = json.dumps(obj).encode()
    return b"%08d" % len(body) + body


def fields(*items: str | bytes) -> bytes:
    """The helper's stdin header of NUL-separated fields (its ``run`` and ``kill`` modes)."""
    parts = [i.encode() if isinstance(i, str) else i for i in items]
    if any(b"\0" in p for p in parts):
        raise ConfigError("a command, its environment and its cwd cannot contain NUL bytes")
    body = b"\0".join(parts)
    return b"%08d" % len(body) + body


def helper_argv(mode: str) -> list[str]:
    """How the helper runs in the container (``-I -S``: no site, no user environment)."""
    return ["python3", "-I", "-S", "-c", _SOURCES[mode], mode]


def open_exec(api: Any, container: str, mode: str, *, user: str,
              head: bytes) -> tuple[str, socket.socket]:
    """Start the helper's ``mode`` in ``container`` as ``user`` and send it ``head``: the
    exec's id and its attached socket (blocking: call in a worker thread)."""
    exec_id = api.exec_create(container, helper_argv(mode), stdin=True,
                              stdout=True, stderr=True, tty=False, user=user)["Id"]
    raw = api.exec_start(exec_id, socket=True)
    sock: socket.socket = getattr(raw, "_sock", raw)
    try:
        sock.sendall(head)
    except BaseException:
        sock.close()
        raise
    return exec_id, sock


def run_to_end(sock: socket.socket) -> None:
    """Close the exec's stdin, read its output away until it ends, close the socket."""
    try:
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):
            pass
    finally:
        sock.close()


class _Demux:
    """Reads the attach stream's frames in a thread into per-stream buffers."""

    def __init__(self, sock: socket.socket, nonce: bytes) -> None:
        self.sock = sock
        self._prefix = _MARK + nonce + b":"
        self._cond = threading.Condition()
        self.chunks: dict[int, collections.deque[bytes]] = {
            1: collections.deque(), 2: collections.deque()}
        self._pending = b""  # stderr held back: it may be the start of the trailer
        self.status: tuple[str, int] | None = None
        self.limit: str | None = None
        self.eof = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="corral-docker-exec")
        self._thread.start()

    def _recv_exact(self, n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            try:
                got = self.sock.recv(n - len(buf))
            except OSError:
                return None
            if not got:
                return None
            buf += got
        return bytes(buf)

    def _run(self) -> None:
        try:
            while True:
                head = self._recv_exact(8)
                if head is None:
                    break
                kind, size = head[0], struct.unpack(">I", head[4:])[0]
                body = self._recv_exact(size) if size else b""
                if body is None:
                    break
                if kind == 2:
                    self._stderr(body)
                elif kind == 1 and body:
                    self._push(1, body)
        finally:
            with self._cond:
                if self._pending:
                    self.chunks[2].append(self._pending)
                    self._pending = b""
                self.eof = True
                self._cond.notify_all()

    def _push(self, stream: int, data: bytes) -> None:
        with self._cond:
            self.chunks[stream].append(data)
            self._cond.notify_all()

    def _stderr(self, data: bytes) -> None:
        buf = self._pending + data
        out = bytearray()
        while True:
            i = buf.find(self._prefix)
            if i < 0:
                # keep back a tail that could begin the trailer
                j = buf.rfind(b"\0", max(0, len(buf) - len(self._prefix)))
                if j >= 0 and self._prefix.startswith(buf[j:]):
                    out += buf[:j]
                    buf = buf[j:]
                else:
                    out += buf
                    buf = b""
                break
            end = buf.find(b"\0", i + len(self._prefix))
            if end < 0:
                out += buf[:i]
                buf = buf[i:]
                break
            code, _, limit = buf[i + len(self._prefix):end].decode("ascii", "replace") \
                .partition(":")
            with contextlib.suppress(ValueError, IndexError):
                self.status = (code[0], int(code[1:]))
                self.limit = limit or None
            out += buf[:i]
            buf = buf[end + 1:]
        self._pending = bytes(buf)
        if out:
            self._push(2, bytes(out))

    def wait_data(self, stream: int, timeout: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: bool(self.chunks[stream]) or self.eof, timeout)

    def wait_eof(self, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.eof, timeout)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()


class _Stream:
    def __init__(self, demux: _Demux, stream: int) -> None:
        self._demux = demux
        self._stream = stream

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> bytes:
        d = self._demux
        while True:
            if d.chunks[self._stream]:
                return d.chunks[self._stream].popleft()
            if d.eof:
                raise StopAsyncIteration
            await anyio.to_thread.run_sync(d.wait_data, self._stream, 1.0,
                                           abandon_on_cancel=True)


class DockerProcess(Process):
    """A command started with :func:`start_exec`."""

    def __init__(self, demux: _Demux, exec_id: str, inspect_exec: Callable[[str], Any],
                 killer: Callable[[int], Any], cwd: str = "", trailer: bool = True) -> None:
        self._cwd = cwd
        self._trailer = trailer
        self._demux = demux
        self._exec_id = exec_id
        self._inspect = inspect_exec
        self._killer = killer
        self._stdout = _Stream(demux, 1)
        self._stderr = _Stream(demux, 2)
        self._stdin_open = True
        self._lock = anyio.Lock()
        self.timed_out = False
        self._result: ExecResult | None = None

    @property
    def pid(self) -> int | None:
        return None

    @property
    def stdout(self) -> AsyncIterator[bytes]:
        return self._stdout

    @property
    def stderr(self) -> AsyncIterator[bytes]:
        return self._stderr

    async def write_stdin(self, data: bytes) -> None:
        if not self._stdin_open:
            raise anyio.ClosedResourceError
        async with self._lock:
            try:
                await anyio.to_thread.run_sync(self._demux.sock.sendall, data)
            except OSError as exc:
                raise anyio.BrokenResourceError from exc

    async def close_stdin(self) -> None:
        if not self._stdin_open:
            return
        self._stdin_open = False
        async with self._lock:
            with contextlib.suppress(OSError):
                self._demux.sock.shutdown(socket.SHUT_WR)

    async def wait(self) -> ExecResult:
        if self._result is not None:
            return self._result
        while not self._demux.eof:
            await anyio.to_thread.run_sync(self._demux.wait_eof, 1.0, abandon_on_cancel=True)
        status = self._demux.status
        if status is None:
            # No trailer: the helper itself died (a kill, the container destroyed).
            try:
                info = await anyio.to_thread.run_sync(self._inspect, self._exec_id)
                code = info.get("ExitCode")
            except SandboxGoneError:
                code = None
            if not isinstance(code, int):
                status = ("s", signal.SIGKILL)  # gone with its container
            elif code > 128 and self._trailer:
                status = ("s", code - 128)
            else:
                status = ("e", code)
        if status[0] == "c":
            raise ConfigError(f"working directory {self._cwd!r} does not exist in the sandbox")
        if status[0] == "s":
            res = ExecResult(128 + status[1], b"", b"", signal=status[1],
                             timed_out=self.timed_out, limit_hit=self._demux.limit)
        else:
            res = ExecResult(status[1], b"", b"", timed_out=self.timed_out,
                             limit_hit=self._demux.limit)
        self._result = res
        return res

    async def kill(self, sig: int = signal.SIGKILL) -> None:
        await anyio.to_thread.run_sync(self._killer, sig)

    async def aclose(self) -> None:
        self._demux.close()


def start_helper(api: Any, container: str, mode: str, obj: Mapping[str, Any], *, user: str,
                 inspect_exec: Callable[[str], Any]) -> DockerProcess:
    """Start the helper's ``mode`` with ``obj`` as its header (blocking: call in a worker
    thread); no trailer: the helper's own exit status is the outcome."""
    exec_id, sock = open_exec(api, container, mode, user=user, head=header(obj))
    return DockerProcess(_Demux(sock, b"-"), exec_id, inspect_exec, lambda sig: None,
                         trailer=False)


def start_exec(api: Any, container: str, *, uid: int, argv: Sequence[str], env: Mapping[str, str],
               cwd: str, killer: Callable[[str, int], None],
               inspect_exec: Callable[[str], Any], cwd_name: str = "") -> DockerProcess:
    """Start ``argv`` in ``container`` as ``uid`` (blocking: call in a worker thread). The
    helper runs as root, out of the command's reach; the command as ``uid``."""
    nonce = secrets.token_hex(16)
    token = secrets.token_hex(12)
    head = fields(nonce, token, str(uid), cwd, str(len(argv)), *argv,
                  *(f"{k}={v}" for k, v in env.items()))
    exec_id, sock = open_exec(api, container, "run", user="0:0", head=head)
    demux = _Demux(sock, nonce.encode())
    return DockerProcess(demux, exec_id, inspect_exec, lambda sig: killer(token, sig),
                         cwd=cwd_name or cwd)


async def collect(proc: DockerProcess, *, stdin: bytes | None,
                  timeout: float | None) -> ExecResult:
    """Feed stdin, drain both streams, wait; on timeout kill the whole tree."""
    out: list[bytes] = []
    err: list[bytes] = []
    try:
        with anyio.move_on_after(math.inf if timeout is None else timeout) as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(feed_stdin, proc, stdin)
                tg.start_soon(drain, proc.stdout, out)
                tg.start_soon(drain, proc.stderr, err)
        if scope.cancelled_caught:
            proc.timed_out = True
            with anyio.CancelScope(shield=True):
                await proc.kill(signal.SIGKILL)
                with anyio.move_on_after(10):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(drain, proc.stdout, out)
                        tg.start_soon(drain, proc.stderr, err)
        res = await proc.wait()
    except BaseException:
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(Exception):
                await proc.kill(signal.SIGKILL)
        raise
    finally:
        with anyio.CancelScope(shield=True):
            await proc.aclose()
    return ExecResult(
        exit_code=TIMEOUT_EXIT_CODE if res.timed_out else res.exit_code,
        stdout=b"".join(out), stderr=b"".join(err), signal=None if res.timed_out else res.signal,
        timed_out=res.timed_out, limit_hit=res.limit_hit,
    )
