"""The host side of corral's in-sandbox agent: one multiplexed connection per handle.

A provider that runs corral's agent inside its sandboxes (bubblewrap: see
:mod:`corral.providers._bwrap_agent`) connects a stream socket to it and hands it here;
every ``process.exec``/``spawn`` of the handle is then one request on that connection,
not a new launcher chain. This module knows nothing of how the connection was made (a
unix socket on bubblewrap; an attach stream on docker), only the wire:

Every frame is ``<u32 length><u32 id><u8 type><payload>`` (little-endian; ``length``
counts id, type and payload). ``id`` names one command on this connection (0: the
connection itself).

* agent → host, first: ``n`` (id 0) a 32-byte random nonce, fresh per connection.
* host → agent: ``H`` (id 0) ``HMAC-SHA256(key, nonce || "corral-agent-hello-1")``,
  where ``key`` is the agent's own 64-byte key (given to it at start, kept on the host in
  a file only corral can read). A wrong or missing answer closes the connection before
  anything else is read: a replayed hello answers another nonce.
* agent → host: ``h`` (id 0) ready.
* Instead of ``H``: ``T`` (id 0) the 32-byte one-time token the agent was started with,
  good for one connection: the process that started the agent sends it with its first
  request, without waiting for the nonce (a token used once is gone: a replay fails).
* ``S`` start: the launch blob (NUL-terminated fields: cwd, the number of variables,
  ``NAME=VALUE`` each, then argv); answered by ``p`` (started, u32 pid in the agent's
  namespace) or ``e`` (could not start, a message).
* ``R`` run: as ``S``, for a command whose output is read only at its end (``exec``): no
  ``p``, and its chunks, EOFs and stdin acknowledgements are held (at most 64 KiB) until
  its status is in, then sent with ``x`` in one write (one wake-up of the host for a short
  command).
* ``1``/``2`` stdout/stderr chunks, an empty one at EOF. The agent sends at most
  :data:`WINDOW` unacknowledged bytes per stream; the host acknowledges with ``A``
  (u8 stream 0/1, u32 bytes) as its reader consumes them, so a process nobody reads
  blocks on its pipe as it would under a plain pipe, and nothing buffers without bound.
* ``I`` stdin bytes, answered by ``i`` (u8 0 written, 1 the command closed its stdin)
  once written; ``C`` closes stdin.
* ``K`` (u8 signal): SIGKILL kills the command's pid-namespace init, and with it
  everything the command started; any other signal goes to every process of the
  command but its init.
* ``x`` exit: i32 raw wait status of the command, u8 1 when its init reported it, 0 when
  the init was killed before (then the status is SIGKILL's).
* ``D`` detach: the host stops listening (the command keeps running; its output pipes
  close, as when the host process that started a command exits).

The status comes from the command's init (which the command cannot signal, trace or
write to) through the agent, over this connection, which nothing inside the sandbox can
reach: nothing the command does decides what ``wait`` reports.
"""

from __future__ import annotations

import hashlib
import hmac
import signal
import socket
import struct
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import anyio.lowlevel

from corral._errors import CorralError
from corral.providers._process import Outcome
from corral.sandbox._contracts import TIMEOUT_EXIT_CODE, ExecResult

__all__ = ["HELLO", "WINDOW", "AgentConnection", "AgentLost", "AgentProcess", "StatusFinisher",
           "hello_answer"]

HELLO = b"corral-agent-hello-1"
WINDOW = 4 << 20
"""How many unacknowledged bytes per stream the agent sends (its C source says the same)."""
_ACK_EVERY = 512 << 10
_STDIN_CHUNK = 256 << 10
_HEAD = struct.Struct("<IIB")

StatusFinisher = Callable[[int | None, bool], Outcome]
"""Maps ``(raw wait status, reported by the command's init)`` to an outcome; a status of
None means the command could not start (the agent said why on its stderr)."""


class AgentLost(CorralError):
    """The sandbox's agent went away (killed, crashed, the sandbox destroyed) while a
    command was running; the command went with it."""


def hello_answer(key: bytes, nonce: bytes) -> bytes:
    """What the host sends back for ``nonce`` to prove it holds the agent's key."""
    return hmac.new(key, nonce + HELLO, hashlib.sha256).digest()


def frame(ident: int, kind: bytes, payload: bytes = b"") -> bytes:
    """One wire frame."""
    return _HEAD.pack(len(payload) + 5, ident, kind[0]) + payload


class _Cmd:
    __slots__ = ("consumed", "eof", "error", "out", "pid", "reported", "started", "status",
                 "stdin_acks", "stdin_broken")

    def __init__(self) -> None:
        self.out: tuple[deque[bytes], deque[bytes]] = (deque(), deque())
        self.consumed = [0, 0]
        self.eof = [False, False]
        self.started = False
        self.pid: int | None = None
        self.error: str | None = None
        self.status: int | None = None
        self.reported = False
        self.stdin_acks = 0
        self.stdin_broken = False


class AgentConnection:
    """One authenticated connection to a sandbox's agent, bound to the event loop that
    opened it (:attr:`loop`). Many commands run over it at once."""

    def __init__(self, sock: socket.socket, *, what: str) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._what = what
        self._buf = bytearray()
        self._cmds: dict[int, _Cmd] = {}
        self._next = 1
        self._reading = False
        self._round = anyio.Event()
        self._wlock = anyio.Lock()
        self._nonce: bytes | None = None
        self._pending = b""  # sent before the next request (the one-time token)
        self._ready = False
        self.dead: str | None = None
        self.loop: object = anyio.lowlevel.current_token()

    @classmethod
    async def open(cls, sock: socket.socket, key: bytes, *, what: str,
                   timeout: float = 30) -> AgentConnection:
        """Authenticate on ``sock`` (see the module docstring): wait for the agent's nonce
        and answer it. Raises :class:`AgentLost` when the agent closes the connection or
        sends no nonce within ``timeout``."""
        conn = cls(sock, what=what)
        try:
            with anyio.fail_after(timeout):
                await conn._until(lambda: conn._nonce is not None)
                assert conn._nonce is not None
                # Requests may follow at once: the agent reads nothing after a wrong
                # answer (it hangs up, and they fail with AgentLost), so waiting for its
                # ``h`` would only cost a round trip.
                await conn._send(frame(0, b"H", hello_answer(key, conn._nonce)))
        except TimeoutError:
            conn.close()
            raise AgentLost(f"{what} did not answer within {timeout:g}s") from None
        except BaseException:
            conn.close()
            raise
        return conn

    @classmethod
    def with_token(cls, sock: socket.socket, token: bytes, *, what: str) -> AgentConnection:
        """Authenticate with the one-time token a fresh agent was started with (``T``):
        nothing to wait for, so the first request goes out at once, in the same write."""
        conn = cls(sock, what=what)
        conn._pending = frame(0, b"T", token)
        return conn

    def close(self) -> None:
        """Drop the connection (commands started over it keep running, detached)."""
        if self.dead is None:
            self.dead = "closed"
        if self._sock.fileno() >= 0:
            with _suppress():
                anyio.notify_closing(self._sock)
            self._sock.close()

    def usable(self) -> bool:
        """Alive (the agent has not hung up meanwhile: a peek, no wait), and on the current
        event loop. A command is only sent over a usable connection, so a command is never
        sent to an agent that is known to be gone."""
        if self.dead is None:
            try:
                if self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                    self.dead = "the connection closed"
            except BlockingIOError:
                pass
            except OSError as exc:
                self.dead = f"recv: {exc.strerror or exc}"
        return self.dead is None and self.loop == anyio.lowlevel.current_token()

    # -- plumbing --------------------------------------------------------------------------

    async def _send(self, data: bytes) -> None:
        if self._pending:
            data, self._pending = self._pending + data, b""
        lock = self._wlock
        try:
            lock.acquire_nowait()  # the usual case: no wait, no trip through the loop
        except anyio.WouldBlock:
            await lock.acquire()
        try:
            view = memoryview(data)
            while view:
                if self.dead is not None:
                    raise AgentLost(f"{self._what} went away ({self.dead})")
                try:
                    view = view[self._sock.send(view):]
                except BlockingIOError:
                    await anyio.wait_writable(self._sock)
                except OSError as exc:
                    self._lost(f"send: {exc.strerror or exc}")
        finally:
            lock.release()

    def _lost(self, why: str) -> None:
        if self.dead is None:
            self.dead = why
        raise AgentLost(f"{self._what} went away ({why})")

    async def _until(self, done: Callable[[], bool]) -> None:
        """Wait until ``done()``: one waiting task reads and dispatches frames, the others
        wait for the end of its round and look again (anything read may be theirs)."""
        while not done():
            if self.dead is not None:
                raise AgentLost(f"{self._what} went away ({self.dead})")
            if self._reading:
                await self._round.wait()
                continue
            self._reading = True
            try:
                await self._read_once()
            finally:
                self._reading = False
                round_, self._round = self._round, anyio.Event()
                round_.set()

    def _recv(self) -> bytes:
        """The agent's next bytes (b"" at the end; raises :class:`BlockingIOError` when none
        are ready). The transport seam: docker's attach stream frames them
        (:class:`corral.providers._docker_agent.DockerStreamConnection`)."""
        return self._sock.recv(1 << 18)

    async def _read_once(self) -> None:
        try:
            data = self._recv()
        except BlockingIOError:
            await anyio.wait_readable(self._sock)
            try:
                data = self._recv()
            except BlockingIOError:
                return
            except OSError as exc:
                data, self.dead = b"", f"recv: {exc.strerror or exc}"
        except OSError as exc:
            data, self.dead = b"", f"recv: {exc.strerror or exc}"
        if not data:
            if self.dead is None:
                self.dead = "the connection closed"
            return
        buf = self._buf
        buf += data
        off = 0
        while len(buf) - off >= 9:
            length, ident, kind = _HEAD.unpack_from(buf, off)
            if len(buf) - off < 4 + length:
                break
            self._dispatch(ident, kind, bytes(buf[off + 9:off + 4 + length]))
            off += 4 + length
        del buf[:off]

    def _dispatch(self, ident: int, kind: int, payload: bytes) -> None:
        if ident == 0:
            if kind == ord("n") and len(payload) == 32:
                self._nonce = payload
            elif kind == ord("h"):
                self._ready = True
            return
        cmd = self._cmds.get(ident)
        if cmd is None:
            return
        if kind in (ord("1"), ord("2")):
            which = kind - ord("1")
            if payload:
                cmd.out[which].append(payload)
            else:
                cmd.eof[which] = True
        elif kind == ord("p"):
            cmd.started = True
            cmd.pid = struct.unpack("<I", payload)[0]
        elif kind == ord("x"):
            status, rep = struct.unpack("<iB", payload)
            cmd.status, cmd.reported = status, bool(rep)
        elif kind == ord("i"):
            cmd.stdin_acks += 1
            cmd.stdin_broken = cmd.stdin_broken or payload[:1] == b"\1"
        elif kind == ord("e"):
            cmd.error = payload.decode(errors="replace")
            cmd.out[1].append(f"corral: {cmd.error}\n".encode())
            cmd.eof = [True, True]

    # -- commands --------------------------------------------------------------------------

    async def start(self, blob: bytes, finisher: StatusFinisher,
                    gone: Callable[[], bool]) -> AgentProcess:
        """Start a command (``blob``: the launch fields, see the module docstring).
        ``gone()`` says whether the sandbox was destroyed (then a lost agent is no error:
        the command was killed with the sandbox)."""
        ident = self._next
        self._next += 1
        cmd = self._cmds[ident] = _Cmd()
        await self._send(frame(ident, b"S", blob))
        # Started (or refused) before it is returned: an agent that is gone fails here.
        await self._until(lambda: cmd.started or cmd.error is not None or cmd.status is not None)
        return AgentProcess(self, ident, cmd, finisher, gone)


    async def run(self, blob: bytes, finisher: StatusFinisher, gone: Callable[[], bool], *,
                  stdin: bytes | None, timeout: float | None) -> ExecResult:
        """Run a command to completion and collect its output (``exec``): one request, no
        task per stream. A timeout kills everything the command started (exit code 124).
        ``stdin`` is sent with the request (the agent writes it as the command reads)."""
        ident = self._next
        self._next += 1
        cmd = self._cmds[ident] = _Cmd()
        data = frame(ident, b"R", blob)
        for i in range(0, len(stdin or b""), _STDIN_CHUNK):
            assert stdin is not None
            data += frame(ident, b"I", stdin[i:i + _STDIN_CHUNK])
        data += frame(ident, b"C")
        out: tuple[list[bytes], list[bytes]] = ([], [])
        timed_out = False

        def done() -> bool:
            return ((cmd.status is not None or cmd.error is not None)
                    and cmd.eof[0] and cmd.eof[1])

        async def pump() -> None:
            while True:
                await self._until(lambda: bool(cmd.out[0] or cmd.out[1]) or done())
                for which in (0, 1):
                    q = cmd.out[which]
                    while q:
                        chunk = q.popleft()
                        out[which].append(chunk)
                        cmd.consumed[which] += len(chunk)
                    if cmd.consumed[which] >= _ACK_EVERY and not cmd.eof[which]:
                        m, cmd.consumed[which] = cmd.consumed[which], 0
                        await self._send(frame(ident, b"A", struct.pack("<BI", which, m)))
                if done() and not (cmd.out[0] or cmd.out[1]):
                    return

        try:
            try:
                await self._send(data)
                if timeout is None:
                    await pump()
                else:
                    with anyio.move_on_after(timeout) as scope:
                        await pump()
                if timeout is not None and scope.cancelled_caught:
                    timed_out = True
                    with anyio.CancelScope(shield=True):
                        await self._send(frame(ident, b"K", bytes([signal.SIGKILL])))
                        with anyio.move_on_after(5):
                            await pump()
            except BaseException:
                with anyio.CancelScope(shield=True), _suppress(AgentLost):
                    if not done():
                        await self._send(frame(ident, b"K", bytes([signal.SIGKILL])))
                raise
        except AgentLost as exc:
            if not gone():
                raise AgentLost(f"{exc}: the command was killed with it") from None
            cmd.status, cmd.reported = signal.SIGKILL, False  # destroyed with its sandbox
        finally:
            self._cmds.pop(ident, None)
        res = finisher(cmd.status if cmd.error is None else None, cmd.reported)
        return ExecResult(
            exit_code=TIMEOUT_EXIT_CODE if timed_out else res.exit_code,
            stdout=b"".join(out[0]), stderr=b"".join(out[1]), signal=res.signal,
            timed_out=timed_out, limit_hit=res.limit_hit)


class _Stream:
    def __init__(self, proc: AgentProcess, which: int) -> None:
        self._p = proc
        self._which = which

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> bytes:
        p, w = self._p, self._which
        q = p._cmd.out[w]
        try:
            await p._conn._until(lambda: bool(q) or p._cmd.eof[w])
        except AgentLost:
            if not q:
                raise StopAsyncIteration from None
        if not q:
            raise StopAsyncIteration
        chunk = q.popleft()
        await p._consumed(w, len(chunk))
        return chunk


class AgentProcess:
    """A command run by the agent (implements :class:`corral.sandbox.Process`)."""

    def __init__(self, conn: AgentConnection, ident: int, cmd: _Cmd, finisher: StatusFinisher,
                 gone: Callable[[], bool]) -> None:
        self._conn = conn
        self._gone = gone
        self._id = ident
        self._cmd = cmd
        self._finisher = finisher
        self._stdout = _Stream(self, 0)
        self._stderr = _Stream(self, 1)
        self._stdin_open = True
        self._detached = False
        self._result: ExecResult | None = None
        self.timed_out = False

    @property
    def pid(self) -> int | None:
        """The pid of the command's init in the agent's namespace (not a host pid)."""
        return self._cmd.pid

    @property
    def stdout(self) -> AsyncIterator[bytes]:
        return self._stdout

    @property
    def stderr(self) -> AsyncIterator[bytes]:
        return self._stderr

    @property
    def returncode(self) -> int | None:
        """The exit code once known (``128 + N`` for a death by signal N)."""
        if self._result is not None:
            return self._result.exit_code
        return None

    def _finished(self) -> bool:
        return self._cmd.status is not None or self._cmd.error is not None

    async def _consumed(self, which: int, n: int) -> None:
        c = self._cmd
        c.consumed[which] += n
        if c.consumed[which] >= _ACK_EVERY and not c.eof[which] and self._conn.dead is None:
            m, c.consumed[which] = c.consumed[which], 0
            with _suppress(AgentLost):
                await self._conn._send(frame(self._id, b"A", struct.pack("<BI", which, m)))

    async def write_stdin(self, data: bytes, *, chunk_size: int = _STDIN_CHUNK) -> None:
        """Write all of ``data`` (acknowledged once in the command's stdin pipe), a chunk
        at a time (what the agent holds at most); raises :class:`BrokenPipeError` once
        stdin is closed."""
        view = memoryview(data)
        while view:
            if not self._stdin_open or self._cmd.stdin_broken or self._finished():
                raise BrokenPipeError("stdin is closed")
            chunk, view = view[:chunk_size], view[chunk_size:]
            want = self._cmd.stdin_acks + 1

            def written(want: int = want) -> bool:
                return self._cmd.stdin_acks >= want or self._finished()

            try:
                await self._conn._send(frame(self._id, b"I", bytes(chunk)))
                await self._conn._until(written)
            except AgentLost as exc:
                raise BrokenPipeError(str(exc)) from None
            if self._cmd.stdin_broken or self._cmd.stdin_acks < want:
                raise BrokenPipeError("stdin is closed")

    def reachable(self) -> bool:
        """Its connection is alive and of this event loop (it can be killed, closed)."""
        return self._conn.usable()

    def running(self) -> bool:
        """Not known to have ended, and its connection alive on this event loop."""
        return not self._finished() and self._conn.usable()

    async def send_stdin(self, data: bytes) -> None:
        """Send ``data`` for the command's stdin without waiting for it to be written: no
        round trip, so the caller must bound what it sends this way (the agent holds it
        until the command reads it). Raises :class:`BrokenPipeError` once stdin is closed."""
        if not self._stdin_open or self._cmd.stdin_broken or self._finished():
            raise BrokenPipeError("stdin is closed")
        try:
            for i in range(0, len(data), _STDIN_CHUNK):
                await self._conn._send(frame(self._id, b"I", data[i:i + _STDIN_CHUNK]))
        except AgentLost as exc:
            raise BrokenPipeError(str(exc)) from None

    async def close_stdin(self) -> None:
        if self._stdin_open:
            self._stdin_open = False
            if not self._finished():
                with _suppress(AgentLost):
                    await self._conn._send(frame(self._id, b"C"))

    async def wait(self) -> ExecResult:
        if self._result is None:
            try:
                await self._conn._until(self._finished)
            except AgentLost as exc:
                if not self._gone():
                    raise AgentLost(f"{exc}: the command was killed with it") from None
                # The sandbox was destroyed: its commands were killed, as they are.
                self._cmd.status, self._cmd.reported = signal.SIGKILL, False
            c = self._cmd
            out = self._finisher(c.status, c.reported)
            self._result = ExecResult(exit_code=out.exit_code, stdout=b"", stderr=b"",
                                      signal=out.signal, timed_out=self.timed_out,
                                      limit_hit=out.limit_hit)
        return self._result

    def forget_result(self) -> None:
        """Let the next :meth:`wait` build its result again (after a timeout's kill)."""
        self._result = None

    async def kill(self, sig: int = signal.SIGKILL) -> None:
        if not self._finished() and self._conn.dead is None:
            with _suppress(AgentLost):
                await self._conn._send(frame(self._id, b"K", bytes([int(sig)])))

    async def aclose(self) -> None:
        """Stop listening (does not kill the command; its output pipes close)."""
        self._stdin_open = False
        if not self._detached:
            self._detached = True
            done = self._finished() and all(self._cmd.eof)
            if not done and self._conn.dead is None:
                with _suppress(AgentLost):
                    await self._conn._send(frame(self._id, b"D"))
            self._conn._cmds.pop(self._id, None)


class _suppress:
    """``contextlib.suppress`` for the few exceptions named (a tiny local copy keeps the
    hot path free of generator-based context managers)."""

    def __init__(self, *exc: type[BaseException]) -> None:
        self._exc = exc or (Exception,)

    def __enter__(self) -> None:
        return None

    def __exit__(self, tp: type[BaseException] | None, *_: Any) -> bool:
        return tp is not None and issubclass(tp, self._exc)
