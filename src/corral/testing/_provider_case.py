"""What the provider kit's checks run against (a :class:`ProviderCase`, fresh for each) and
the host-side helpers they share: a heartbeat to tell a live process from a stopped one, a
second Python process acting on a sandbox, and a host command started as its contract
says."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from corral.sandbox._contracts import (
    Handle,
    HostCommand,
    Provider,
    SandboxSpec,
)
from corral.testing._kit import CheckSkipped, Factory, opened
from corral.testing._polling import wait_until_async

__all__ = [
    "HEARTBEAT",
    "ProviderCase",
    "assert_beating",
    "assert_stopped",
    "heartbeat_cmd",
    "provider_case",
    "second_process",
    "start_host_command",
]

HEARTBEAT = "while :; do date +%s%N > {f}; sleep 0.05; done"


def heartbeat_cmd(path: str) -> str:
    """A shell loop that rewrites ``path`` every 50 ms while it lives."""
    return HEARTBEAT.format(f=path)


async def _read_or_none(h: Handle, path: str) -> bytes | None:
    try:
        return await h.fs.read(path)
    except FileNotFoundError:
        return None


async def assert_beating(h: Handle, path: str, timeout: float = 10.0) -> None:
    """The heartbeat file changes (its writer is alive)."""
    first: list[bytes | None] = [None]

    async def changed() -> bool:
        cur = await _read_or_none(h, path)
        if cur is None:
            return False
        if first[0] is None:
            first[0] = cur
            return False
        return cur != first[0]

    await wait_until_async(changed, f"heartbeat {path} to change", timeout=timeout,
                           interval=0.02)


async def assert_stopped(h: Handle, path: str, quiet: float = 1.0) -> None:
    """The heartbeat's writer is dead: once removed, the file stays absent for ``quiet``
    seconds (20 heartbeat periods)."""
    await h.fs.remove(path)
    deadline = time.monotonic() + quiet
    while time.monotonic() < deadline:
        assert not await h.fs.exists(path), f"{path} came back: its writer is still alive"
        await anyio.sleep(0.05)


def _subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


_SECOND_PROCESS = """
import anyio, importlib, json, sys
mod, _, attr = sys.argv[1].partition(":")
provider = getattr(importlib.import_module(mod), attr)()
action, sandbox_id, arg = sys.argv[2], sys.argv[3], sys.argv[4]


async def main():
    h = await provider.resume(sandbox_id)
    if h is None:
        print(json.dumps({"resumed": False})); return
    if action == "exec":
        r = await h.process.exec(arg)
        print(json.dumps({"resumed": True, "exit": r.exit_code, "out": r.stdout.decode()}))
    elif action == "spawn":
        await h.process.spawn(arg)
        print(json.dumps({"resumed": True}))
anyio.run(main)
"""


def second_process(factory: str, action: str, sandbox_id: str, arg: str = "") -> dict[str, object]:
    """Run an action on a sandbox from a separate Python process; return its JSON."""
    out = subprocess.run(
        [sys.executable, "-c", _SECOND_PROCESS, factory, action, sandbox_id, arg],
        capture_output=True,
        check=False,
        text=True,
        env=_subprocess_env(),
        timeout=60,
    )
    assert out.returncode == 0, f"second process failed: {out.stderr}"
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@dataclass
class ProviderCase:
    """What one provider check runs against: a fresh provider, how a second process builds
    it, whether its sandboxes run POSIX shell commands, and a private host directory."""

    provider: Provider
    import_path: str
    """``module:callable`` a second Python process calls (no arguments) for the provider."""
    posix_shell: bool
    """Commands inside run under ``/bin/sh`` with the usual POSIX tools."""
    scratch: Path
    """A host directory of this check's own (removed afterwards)."""
    _sandbox: Handle | None = field(default=None, repr=False)

    async def sandbox(self) -> Handle:
        """This check's sandbox (default spec), created on first use, destroyed after."""
        if self._sandbox is None:
            self._sandbox = await self.provider.create(SandboxSpec())
        return self._sandbox

    def need(self, capability: str) -> None:
        """Skip the check unless the provider declares ``capability``."""
        if not getattr(self.provider.capabilities, capability):
            raise CheckSkipped(f"the provider declares {capability}=False: nothing promised")

    def need_shell(self) -> None:
        """Skip the check unless the sandbox runs POSIX shell commands."""
        if not self.posix_shell:
            raise CheckSkipped("the sandbox runs no POSIX shell (posix_shell=False)")


def _import_path(provider: Provider) -> str:
    cls = type(provider)
    return f"{cls.__module__}:{cls.__qualname__}"


@asynccontextmanager
async def provider_case(
    make_provider: Factory, *, import_path: str | None = None, posix_shell: bool = True
) -> AsyncIterator[ProviderCase]:
    """A :class:`ProviderCase` over a fresh provider; its sandbox is destroyed afterwards."""
    with tempfile.TemporaryDirectory(prefix="corral-provider-kit-") as tmp:
        async with opened(make_provider) as provider:
            case = ProviderCase(provider, import_path or _import_path(provider), posix_shell,
                                Path(tmp))
            try:
                yield case
            finally:
                if case._sandbox is not None:
                    await provider.destroy(case._sandbox.ref)


def start_host_command(hc: HostCommand, *, stdout: Any, stderr: Any) -> subprocess.Popen[bytes]:
    """Start ``hc`` as its contract says: exactly its env, its stdin prefix written first."""
    proc = subprocess.Popen(
        list(hc.argv), env=dict(hc.env), cwd=hc.cwd, stdout=stdout, stderr=stderr,
        stdin=subprocess.PIPE, start_new_session=True,
    )
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.write(hc.stdin_prefix)
    proc.stdin.close()
    return proc
