"""Provider conformance kit: the sandbox contract (DESIGN §2), as plain checks.

    from corral.testing import check_provider

    await check_provider(MyProvider)                       # raises KitFailed naming failures
    await check_provider(MyProvider, import_path="my_pkg.providers:MyProvider")

``make_provider`` makes the provider (see :mod:`corral.testing._kit` for the factory
forms); every check gets a fresh one. ``import_path`` ("module:callable", called without
arguments) is how a second Python process builds the same provider; it defaults to the
provider's class. The provider must find its state through the environment
(``$CORRAL_HOME`` or its own config) so that the second process sees the same sandboxes.

Checks branch on the declared :class:`~corral.sandbox._contracts.Capabilities`: a missing
capability must raise :class:`~corral.sandbox._contracts.UnsupportedCapability`, a declared
one is verified, and a check about a capability the provider does not declare is skipped
with that reason (:class:`~corral.testing.CheckSkipped`), never silently passed. Most checks
run POSIX shell commands (``sh``, coreutils) inside the sandbox; a provider that runs no
shell (such as :class:`~corral.testing.FakeProvider`) passes ``posix_shell=False``, and those
checks are skipped or keep to the filesystem part.
"""

# Host-side checks do small blocking file and process calls on purpose.
# ruff: noqa: ASYNC220, ASYNC230

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from corral._errors import CorralError
from corral.journal._layout import JournalPaths
from corral.journal._sentinel import new_nonce
from corral.runs._placement import placement
from corral.runs._site import SupervisedCommand
from corral.sandbox._contracts import (
    Handle,
    HostCommand,
    PathEscapeError,
    Provider,
    SandboxGoneError,
    SandboxSpec,
    UnsupportedCapability,
)
from corral.testing._kit import CheckSkipped, Factory, Kit, KitReport, opened, raises
from corral.testing._polling import wait_until_async

__all__ = [
    "PROVIDER_KIT",
    "ProviderCase",
    "assert_beating",
    "assert_stopped",
    "check_provider",
    "heartbeat_cmd",
    "second_process",
    "start_host_command",
    "check_background_process_outlives_its_creator",
    "check_bad_requests_are_clear_errors",
    "check_binary_round_trip",
    "check_destroy_kills_processes_removes_state_and_is_idempotent",
    "check_dotdot_and_absolute_paths_cannot_escape",
    "check_env_and_cwd",
    "check_exit_codes_and_streams_apart",
    "check_fifos_planted_inside_never_block_the_host",
    "check_fifty_megabytes_of_output_do_not_deadlock",
    "check_host_command_from_a_detached_process",
    "check_host_command_processes_die_with_the_sandbox",
    "check_hundred_megabytes_stream",
    "check_kill_reaches_grandchildren",
    "check_kill_with_sigterm_lets_the_command_handle_it",
    "check_list_stat_rename_remove",
    "check_missing_capabilities_raise",
    "check_names",
    "check_agent_site_launches_probes_and_stops",
    "check_private_dir_is_invisible_inside",
    "check_resume_from_a_second_process",
    "check_signal_death_is_a_named_failure",
    "check_stdin",
    "check_streaming_partial_lines_and_stdin",
    "check_symlinks_planted_inside_cannot_reach_out",
    "check_timeout_kills_the_tree",
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


PROVIDER_KIT: Kit[ProviderCase] = Kit("provider", subject=provider_case)
"""Every provider check; the subject is a :class:`ProviderCase`."""


# ------------------------------------------------------------------ exec


@PROVIDER_KIT.add
async def check_exit_codes_and_streams_apart(case: ProviderCase) -> None:
    case.need_shell()
    sandbox = await case.sandbox()
    r = await sandbox.process.exec("echo out; echo err >&2; exit 7")
    assert (r.exit_code, r.stdout, r.stderr, r.signal, r.ok) == (7, b"out\n", b"err\n", None, False)
    ok = await sandbox.process.exec(["true"])
    assert ok.ok and ok.exit_code == 0


@PROVIDER_KIT.add
async def check_signal_death_is_a_named_failure(case: ProviderCase) -> None:
    case.need_shell()
    sandbox = await case.sandbox()
    r = await sandbox.process.exec(["sh", "-c", "kill -TERM $$"])
    assert r.signal == signal.SIGTERM and r.signal_name == "SIGTERM"
    assert r.exit_code == 128 + signal.SIGTERM and not r.ok
    assert "SIGTERM" in r.describe()
    plain = await sandbox.process.exec(["sh", "-c", "exit 143"])
    assert plain.exit_code == 143 and plain.signal is None


@PROVIDER_KIT.add
async def check_fifty_megabytes_of_output_do_not_deadlock(case: ProviderCase) -> None:
    case.need_shell()
    sandbox = await case.sandbox()
    r = await sandbox.process.exec(
        "head -c 20000000 /dev/zero >&2 & head -c 50000000 /dev/zero; wait", timeout=120
    )
    assert r.exit_code == 0
    assert len(r.stdout) == 50_000_000 and len(r.stderr) == 20_000_000


@PROVIDER_KIT.add
async def check_stdin(case: ProviderCase) -> None:
    case.need_shell()
    sandbox = await case.sandbox()
    data = bytes(range(256)) * 4096
    r = await sandbox.process.exec(["cat"], stdin=data)
    assert r.stdout == data
    r2 = await sandbox.process.exec(["wc", "-c"], stdin=None)
    assert r2.stdout.strip() == b"0"


@PROVIDER_KIT.add
async def check_env_and_cwd(case: ProviderCase) -> None:
    case.need_shell()
    provider = case.provider
    h = await provider.create(SandboxSpec(env={"FROM_SPEC": "spec value"}))
    try:
        await h.fs.mkdir("sub/dir")
        r = await h.process.exec(
            'printf "%s|%s|" "$FROM_SPEC" "$FROM_CALL"; pwd',
            env={"FROM_CALL": "call $value"},
            cwd="sub/dir",
        )
        assert r.ok, r
        spec_val, call_val, cwd = r.stdout.decode().strip().split("|")
        assert (spec_val, call_val) == ("spec value", "call $value")
        assert cwd.endswith("/workspace/sub/dir")
        default = await h.process.exec("pwd")
        assert default.stdout.decode().strip().endswith("/workspace")
    finally:
        await provider.destroy(h.ref)


@PROVIDER_KIT.add
async def check_bad_requests_are_clear_errors(case: ProviderCase) -> None:
    sandbox = await case.sandbox()
    with raises(CorralError, match="does not exist"):
        await sandbox.process.exec("true", cwd="no/such/dir")
    with raises(CorralError):
        await sandbox.process.exec([])
    r = await sandbox.process.exec(["definitely-not-a-command-xyz"])
    assert r.exit_code == 127 and not r.ok


@PROVIDER_KIT.add
async def check_timeout_kills_the_tree(case: ProviderCase) -> None:
    case.need_shell()
    provider = case.provider
    sandbox = await case.sandbox()
    cmd = f"setsid sh -c '{heartbeat_cmd('gc')}' >/dev/null 2>&1 & sleep 100"
    start = time.monotonic()
    r = await sandbox.process.exec(cmd, timeout=1.5)
    assert r.timed_out and not r.ok
    assert time.monotonic() - start < 30
    if provider.capabilities.killable_processes:
        await assert_stopped(sandbox, "gc")


# ------------------------------------------------------------------ spawn


@PROVIDER_KIT.add
async def check_streaming_partial_lines_and_stdin(case: ProviderCase) -> None:
    case.need_shell()
    case.need("writable_stdin")
    sandbox = await case.sandbox()
    p = await sandbox.process.spawn(["sh", "-c", 'printf partial; printf E >&2; read x; printf "%s-done" "$x"'])
    it = p.stdout.__aiter__()
    got = b""
    with anyio.fail_after(10):
        while got != b"partial":
            got += await it.__anext__()
    err = await p.stderr.__aiter__().__anext__()
    assert err == b"E"
    await p.write_stdin(b"go\n")
    await p.close_stdin()
    rest = b"".join([chunk async for chunk in it])
    assert rest == b"go-done"
    r = await p.wait()
    assert r.exit_code == 0 and r.ok


@PROVIDER_KIT.add
async def check_kill_reaches_grandchildren(case: ProviderCase) -> None:
    case.need_shell()
    provider = case.provider
    sandbox = await case.sandbox()
    script = f"setsid sh -c '{heartbeat_cmd('gc')}' >/dev/null 2>&1 & {heartbeat_cmd('parent')}"
    p = await sandbox.process.spawn(["sh", "-c", script])
    await assert_beating(sandbox, "gc")
    await assert_beating(sandbox, "parent")
    await p.kill()
    with anyio.fail_after(10):
        r = await p.wait()
    assert r.signal == signal.SIGKILL and not r.ok
    await assert_stopped(sandbox, "parent")
    if provider.capabilities.killable_processes:
        await assert_stopped(sandbox, "gc")


@PROVIDER_KIT.add
async def check_kill_with_sigterm_lets_the_command_handle_it(case: ProviderCase) -> None:
    case.need_shell()
    sandbox = await case.sandbox()
    p = await sandbox.process.spawn(
        ["sh", "-c", "trap 'echo got-term; exit 3' TERM; echo ready; while :; do sleep 0.05; done"]
    )
    it = p.stdout.__aiter__()
    with anyio.fail_after(10):
        assert (await it.__anext__()).startswith(b"ready")
    await p.kill(signal.SIGTERM)
    with anyio.fail_after(10):
        r = await p.wait()
    assert r.exit_code == 3 and r.signal is None
    assert b"got-term" in b"".join([c async for c in it])


@PROVIDER_KIT.add
async def check_background_process_outlives_its_creator(case: ProviderCase) -> None:
    case.need_shell()
    case.need("background_processes")
    sandbox = await case.sandbox()
    provider_factory = case.import_path
    res = second_process(provider_factory, "spawn", sandbox.id, heartbeat_cmd("bg"))
    assert res["resumed"] is True
    # The creator has exited; the process it started must still be running.
    await assert_beating(sandbox, "bg")
    await assert_beating(sandbox, "bg")


# ------------------------------------------------------------------ files


@PROVIDER_KIT.add
async def check_binary_round_trip(case: ProviderCase) -> None:
    sandbox = await case.sandbox()
    data = bytes(range(256)) * 100 + b"\x00\xff\r\n"
    await sandbox.fs.write("dir/bin.dat", data)
    assert await sandbox.fs.read("dir/bin.dat") == data
    assert await sandbox.fs.read("/workspace/dir/bin.dat") == data
    await sandbox.fs.write("/tmp/t.txt", b"tmp")
    assert await sandbox.fs.read("/tmp/t.txt") == b"tmp"
    if not case.posix_shell:
        return
    r = await sandbox.process.exec("sha256sum dir/bin.dat")
    assert r.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()
    # Files the sandbox writes can be read, and files we write can be changed inside.
    r = await sandbox.process.exec("printf inside > dir/bin.dat && printf new > dir/made")
    assert r.ok, r
    assert await sandbox.fs.read("dir/made") == b"new"
    r = await sandbox.process.exec("cat /tmp/t.txt 2>/dev/null || cat \"$TMPDIR/t.txt\"")
    assert r.stdout == b"tmp"


@PROVIDER_KIT.add
async def check_hundred_megabytes_stream(case: ProviderCase) -> None:
    sandbox = await case.sandbox()
    mb = 1 << 20
    digest = hashlib.sha256()

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(100):
            block = i.to_bytes(4, "big") * (mb // 4)
            digest.update(block)
            yield block

    assert await sandbox.fs.write_stream("big.bin", chunks()) == 100 * mb
    back = hashlib.sha256()
    size = 0
    async for chunk in sandbox.fs.read_stream("big.bin", chunk_size=mb):
        assert len(chunk) <= mb
        size += len(chunk)
        back.update(chunk)
    assert size == 100 * mb and back.hexdigest() == digest.hexdigest()
    assert (await sandbox.fs.stat("big.bin")).size == 100 * mb


@PROVIDER_KIT.add
async def check_list_stat_rename_remove(case: ProviderCase) -> None:
    sandbox = await case.sandbox()
    fs = sandbox.fs
    await fs.mkdir("a/b/c")
    await fs.write("a/one.txt", b"1")
    await fs.write("a/b/two.txt", b"22")
    names = {(i.name, i.type) for i in await fs.list("a")}
    assert names == {("b", "dir"), ("one.txt", "file")}
    info = await fs.stat("a/b/two.txt")
    assert (info.type, info.size, info.path) == ("file", 2, "/workspace/a/b/two.txt")
    await fs.rename("a/one.txt", "a/b/uno.txt")
    assert not await fs.exists("a/one.txt") and await fs.read("a/b/uno.txt") == b"1"
    with raises(OSError):
        await fs.remove("a/b")  # not empty, not recursive
    await fs.remove("a/b/uno.txt")
    assert not await fs.exists("a/b/uno.txt")
    await fs.remove("a", recursive=True)
    assert not await fs.exists("a")
    with raises(FileNotFoundError):
        await fs.read("a/b/two.txt")
    with raises(FileNotFoundError):
        await fs.remove("nothing-here")
    await fs.mkdir("dup", parents=False)
    with raises(FileExistsError):
        await fs.mkdir("dup", parents=False)
    await fs.mkdir("dup")  # parents=True accepts an existing directory


@PROVIDER_KIT.add
async def check_dotdot_and_absolute_paths_cannot_escape(case: ProviderCase) -> None:
    sandbox = await case.sandbox()
    fs = sandbox.fs
    # Host paths outside every sandbox area (/workspace, /tmp, home): a checkout under
    # /tmp would name a path that is legitimately inside the sandbox's own /tmp.
    here = "/usr/bin/env"
    for bad in ("../../../../etc/passwd", "/etc/passwd", here, "/workspace/../etc/hostname",
                "/home/agent/../../etc/passwd", "/"):
        with raises(PathEscapeError):
            await fs.read(bad)
    for bad in ("../escape.txt", "/etc/corral-escape", "/usr/lib/corral-escape",
                "/proc/self/environ"):
        with raises(PathEscapeError):
            await fs.write(bad, b"x")
    assert not os.path.exists("/etc/corral-escape")
    assert not os.path.exists("/usr/lib/corral-escape")
    with raises(PathEscapeError):
        await fs.list("/")
    with raises(PathEscapeError):
        await fs.remove("/workspace")
    with raises(PathEscapeError):
        await fs.rename("/workspace", "/tmp/ws")


@PROVIDER_KIT.add
async def check_fifos_planted_inside_never_block_the_host(case: ProviderCase) -> None:
    """A named pipe the sandbox made is no file to read or write: refused at once
    (opening it would block the host until the sandbox chose to connect)."""
    case.need_shell()
    sandbox = await case.sandbox()
    r = await sandbox.process.exec("mkfifo pipe")
    assert r.ok, r
    with anyio.fail_after(10):
        with raises(OSError):
            await sandbox.fs.read("pipe")
        with raises(OSError):
            await sandbox.fs.write("pipe", b"x")


@PROVIDER_KIT.add
async def check_symlinks_planted_inside_cannot_reach_out(case: ProviderCase) -> None:
    case.need_shell()
    sandbox = await case.sandbox()
    tmp_path = case.scratch
    fs = sandbox.fs
    outside = os.path.join(str(tmp_path), "outside.txt")
    with open(outside, "wb") as fh:
        fh.write(b"host secret")
    os.chmod(str(tmp_path), 0o755)
    os.chmod(outside, 0o644)
    r = await sandbox.process.exec(
        f"ln -s {outside} to_host && ln -s /etc/passwd to_etc && ln -s /etc etcdir && "
        "ln -s ../../../../../../../../etc/passwd rel_up && ln -s / rootdir && "
        f"ln -s {os.path.dirname(outside)} hostdir && "
        "echo fine > real && ln -s real in_rel && ln -s /workspace/real in_abs"
    )
    assert r.ok, r
    for link in ("to_host", "to_etc", "rel_up", "etcdir/passwd", "rootdir/etc/passwd",
                 "hostdir/outside.txt"):
        with raises((PathEscapeError, FileNotFoundError)):
            data = await fs.read(link)
            raise AssertionError(f"read through {link!r} returned {data[:40]!r}")
    for link in ("to_host", "to_etc", "etcdir/corral", "hostdir/outside.txt", "hostdir/new"):
        # Refused, or resolved in the sandbox's own view where the target is absent.
        with raises((PathEscapeError, FileNotFoundError)):
            await fs.write(link, b"pwned")
    with raises(PathEscapeError):
        await fs.list("etcdir")
    with raises((PathEscapeError, FileNotFoundError)):
        await fs.remove("hostdir/outside.txt")
    with raises((PathEscapeError, FileNotFoundError)):
        await fs.rename("hostdir/outside.txt", "stolen")
    with raises((PathEscapeError, FileNotFoundError)):
        await fs.mkdir("hostdir/newdir")
    with open(outside, "rb") as fh:
        assert fh.read() == b"host secret"
    assert not os.path.exists(os.path.join(os.path.dirname(outside), "new"))
    assert not os.path.exists(os.path.join(os.path.dirname(outside), "newdir"))
    # Links that stay inside are fine, and removing a link removes only the link.
    assert await fs.read("in_rel") == b"fine\n"
    assert await fs.read("in_abs") == b"fine\n"
    assert (await fs.stat("to_host")).type == "symlink"
    await fs.remove("to_host")
    with open(outside, "rb") as fh:
        assert fh.read() == b"host secret"


# ------------------------------------------------------------------ lifecycle


@PROVIDER_KIT.add
async def check_resume_from_a_second_process(case: ProviderCase) -> None:
    case.need_shell()
    case.need("durable_filesystem")
    provider = case.provider
    provider_factory = case.import_path
    h = await provider.create()
    try:
        await h.fs.write("note.txt", b"written by the first process")
        res = second_process(provider_factory, "exec", h.id, "cat note.txt; echo more >> note.txt")
        assert res == {"resumed": True, "exit": 0, "out": "written by the first process"}
        assert await h.fs.read("note.txt") == b"written by the first processmore\n"
        again = await provider.resume(h.id)
        assert again is not None and again.id == h.id
        assert h.ref in await provider.list()
    finally:
        await provider.destroy(h.ref)
    assert second_process(provider_factory, "exec", h.id, "true") == {"resumed": False}


@PROVIDER_KIT.add
async def check_destroy_kills_processes_removes_state_and_is_idempotent(case: ProviderCase) -> None:
    provider = case.provider
    h = await provider.create()
    p = None
    if case.posix_shell:
        p = await h.process.spawn(["sh", "-c", "setsid sleep 1000 & exec sleep 1000"])
    await h.fs.write("keep.txt", b"x")
    await provider.destroy(h.ref)
    if p is not None:
        with anyio.fail_after(15):
            r = await p.wait()
            assert not r.ok
            # EOF on stdout means every holder of the pipe is dead, the setsid child too.
            rest = [c async for c in p.stdout]
        assert rest == []
    assert await provider.resume(h.ref) is None
    assert h.ref not in await provider.list()
    await provider.destroy(h.ref)  # again: no error
    await provider.destroy(h.id)
    with raises((SandboxGoneError, FileNotFoundError)):
        await h.process.exec("true")
    with raises(SandboxGoneError):
        await h.fs.read("keep.txt")


@PROVIDER_KIT.add
async def check_missing_capabilities_raise(case: ProviderCase) -> None:
    provider = case.provider
    sandbox = await case.sandbox()
    caps = provider.capabilities
    if not caps.snapshots:
        with raises(UnsupportedCapability):
            await provider.snapshot(sandbox, "x")
    if not caps.ports:
        with raises(UnsupportedCapability):
            await sandbox.connect_port(8080)
    if not caps.host_processes:
        with raises(UnsupportedCapability):
            sandbox.host_command("true")


@PROVIDER_KIT.add
async def check_names(case: ProviderCase) -> None:
    provider = case.provider
    h = await provider.create(SandboxSpec(name="named-sandbox.1"))
    try:
        assert h.id == "named-sandbox.1"
        with raises(CorralError, match="already exists"):
            await provider.create(SandboxSpec(name="named-sandbox.1"))
    finally:
        await provider.destroy(h.ref)
    for bad in ("../x", "a/b", "", "-x", "x" * 65):
        with raises(CorralError):
            await provider.create(SandboxSpec(name=bad))


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


# ------------------------------------------------------------------ host processes


@PROVIDER_KIT.add
async def check_host_command_from_a_detached_process(case: ProviderCase) -> None:
    case.need("host_processes")
    sandbox = await case.sandbox()
    private = sandbox.private_dir
    journal = os.path.join(private, "journal")
    hc = sandbox.host_command(
        "echo line1; echo to-stderr >&2; echo $MARK; exit 5", env={"MARK": "marked"}
    )
    with open(journal, "wb") as out, open(journal + ".err", "wb") as err:
        proc = start_host_command(hc, stdout=out, stderr=err)
    assert proc.wait(timeout=60) == 5
    with open(journal, "rb") as fh:
        assert fh.read() == b"line1\nmarked\n"
    with open(journal + ".err", "rb") as fh:
        assert fh.read() == b"to-stderr\n"


@PROVIDER_KIT.add
async def check_host_command_processes_die_with_the_sandbox(case: ProviderCase) -> None:
    case.need("host_processes")
    provider = case.provider
    h = await provider.create()
    hc = h.host_command(f"setsid sh -c '{heartbeat_cmd('hb')}' & sleep 1000")
    proc = start_host_command(hc, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await assert_beating(h, "hb")
        await provider.destroy(h.ref)
        assert proc.wait(timeout=15) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await provider.destroy(h.ref)


@PROVIDER_KIT.add
async def check_private_dir_is_invisible_inside(case: ProviderCase) -> None:
    case.need("host_processes")
    provider = case.provider
    sandbox = await case.sandbox()
    private = sandbox.private_dir
    marker = "corral-private-" + os.urandom(6).hex()
    with open(os.path.join(private, marker), "w") as fh:
        fh.write("nonce")
    with raises((PathEscapeError, FileNotFoundError)):
        # A host path is read as a sandbox path: refused, or absent in the sandbox.
        await sandbox.fs.read(os.path.join(private, marker))
    if not provider.capabilities.isolated:
        return  # without isolation the guarantee cannot hold; corral says so
    found = await sandbox.process.exec(f"find / -name '{marker}' 2>/dev/null; true")
    assert found.stdout == b""
    cat = await sandbox.process.exec(["cat", os.path.join(private, marker)])
    assert not cat.ok and b"nonce" not in cat.stdout


# ------------------------------------------------------------------ the agent's site


@PROVIDER_KIT.add
async def check_agent_site_launches_probes_and_stops(case: ProviderCase) -> None:
    """Where the provider's durable runs put their supervisor (its agent site,
    :mod:`corral.runs._placement`: on this host, or inside the sandbox) works: a supervised
    command is launched with its secret redacted from the journal, probed running, stopped,
    and probed finished with its signal's exit code."""
    case.need_shell()
    site_kind = placement(case.provider.capabilities)
    if site_kind is None:
        raise CheckSkipped("the provider declares neither host_processes nor "
                           "supervisor_inside: it hosts no supervised agent")
    sandbox = await case.sandbox()
    paths = JournalPaths.for_run(case.scratch / "journals", "kit-site-run")
    site = site_kind.started(sandbox, "kit-site-run", paths, new_nonce(),
                             lambda _name: case.provider)
    secret = "kit-secret-" + os.urandom(8).hex()
    pid = await site.launch(SupervisedCommand(
        ["sh", "-c", 'echo "started $KIT_SECRET"; exec sleep 600'],
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "KIT_SECRET": secret},
        redact={secret: "KIT_SECRET"}))
    assert pid > 0
    try:
        async def started() -> bool:
            await site.refresh()
            return paths.journal.exists() and b"started" in paths.journal.read_bytes()

        await wait_until_async(started, "the command's first line in the journal", timeout=60)
        assert (await site.probe()).state == "producing"
        await site.stop(1.0)

        async def exited() -> bool:
            return (await site.probe()).state == "finished"

        await wait_until_async(exited, "the probe to see the command's exit", timeout=30)
        probe = await site.probe()
        assert probe.exit_code == 128 + signal.SIGTERM, probe
        journal = paths.journal.read_bytes()
        assert secret.encode() not in journal and b"started [REDACTED:KIT_SECRET]" in journal
    finally:
        with anyio.CancelScope(shield=True):
            await site.stop(0.5, supervisor=True)


async def check_provider(
    make_provider: Factory,
    *,
    import_path: str | None = None,
    posix_shell: bool = True,
    only: Iterable[str] | None = None,
) -> KitReport:
    """Run the provider kit (one fresh provider per check); raise
    :class:`~corral.testing.KitFailed` naming every failed check, else return the report
    (its ``skipped`` says which checks the declared capabilities excused)."""
    return await PROVIDER_KIT.verify(make_provider, only=only, import_path=import_path,
                           posix_shell=posix_shell)
