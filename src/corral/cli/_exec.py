"""``corral exec``: run one command in a fresh (or named) sandbox, streaming its output."""

from __future__ import annotations

import argparse
import codecs
import json
import os
import signal
import stat
import sys
from collections.abc import AsyncIterator
from typing import Any, BinaryIO

import anyio

from corral._errors import ConfigError
from corral._paths import home_label
from corral.providers import get_provider
from corral.sandbox._contracts import (
    DEFAULT_PROVIDER,
    TIMEOUT_EXIT_CODE,
    Handle,
    Process,
    Provider,
    ResourceLimits,
    SandboxSpec,
    check_env_name,
)
from corral._validate import size

__all__ = ["run"]


def _parse_env(items: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"--env {item!r}: use NAME=VALUE")
        env[check_env_name(name, "--env")] = value
    return env


def run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError("no command given: corral exec [options] -- COMMAND [ARGS...]")
    if args.sandbox and (args.keep or args.name or args.network or args.disk):
        raise ConfigError(
            "--keep, --name, --network and --disk apply to a fresh sandbox, not to --sandbox"
        )
    args.disk_bytes = size(args.disk, "--disk") if args.disk is not None else None
    provider_name = args.provider or os.environ.get("CORRAL_PROVIDER") or DEFAULT_PROVIDER
    env = _parse_env(args.env)
    return anyio.run(_run, args, provider_name, command, env)


async def _run(args: argparse.Namespace, provider_name: str, command: list[str], env: dict[str, str]) -> int:
    provider = get_provider(provider_name)
    fresh = args.sandbox is None
    if fresh:
        # no store here: the home's label lets `corral sandboxes` tell this home's sandbox
        # from another's on a shared daemon
        spec = SandboxSpec(
            name=args.name, network=args.network, limits=ResourceLimits(disk_bytes=args.disk_bytes),
            labels={"corral.home": home_label()},
        )
        handle: Handle | None = await provider.create(spec)
    else:
        handle = await provider.resume(args.sandbox)
        if handle is None:
            raise ConfigError(
                f"no {provider_name} sandbox {args.sandbox!r}: list them with `corral sandboxes ls`"
            )
    assert handle is not None
    try:
        return await _stream(handle, command, args.cwd, env, args.timeout,
                             as_json=getattr(args, "json", False))
    finally:
        with anyio.CancelScope(shield=True):
            await _finish(provider, handle, fresh, args.keep)


async def _finish(provider: Provider, handle: Handle, fresh: bool, keep: bool) -> None:
    if not fresh:
        return
    if keep:
        print(f"corral: kept sandbox {handle.id} ({provider.name})", file=sys.stderr)
    else:
        await provider.destroy(handle.ref)


async def _pump(src: AsyncIterator[bytes], dst: BinaryIO) -> None:
    async for chunk in src:
        dst.write(chunk)
        dst.flush()


def _json_line(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n")
    sys.stdout.flush()


async def _pump_json(src: AsyncIterator[bytes], name: str) -> None:
    """``--json``: the output as JSON lines ``{"stream": NAME, "data": TEXT}`` (a stream:
    one line per chunk; bytes that are not UTF-8 become U+FFFD)."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    async for chunk in src:
        if text := decoder.decode(chunk):
            _json_line({"stream": name, "data": text})
    if text := decoder.decode(b"", final=True):
        _json_line({"stream": name, "data": text})


async def _feed_stdin(proc: Process) -> None:
    """Forward our stdin when it is a pipe or a file; a terminal is not forwarded."""
    try:
        fd = sys.stdin.fileno()
        mode = os.fstat(fd).st_mode
    except (OSError, ValueError, AttributeError):
        await proc.close_stdin()
        return
    try:
        if stat.S_ISREG(mode):
            while chunk := os.read(fd, 1 << 16):
                await proc.write_stdin(chunk)
        elif stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            os.set_blocking(fd, False)
            while True:
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    await anyio.wait_readable(fd)
                    continue
                if not chunk:
                    break
                await proc.write_stdin(chunk)
    except (BrokenPipeError, OSError):
        pass
    finally:
        await proc.close_stdin()


async def _stream(
    handle: Handle, command: list[str], cwd: str | None, env: dict[str, str],
    timeout: float | None, *, as_json: bool = False,
) -> int:
    proc = await handle.process.spawn(command, cwd=cwd, env=env)
    timed_out = False
    try:
        with anyio.move_on_after(timeout if timeout is not None else float("inf")) as scope:
            async with anyio.create_task_group() as tg:
                if as_json:
                    tg.start_soon(_pump_json, proc.stdout, "stdout")
                    tg.start_soon(_pump_json, proc.stderr, "stderr")
                else:
                    tg.start_soon(_pump, proc.stdout, sys.stdout.buffer)
                    tg.start_soon(_pump, proc.stderr, sys.stderr.buffer)
                feeder = anyio.CancelScope()

                async def feed() -> None:
                    with feeder:
                        await _feed_stdin(proc)

                tg.start_soon(feed)
                result = await proc.wait()
                feeder.cancel()
        if scope.cancelled_caught:
            timed_out = True
            with anyio.CancelScope(shield=True):
                await proc.kill(signal.SIGKILL)
                result = await proc.wait()
    except BaseException:
        with anyio.CancelScope(shield=True):
            await proc.kill(signal.SIGKILL)
        raise
    finally:
        with anyio.CancelScope(shield=True):
            aclose = getattr(proc, "aclose", None)  # the pipes (every provider's process)
            if aclose is not None:
                await aclose()
    if as_json:  # the stream's last line: how it ended
        _json_line({"exit_code": TIMEOUT_EXIT_CODE if timed_out else result.exit_code,
                    "signal": None if timed_out else result.signal,
                    "timed_out": timed_out})
    if timed_out:
        print(f"corral: command timed out after {timeout:g}s and was killed (exit "
              f"{TIMEOUT_EXIT_CODE})", file=sys.stderr)
        return TIMEOUT_EXIT_CODE
    if result.signal is not None or result.limit_hit is not None:
        print(f"corral: command {result.describe()}", file=sys.stderr)
    return result.exit_code
