"""Where a checkpoint's requests are answered: the stdlib script ``corral/_insandbox/checkpoint.py``
run with the sandbox's Python (one exec), or, for a save, :func:`~corral.sandbox._checkpoint_host.host_save`
on this host when the workspace is a host directory; and the frames read back from it
(untrusted: sizes are checked)."""

from __future__ import annotations

import posixpath
import signal
import struct
from collections.abc import AsyncIterable, AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

import anyio
import anyio.from_thread
import anyio.to_thread
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from corral._errors import CorralError
from corral._insandbox import checkpoint as checkpoint_script
from corral.sandbox._checkpoint_chunks import CHUNK_BYTES
from corral.sandbox._checkpoint_host import Buffered, host_save
from corral.sandbox._contracts import Described, Handle, HostPaths, Process

__all__ = [
    "CheckpointError",
    "Frames",
    "HEAD",
    "HostSource",
    "MAX_HEADER",
    "SandboxSource",
    "finish",
    "first_bytes",
    "host_source",
    "host_workspace",
    "running_script",
    "sandbox_source",
    "script",
]


class CheckpointError(CorralError):
    """A checkpoint or restore could not be made (the message says why)."""


HEAD: Final = struct.Struct(">cI")
"""A frame's kind and length."""
MAX_HEADER: Final = 256 << 20


def script() -> str:
    return Path(checkpoint_script.__file__).read_text()


class Frames:
    """Frames read from the script's stdout (untrusted: sizes are checked)."""

    def __init__(self, stream: AsyncIterator[bytes]) -> None:
        self._stream = stream
        self._buf = bytearray()
        self._pos = 0

    async def _fill(self, n: int) -> None:
        while len(self._buf) - self._pos < n:
            if self._pos:
                del self._buf[:self._pos]
                self._pos = 0
            try:
                self._buf += await self._stream.__anext__()
            except StopAsyncIteration:
                raise CheckpointError("the sandbox's checkpoint output ended early") from None

    async def next(self, limit: int) -> tuple[bytes, bytes]:
        await self._fill(HEAD.size)
        kind, length = HEAD.unpack_from(self._buf, self._pos)
        if length > limit:
            raise CheckpointError(f"the sandbox sent a frame of {length} bytes (limit {limit})")
        self._pos += HEAD.size
        await self._fill(length)
        with memoryview(self._buf) as view:
            data = bytes(view[self._pos:self._pos + length])
        self._pos += length
        return kind, data


async def _spawn(handle: Handle, python: str, cwd: str | None) -> Process:
    return await handle.process.spawn([python, "-I", "-S", "-c", script()], cwd=cwd)


async def _release(proc: Process) -> None:
    """Close the process's pipes (a provider's process may have no ``aclose``)."""
    aclose = getattr(proc, "aclose", None)
    if aclose is not None:
        with anyio.CancelScope(shield=True):
            await aclose()


async def first_bytes(stream: AsyncIterable[bytes], into: list[bytes]) -> None:
    """Read ``stream`` to its end, keeping about its first 4 KiB in ``into``."""
    async for part in stream:
        if sum(map(len, into)) < 4096:
            into.append(part)


async def finish(proc: Process, err: list[bytes], what: str) -> None:
    result = await proc.wait()
    await first_bytes(proc.stderr, err)
    if not result.ok:
        tail = b"".join(err)[-500:].decode("utf-8", "replace").strip()
        raise CheckpointError(f"{what} in the sandbox failed ({result.describe()})"
                              + (f": {tail}" if tail else ""))


class SandboxSource:
    """The save request answered by the script in the sandbox (one exec)."""

    def __init__(self, proc: Process) -> None:
        self.proc = proc
        self.stdout: AsyncIterator[bytes] = proc.stdout
        self.err: list[bytes] = []

    async def kill(self) -> None:
        await self.proc.kill(signal.SIGKILL)

    async def finish(self) -> None:
        await finish(self.proc, self.err, "reading the workspace")


@asynccontextmanager
async def running_script(handle: Handle, python: str) -> AsyncIterator[Process]:
    """The script running in the sandbox (in its workdir): SIGKILLed when the block fails,
    its pipes closed after."""
    proc = await _spawn(handle, python, handle.workdir)
    try:
        yield proc
    except BaseException:
        with anyio.CancelScope(shield=True):
            await proc.kill(signal.SIGKILL)
        raise
    finally:
        await _release(proc)


@asynccontextmanager
async def sandbox_source(handle: Handle, python: str, request: bytes
                          ) -> AsyncIterator[SandboxSource]:
    async with running_script(handle, python) as proc:
        try:
            await proc.write_stdin(request)
        except (BrokenPipeError, anyio.BrokenResourceError):
            pass  # the script ended before reading: its output ends early, which says so
        await proc.close_stdin()
        yield SandboxSource(proc)


class HostSource:
    """The save request answered on the host (:func:`host_save`, in a worker thread),
    its frames handed over about 1 MiB at a time through a bounded stream."""

    def __init__(self, receive: MemoryObjectReceiveStream[bytes]) -> None:
        self.stdout: AsyncIterator[bytes] = receive
        self._receive = receive
        self._done = anyio.Event()
        self._error: BaseException | None = None

    async def produce(self, send: MemoryObjectSendStream[bytes], request: bytes,
                      root: str) -> None:
        def run() -> None:
            out = Buffered(lambda data: anyio.from_thread.run(send.send, data), CHUNK_BYTES)
            host_save(request, out, root)
            out.close()

        try:
            async with send:
                await anyio.to_thread.run_sync(run)
        except Exception as exc:  # raised by finish (a reader stopped early sees no end)
            self._error = exc
        finally:
            self._done.set()

    async def kill(self) -> None:
        await self._receive.aclose()  # the producer's next hand-over fails: it stops

    async def finish(self) -> None:
        await self._done.wait()
        if self._error is not None:
            raise CheckpointError(f"reading the workspace from the host failed: "
                                  f"{self._error}") from self._error


@asynccontextmanager
async def host_source(request: bytes, root: str) -> AsyncIterator[HostSource]:
    send, receive = anyio.create_memory_object_stream[bytes](4)
    source = HostSource(receive)
    failed: Exception | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(source.produce, send, request, root)
        try:
            yield source
        except Exception as exc:  # raised after the group (not as an exception group)
            failed = exc
        finally:
            await receive.aclose()
    if failed is not None:
        raise failed


def host_workspace(handle: Handle) -> str | None:
    """The host directory of ``handle``'s workspace, when a checkpoint may read it there:
    the provider keeps it in a host directory (:class:`HostPaths`) and binds nothing
    under it (what the sandbox sees there is then exactly that directory)."""
    if not isinstance(handle, HostPaths):
        return None
    workdir = posixpath.normpath(handle.workdir)
    binds = handle.binds if isinstance(handle, Described) else ()
    for _host, inside in binds:
        inside = posixpath.normpath(inside)
        if inside == workdir or inside.startswith(workdir.rstrip("/") + "/") \
                or workdir.startswith(inside.rstrip("/") + "/"):
            return None
    return handle.host_path(workdir)
