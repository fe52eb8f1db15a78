"""A docker handle's file server: its file operations without a Python start-up each.

Each file operation used to be a command of its own (the in-container helper,
:mod:`corral._insandbox.container`, in its ``fs`` mode): a Python start-up per read, write or
stat. Here the same helper runs in its ``serve`` mode, started through the sandbox's agent
as the agent's uid, and answers one operation after another over its stdin and stdout (the
agent's channel: no socket, no name in the container leads to it). Its first act is to make
itself non-dumpable, so the agent's other processes (same uid) cannot open its pipes to
forge answers, read its memory or attach to it; they can still kill it. Its wire is in the
helper's docstring.

What it answers is read as hostile all the same: every frame is checked (kind, length
bounds); a read's bytes must add up to the size it reports; an error's JSON is parsed field
by field by the provider. A server that ends, or says anything out of turn, is dropped
(killed) and the operation fails with an ``OSError`` (``EIO``) saying so, never with a
partial answer taken as whole; the next operation starts a new server. An operation that
found its idle server dead before it got any answer is retried once on a new one.
Concurrent operations each take a server of their own (a few are kept idle). Where the
server cannot start (no agent, or an image whose Python cannot make itself non-dumpable)
the provider keeps the per-operation helper.
"""

from __future__ import annotations

import errno
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import anyio
import anyio.to_thread

from corral._log import library_logger
from corral.providers._agent_client import AgentLost, AgentProcess
from corral.sandbox._contracts import SandboxGoneError

__all__ = ["Answer", "FsServers"]

_log = library_logger("corral.providers._docker_fs_server")

_MAX_DATA = 1 << 20
"""The largest ``d`` frame (the helper reads and sends at most 1 MiB at a time)."""
_MAX_ANSWER = 64 << 20
"""The largest ``o``/``e`` frame (a directory's listing)."""
_CHUNK = 1 << 20
_NO_WAIT = 256 << 10
"""Sent without waiting for the agent's acknowledgement (one round trip less); the rest of
a request is sent chunk by chunk as it is written, so the agent never holds more."""
_AGENT_HOLDS = 1 << 20
"""A request's bytes are sent a chunk this large at a time, each once the agent has written
the one before into the server's stdin (a round trip per chunk; the agent holds one)."""
_KEEP_IDLE = 2
_START_TIMEOUT = 30.0


class _Lost(Exception):
    """The server ended, or broke the protocol, before its answer was whole."""

    def __init__(self, why: str, answered: bool) -> None:
        super().__init__(why)
        self.answered = answered


class Answer:
    """One operation's answer: ``ok`` with its JSON ``payload`` (a read's bytes in ``data``),
    or not ok with the error's JSON in ``payload``."""

    __slots__ = ("data", "ok", "payload")

    def __init__(self, ok: bool, payload: bytes, data: bytes = b"") -> None:
        self.ok = ok
        self.payload = payload
        self.data = data


def _request(head: Mapping[str, Any]) -> bytes:
    body = json.dumps(head).encode()
    return b"%08d" % len(body) + body


def _framed(data: bytes) -> bytes:
    """A write's bytes as the server reads them: chunks, then a zero length."""
    out = bytearray()
    for i in range(0, len(data), _CHUNK):
        piece = data[i:i + _CHUNK]
        out += b"%08d" % len(piece) + piece
    return bytes(out + b"00000000")


def _size_of(payload: bytes) -> int | None:
    try:
        doc = json.loads(payload)
    except ValueError:
        return None
    size = doc.get("size") if isinstance(doc, dict) and set(doc) == {"size"} else None
    return size if isinstance(size, int) and not isinstance(size, bool) else None


class _Server:
    """One server process and what it has sent that is not parsed yet."""

    def __init__(self, proc: AgentProcess) -> None:
        self.proc = proc
        self._out = proc.stdout.__aiter__()
        self._buf = bytearray()
        self.answered = False  # any byte of the current operation's answer came

    async def _more(self) -> None:
        try:
            chunk = await self._out.__anext__()
        except StopAsyncIteration:
            raise _Lost("it ended", self.answered) from None
        except AgentLost as exc:
            raise _Lost(str(exc), self.answered) from None
        self.answered = True
        self._buf += chunk

    async def frame(self) -> tuple[bytes, bytes]:
        """The next frame, checked: its kind and a length within bounds."""
        buf = self._buf
        while len(buf) < 5:
            await self._more()
        kind = bytes(buf[:1])
        size = int.from_bytes(buf[1:5], "big")
        if kind not in (b"r", b"d", b"o", b"e") or size > (_MAX_DATA if kind == b"d"
                                                           else _MAX_ANSWER):
            raise _Lost("it sent a malformed frame", True)
        while len(buf) < 5 + size:
            await self._more()
        payload = bytes(buf[5:5 + size])
        del buf[:5 + size]
        return kind, payload

    async def send(self, data: bytes) -> None:
        """A request: its first bytes without a round trip, the rest as the agent writes it
        (bounded)."""
        try:
            await self.proc.send_stdin(data[:_NO_WAIT])
            if len(data) > _NO_WAIT:
                await self.proc.write_stdin(data[_NO_WAIT:], chunk_size=_AGENT_HOLDS)
        except BrokenPipeError as exc:
            raise _Lost(f"its stdin closed ({exc})", self.answered) from None

    async def send_chunk(self, data: bytes) -> None:
        try:
            await self.proc.write_stdin(data, chunk_size=_AGENT_HOLDS)
        except BrokenPipeError as exc:
            raise _Lost(f"its stdin closed ({exc})", self.answered) from None

    def reusable(self) -> bool:
        return not self._buf and self.proc.running()

    async def stop(self) -> None:
        """Kill it and stop listening (its state is unknown), if its connection is this
        event loop's; a connection gone or of another loop takes its commands with it."""
        with anyio.CancelScope(shield=True):
            if self.proc.reachable():
                await self.proc.kill()
                await self.proc.aclose()


class FsServers:
    """A sandbox's file servers: ``start()`` starts one (through the agent; None when there is
    no agent), ``gone()`` (blocking) says whether the sandbox was destroyed, ``fs_error``
    makes the error a server reported (its JSON, hostile) into an ``OSError``."""

    def __init__(self, start: Callable[[], Awaitable[AgentProcess | None]],
                 gone: Callable[[], bool], fs_error: Callable[[str, bytes], OSError],
                 what: str) -> None:
        self._start = start
        self._fs_error = fs_error
        self._gone = gone
        self._what = what
        self._idle: list[_Server] = []
        self.problem: str | None = None
        """Why the server cannot run in this sandbox (the per-operation helper is used)."""

    async def _acquire(self) -> tuple[_Server, bool] | None:
        while self._idle:
            server = self._idle.pop()
            if server.reusable():
                server.answered = False
                return server, True
            await server.stop()
        if self.problem is not None:
            return None
        proc = await self._start()
        if proc is None:
            return None
        server = _Server(proc)
        try:
            with anyio.fail_after(_START_TIMEOUT):
                kind, _ = await server.frame()
            if kind != b"r":
                raise _Lost("it did not say it was ready", True)
        except (_Lost, TimeoutError) as exc:
            err = b""
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                err = b"".join([c async for c in proc.stderr])[-300:]
            killed: int | None = -1  # its agent went away: so did it
            if server.proc.reachable():
                killed = None
                with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                    try:
                        killed = (await server.proc.wait()).signal
                    except AgentLost:
                        killed = -1
            await server.stop()
            if await anyio.to_thread.run_sync(self._gone):
                raise SandboxGoneError(f"{self._what} no longer exists or is not "
                                       "running") from None
            if killed is not None:
                # killed (by the agent's uid, say) or lost with its agent: not a reason to
                # give up on servers; this operation fails, the next one starts a new one
                raise OSError(errno.EIO, f"the sandbox's file server was killed as it "
                                         f"started ({exc or 'timed out'})") from None
            self.problem = (f"the file server did not start ({exc or 'timed out'}"
                            f"{': ' + err.decode(errors='replace').strip() if err else ''})")
            _log.warning("docker: %s: file operations take a helper each: %s", self._what,
                         self.problem)
            return None
        return server, False

    async def _lost(self, exc: _Lost, op: str, path: str) -> BaseException:
        if await anyio.to_thread.run_sync(self._gone):
            return SandboxGoneError(f"{self._what} was destroyed during a file operation")
        return OSError(errno.EIO, f"the sandbox's file server ended before it answered {op} "
                                  f"({exc}); the next operation starts a new one", path)

    async def _answer(self, server: _Server, op: str,
                      sink: Callable[[bytes], Awaitable[None]] | None) -> Answer:
        """Frames up to the answer's end; a read's bytes go to ``sink`` (else gathered)."""
        data: list[bytes] = []
        got = 0
        while True:
            kind, payload = await server.frame()
            if kind == b"d" and op == "read":
                got += len(payload)
                if sink is None:
                    data.append(payload)
                else:
                    await sink(payload)
            elif kind == b"e":
                return Answer(False, payload)
            elif kind == b"o":
                if op == "read" and _size_of(payload) != got:
                    raise _Lost("its read's bytes do not add up to the size it gave", True)
                return Answer(True, payload, b"".join(data))
            else:
                raise _Lost(f"it sent {kind!r} out of turn", True)

    async def call(self, head: Mapping[str, Any], path: str,
                   data: bytes | None = None) -> Answer | None:
        """One operation (``path``: as the caller named it, ``data``: a write's bytes); None
        when there is no server."""
        op = str(head["op"])
        request = _request(head) + (_framed(data or b"") if op == "write" else b"")
        for attempt in (0, 1):
            got = await self._acquire()
            if got is None:
                return None
            server, reused = got
            try:
                await server.send(request)
                answer = await self._answer(server, op, None)
            except _Lost as exc:
                await server.stop()
                if reused and not exc.answered and attempt == 0:
                    continue  # found dead before it said anything: a new one
                raise await self._lost(exc, op, path) from None
            except BaseException:
                await server.stop()
                raise
            await self._put_back(server)
            return answer
        raise AssertionError("unreachable")

    async def read_stream(self, head: Mapping[str, Any],
                          path: str) -> AsyncGenerator[bytes, None] | None:
        """A read whose bytes are yielded as they come (at most 1 MiB at a time), or None
        when there is no server. The iterator raises on any error, never ends early."""
        got = await self._acquire()
        if got is None:
            return None
        return self._read_stream(head, path, *got)

    async def _read_stream(self, head: Mapping[str, Any], path: str, server: _Server,
                           reused: bool) -> AsyncGenerator[bytes, None]:
        got = 0
        held: _Server | None = server
        try:
            while True:
                try:
                    await server.send(_request(head))
                    while True:
                        kind, payload = await server.frame()
                        if kind == b"d":
                            got += len(payload)
                            yield payload
                        elif kind == b"o":
                            if _size_of(payload) != got:
                                raise _Lost("its read's bytes do not add up to the size it "
                                            "gave", True)
                            break
                        elif kind == b"e":
                            held = None
                            await self._put_back(server)
                            raise self._fs_error(path, payload)
                        else:
                            raise _Lost(f"it sent {kind!r} out of turn", True)
                    break
                except _Lost as exc:
                    held = None
                    await server.stop()
                    if reused and not exc.answered:
                        # found dead before it said anything: a new one
                        acquired = await self._acquire()
                        if acquired is None:
                            raise await self._lost(exc, "read", path) from None
                        held = server = acquired[0]
                        reused = False
                        continue
                    raise await self._lost(exc, "read", path) from None
            held = None
            await self._put_back(server)
        finally:
            if held is not None:
                await held.stop()

    async def write_stream(self, head: Mapping[str, Any], path: str,
                           chunks: AsyncIterator[bytes]) -> tuple[Answer, int] | None:
        """A write whose bytes come from ``chunks`` (each sent once the agent has written
        the one before: bounded), or None when there is no server."""
        got = await self._acquire()
        if got is None:
            return None
        server, _reused = got
        total = 0
        try:
            await server.send(_request(head))
            async for chunk in chunks:
                for i in range(0, len(chunk), _CHUNK):
                    piece = chunk[i:i + _CHUNK]
                    await server.send_chunk(b"%08d" % len(piece) + piece)
                total += len(chunk)
            await server.send_chunk(b"00000000")
            answer = await self._answer(server, "write", None)
        except _Lost as exc:
            await server.stop()
            raise await self._lost(exc, "write", path) from None
        except BaseException:
            await server.stop()
            raise
        await self._put_back(server)
        return answer, total

    async def _put_back(self, server: _Server) -> None:
        if len(self._idle) < _KEEP_IDLE and server.reusable():
            self._idle.append(server)
        else:
            await server.stop()

    async def aclose(self) -> None:
        """Stop the idle servers (each ends at the end of its stdin)."""
        idle, self._idle = self._idle, []
        for server in idle:
            await server.stop()
