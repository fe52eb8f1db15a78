"""Streaming processes and run-to-completion for host-launched sandbox commands.

A provider supplies how to launch (an argv and env), how to kill the tree, and how to
turn the launcher's exit status into an :class:`ExecResult`; this module does the rest:
separate stdout/stderr byte streams, stdin, wait, timeouts, and ``exec`` that drains both
pipes concurrently (so 50 MB of output cannot deadlock).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Protocol

import anyio

from corral.sandbox._contracts import TIMEOUT_EXIT_CODE, Command, ExecResult, Process
from corral._errors import ConfigError

__all__ = ["Collectable", "Outcome", "SandboxProcess", "collect", "drain", "feed_stdin", "merge_env", "popen",
           "to_argv"]


def to_argv(command: Command) -> list[str]:
    """A shell string runs under ``/bin/sh -c``; a sequence is an argv."""
    if isinstance(command, str):
        return ["/bin/sh", "-c", command]
    argv = [str(a) for a in command]
    if not argv:

        raise ConfigError("empty command: give a shell string or a non-empty argv list")
    return argv


@dataclass(frozen=True, slots=True)
class Outcome:
    exit_code: int
    signal: int | None = None
    limit_hit: str | None = None


Finisher = Callable[[int], Outcome]
"""Maps the launcher's return code (negative = killed by that signal) to an outcome."""
Killer = Callable[[int], Awaitable[None]]


class _ByteStream:
    """An async iterator over chunks of one non-blocking pipe; ends at EOF."""

    def __init__(self, fh: IO[bytes] | None) -> None:
        self._fh = fh
        if fh is not None:
            os.set_blocking(fh.fileno(), False)

    def __aiter__(self) -> _ByteStream:
        return self

    async def __anext__(self) -> bytes:
        while self._fh is not None:
            try:
                chunk = os.read(self._fh.fileno(), 1 << 16)
            except BlockingIOError:
                await anyio.wait_readable(self._fh.fileno())
                continue
            except (OSError, ValueError):  # closed underneath us
                chunk = b""
            if chunk:
                return chunk
            self.close()
        raise StopAsyncIteration

    def close(self) -> None:
        if self._fh is not None:
            fh, self._fh = self._fh, None
            with contextlib.suppress(OSError, ValueError):
                anyio.notify_closing(fh.fileno())
            fh.close()


class SandboxProcess(Process):
    """A process started by a provider (implements the :class:`Process` protocol).

    It wraps a plain :class:`subprocess.Popen` (not an asyncio transport, which would
    kill the process when the event loop closes: processes must be able to outlive us).
    Waiting uses a pidfd, so it costs no thread.
    """

    def __init__(self, popen: subprocess.Popen[bytes], *, killer: Killer, finisher: Finisher) -> None:
        self._popen = popen
        self._killer = killer
        self._finisher = finisher
        self._stdout = _ByteStream(popen.stdout)
        self._stderr = _ByteStream(popen.stderr)
        self._stdin = popen.stdin
        if self._stdin is not None:
            os.set_blocking(self._stdin.fileno(), False)
        self._result: ExecResult | None = None
        self.timed_out = False

    @property
    def pid(self) -> int | None:
        """The host pid of the launcher process (not a pid inside the sandbox)."""
        return self._popen.pid

    @property
    def stdout(self) -> AsyncIterator[bytes]:
        return self._stdout

    @property
    def stderr(self) -> AsyncIterator[bytes]:
        return self._stderr

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    async def write_stdin(self, data: bytes) -> None:
        """Write all of ``data``; raises :class:`BrokenPipeError` once stdin is closed."""
        if self._stdin is None:
            raise BrokenPipeError("stdin is closed")
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._stdin.fileno(), view) :]
            except BlockingIOError:
                await anyio.wait_writable(self._stdin.fileno())

    async def close_stdin(self) -> None:
        if self._stdin is not None:
            fh, self._stdin = self._stdin, None
            with contextlib.suppress(OSError, ValueError):
                anyio.notify_closing(fh.fileno())
            with contextlib.suppress(OSError):
                fh.close()

    async def _wait_rc(self) -> int:
        rc = self._popen.poll()
        if rc is not None:
            return rc
        try:
            pidfd = os.pidfd_open(self._popen.pid)
        except OSError:
            pidfd = -1
        try:
            while (rc := self._popen.poll()) is None:
                if pidfd >= 0:
                    await anyio.wait_readable(pidfd)
                else:
                    await anyio.sleep(0.01)
            return rc
        finally:
            if pidfd >= 0:
                with contextlib.suppress(OSError, ValueError):
                    anyio.notify_closing(pidfd)
                os.close(pidfd)

    async def wait(self) -> ExecResult:
        if self._result is None:
            rc = await self._wait_rc()
            if self._result is None:
                out = self._finisher(rc)
                self._result = ExecResult(
                    exit_code=out.exit_code,
                    stdout=b"",
                    stderr=b"",
                    signal=out.signal,
                    timed_out=self.timed_out,
                    limit_hit=out.limit_hit,
                )
        return self._result

    def forget_result(self) -> None:
        """Let the next :meth:`wait` build its result again (after a timeout's kill)."""
        self._result = None

    async def kill(self, sig: int = signal.SIGKILL) -> None:
        if self._popen.poll() is None:
            await self._killer(sig)

    async def aclose(self) -> None:
        """Release the pipes (does not kill the process)."""
        await self.close_stdin()
        self._stdout.close()
        self._stderr.close()


async def drain(it: AsyncIterator[bytes], into: list[bytes]) -> None:
    """Collect a stream's chunks into ``into``."""
    async for chunk in it:
        into.append(chunk)


async def feed_stdin(proc: Process, data: bytes | None) -> None:
    """Write ``data`` to the process's stdin, then close it (a command that stops reading
    early is not an error)."""
    try:
        if data:
            await proc.write_stdin(data)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, BrokenPipeError):
        pass  # the command did not read all of its stdin; that is its business
    finally:
        try:
            await proc.close_stdin()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, BrokenPipeError):
            pass


class Collectable(Process, Protocol):
    """What :func:`collect` drives: a process that can be told it timed out."""

    timed_out: bool

    def forget_result(self) -> None: ...

    async def aclose(self) -> None: ...


async def collect(
    proc: Collectable, *, stdin: bytes | None, timeout: float | None
) -> ExecResult:
    """Feed stdin, drain both pipes, wait; on timeout kill the whole tree."""
    out: list[bytes] = []
    err: list[bytes] = []
    try:
        with anyio.move_on_after(math.inf if timeout is None else timeout) as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(feed_stdin, proc, stdin)
                tg.start_soon(drain, proc.stdout, out)
                tg.start_soon(drain, proc.stderr, err)
                await proc.wait()
        if scope.cancelled_caught:
            proc.timed_out = True
            with anyio.CancelScope(shield=True):
                await proc.kill(signal.SIGKILL)
                # Output written before the kill is still in the pipes; keep it.
                with anyio.move_on_after(5):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(drain, proc.stdout, out)
                        tg.start_soon(drain, proc.stderr, err)
                proc.forget_result()
                res = await proc.wait()
        else:
            res = await proc.wait()
    except BaseException:
        with anyio.CancelScope(shield=True):
            await proc.kill(signal.SIGKILL)
            with anyio.move_on_after(5):
                await proc.wait()
        raise
    finally:
        with anyio.CancelScope(shield=True):
            await proc.aclose()
    return ExecResult(
        # Stopped by the timeout: a failure whatever the command (or a wedged reporter) said.
        exit_code=TIMEOUT_EXIT_CODE if res.timed_out else res.exit_code,
        stdout=b"".join(out),
        stderr=b"".join(err),
        signal=res.signal,
        timed_out=res.timed_out,
        limit_hit=res.limit_hit,
    )


def popen(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None = None,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """Start a launcher in its own session with three pipes (vfork/posix_spawn fast path)."""
    return subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
        pass_fds=tuple(pass_fds),
        bufsize=0,
    )


def merge_env(*envs: Mapping[str, str] | None) -> dict[str, str]:
    merged: dict[str, str] = {}
    for env in envs:
        if env:
            merged.update(env)
    return merged

