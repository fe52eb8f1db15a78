"""Streaming processes and run-to-completion for host-launched sandbox commands.

A provider supplies how to launch (an argv and env), how to kill the tree, and how to
turn the launcher's exit status into an :class:`ExecResult`; this module does the rest:
separate stdout/stderr byte streams, stdin, wait, timeouts, and ``exec`` that drains both
pipes concurrently (so 50 MB of output cannot deadlock).
"""

from __future__ import annotations

import math
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass

import anyio
import anyio.abc

from corral.sandbox.contracts import Command, ExecResult, Process

__all__ = ["Outcome", "SandboxProcess", "collect", "to_argv"]


def to_argv(command: Command) -> list[str]:
    """A shell string runs under ``/bin/sh -c``; a sequence is an argv."""
    if isinstance(command, str):
        return ["/bin/sh", "-c", command]
    argv = [str(a) for a in command]
    if not argv:
        from corral.errors import ConfigError

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
    """An async iterator over chunks of one pipe; ends at EOF. Iterate it once."""

    def __init__(self, stream: anyio.abc.ByteReceiveStream | None) -> None:
        self._stream = stream

    def __aiter__(self) -> _ByteStream:
        return self

    async def __anext__(self) -> bytes:
        if self._stream is None:
            raise StopAsyncIteration
        try:
            return await self._stream.receive(1 << 16)
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise StopAsyncIteration from None


class SandboxProcess(Process):
    """A process started by a provider (implements the :class:`Process` protocol)."""

    def __init__(
        self,
        proc: anyio.abc.Process,
        *,
        killer: Killer,
        finisher: Finisher,
        pid: int | None = None,
    ) -> None:
        self._proc = proc
        self._killer = killer
        self._finisher = finisher
        self._pid = pid if pid is not None else proc.pid
        self._stdout = _ByteStream(proc.stdout)
        self._stderr = _ByteStream(proc.stderr)
        self._result: ExecResult | None = None
        self.timed_out = False

    @property
    def pid(self) -> int | None:
        """The host pid of the launcher process (not a pid inside the sandbox)."""
        return self._pid

    @property
    def stdout(self) -> AsyncIterator[bytes]:
        return self._stdout

    @property
    def stderr(self) -> AsyncIterator[bytes]:
        return self._stderr

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    async def write_stdin(self, data: bytes) -> None:
        if self._proc.stdin is None:
            raise BrokenPipeError("stdin is closed")
        await self._proc.stdin.send(data)

    async def close_stdin(self) -> None:
        if self._proc.stdin is not None:
            await self._proc.stdin.aclose()

    async def wait(self) -> ExecResult:
        if self._result is None:
            rc = await self._proc.wait()
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

    async def kill(self, sig: int = signal.SIGKILL) -> None:
        if self._proc.returncode is None:
            await self._killer(sig)

    async def aclose(self) -> None:
        """Release the pipes (does not kill the process)."""
        for s in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            if s is not None:
                await s.aclose()


async def _drain(it: AsyncIterator[bytes], into: list[bytes]) -> None:
    async for chunk in it:
        into.append(chunk)


async def _feed(proc: SandboxProcess, data: bytes | None) -> None:
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


async def collect(
    proc: SandboxProcess, *, stdin: bytes | None, timeout: float | None
) -> ExecResult:
    """Feed stdin, drain both pipes, wait; on timeout kill the whole tree."""
    out: list[bytes] = []
    err: list[bytes] = []
    try:
        with anyio.move_on_after(math.inf if timeout is None else timeout) as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_feed, proc, stdin)
                tg.start_soon(_drain, proc.stdout, out)
                tg.start_soon(_drain, proc.stderr, err)
                await proc.wait()
        if scope.cancelled_caught:
            proc.timed_out = True
            with anyio.CancelScope(shield=True):
                await proc.kill(signal.SIGKILL)
                # Output written before the kill is still in the pipes; keep it.
                with anyio.move_on_after(5):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(_drain, proc.stdout, out)
                        tg.start_soon(_drain, proc.stderr, err)
                proc._result = None
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
        exit_code=res.exit_code,
        stdout=b"".join(out),
        stderr=b"".join(err),
        signal=res.signal,
        timed_out=res.timed_out,
        limit_hit=res.limit_hit,
    )


def merge_env(*envs: Mapping[str, str] | None) -> dict[str, str]:
    merged: dict[str, str] = {}
    for env in envs:
        if env:
            merged.update(env)
    return merged

