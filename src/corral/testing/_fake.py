"""``FakeProvider``: an in-memory sandbox provider that is honest about what it cannot do.

Files live in memory (per provider object), commands are answered by a function you give
(and a few built-ins), and nothing runs on the host. It declares no capability at all: no
isolation, no network policy, no background or killable processes, no writable stdin, no
snapshots, no ports, no host processes, no durable filesystem (another process cannot
resume its sandboxes). Everything it lacks raises
:class:`~corral.sandbox._contracts.UnsupportedCapability`, and it passes
:func:`corral.testing.check_provider` for everything it claims (run the kit with
``posix_shell=False``: it runs no shell)::

    def answer(cmd: FakeCommand) -> ExecResult | None:
        if cmd.argv[:1] == ["git"]:
            return ExecResult(0, b"ok\\n", b"")
        return None                       # fall through to the built-ins

    provider = FakeProvider(answer)

Built-in commands: ``true``, ``false``, ``echo ARGS``, ``cat [FILES]`` (stdin when none),
``pwd``. An unknown command exits 127, as a shell says "command not found". A command given
as a string is split like a shell word list; shell syntax (pipes, ``;``, redirections,
``$``) is refused with ``UnsupportedCapability``.
"""

from __future__ import annotations

import errno
import hashlib
import inspect
import itertools
import posixpath
import re
import shlex
import signal as _signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import anyio
import anyio.lowlevel

from corral._errors import ConfigError
from corral.sandbox._contracts import (
    TIMEOUT_EXIT_CODE,
    Capabilities,
    Command,
    ExecResult,
    FileInfo,
    FileSystem,
    HostCommand,
    HostRoute,
    PathEscapeError,
    SandboxGoneError,
    SandboxRef,
    SandboxSpec,
    SnapshotRef,
    UnsupportedCapability,
    check_env_name,
)

__all__ = ["FAKE_CAPABILITIES", "FakeCommand", "FakeHandle", "FakeProvider"]

FAKE_CAPABILITIES = Capabilities()
"""Every capability false: the fake promises only the core contract (files, exec)."""

WORKDIR = "/workspace"
_AREAS = ("/workspace", "/tmp", "/home/agent")
"""The sandbox's writable areas; any other path is outside the sandbox."""
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_SHELL_SYNTAX = re.compile(r"[;&|<>$`(){}*?\[\]\n]")


@dataclass(frozen=True)
class FakeCommand:
    """One command as a :class:`FakeProvider` handler sees it."""

    argv: list[str]
    cwd: str
    """Absolute sandbox path of the working directory."""
    env: dict[str, str]
    stdin: bytes
    fs: FileSystem
    """The sandbox's files, to read or change as the command would."""


Handler = Callable[[FakeCommand], "ExecResult | None | Awaitable[ExecResult | None]"]
"""Answers a command, or returns ``None`` to leave it to the built-ins."""


@dataclass
class _Node:
    type: Literal["file", "dir"]
    data: bytes = b""
    mtime: float = field(default_factory=time.time)
    mode: int = 0o644


class _FakeFs:
    """Byte-level files in memory, confined to the sandbox's areas."""

    def __init__(self, sandbox: _FakeSandbox) -> None:
        self._sandbox = sandbox
        self._nodes: dict[str, _Node] = {a: _Node("dir", mode=0o755) for a in _AREAS}

    # -- paths

    def resolve(self, path: str) -> str:
        """The absolute sandbox path for ``path``; :class:`PathEscapeError` outside."""
        self._sandbox.check_alive()
        if "\x00" in path:
            raise PathEscapeError(f"path {path!r} holds a NUL byte")
        full = posixpath.normpath(posixpath.join(WORKDIR, path))
        if not any(full == a or full.startswith(a + "/") for a in _AREAS):
            raise PathEscapeError(f"path {path!r} resolves to {full}, outside the sandbox")
        return full

    def _inner(self, path: str) -> str:
        """Like :meth:`resolve`, refusing an area's root (it cannot be removed or moved)."""
        full = self.resolve(path)
        if full in _AREAS:
            raise PathEscapeError(f"{full} is a root of the sandbox; it cannot be changed")
        return full

    def _node(self, full: str) -> _Node:
        node = self._nodes.get(full)
        if node is None:
            raise FileNotFoundError(errno.ENOENT, "no such file or directory", full)
        return node

    def _children(self, full: str) -> list[str]:
        prefix = full + "/"
        return [p for p in self._nodes if p.startswith(prefix) and "/" not in p[len(prefix):]]

    def _need_parent(self, full: str, make: bool) -> None:
        parent = posixpath.dirname(full)
        node = self._nodes.get(parent)
        if node is None:
            if not make:
                raise FileNotFoundError(errno.ENOENT, "no such directory", parent)
            self._need_parent(parent, make)
            self._nodes[parent] = _Node("dir", mode=0o755)
        elif node.type != "dir":
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", parent)

    def is_dir(self, full: str) -> bool:
        node = self._nodes.get(full)
        return node is not None and node.type == "dir"

    # -- the FileSystem protocol

    async def read(self, path: str) -> bytes:
        full = self.resolve(path)
        node = self._node(full)
        if node.type != "file":
            raise IsADirectoryError(errno.EISDIR, "is a directory", full)
        return node.data

    async def write(self, path: str, data: bytes, *, mode: int | None = None) -> None:
        full = self._inner(path)
        if self.is_dir(full):
            raise IsADirectoryError(errno.EISDIR, "is a directory", full)
        self._need_parent(full, make=True)
        self._nodes[full] = _Node("file", bytes(data), mode=mode if mode is not None else 0o644)

    async def read_stream(self, path: str, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        data = await self.read(path)
        for start in range(0, len(data), chunk_size):
            yield data[start:start + chunk_size]
            await anyio.lowlevel.checkpoint()

    async def write_stream(self, path: str, chunks: AsyncIterator[bytes]) -> int:
        parts = [bytes(c) async for c in chunks]
        data = b"".join(parts)
        await self.write(path, data)
        return len(data)

    async def list(self, path: str = ".") -> list[FileInfo]:
        full = self.resolve(path)
        if self._node(full).type != "dir":
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", full)
        return [self._info(child) for child in sorted(self._children(full))]

    def _info(self, full: str) -> FileInfo:
        node = self._node(full)
        size = len(node.data) if node.type == "file" else 0
        return FileInfo(full, posixpath.basename(full), node.type, size, node.mtime, node.mode)

    async def stat(self, path: str) -> FileInfo:
        return self._info(self.resolve(path))

    async def exists(self, path: str) -> bool:
        return self.resolve(path) in self._nodes

    async def mkdir(self, path: str, *, parents: bool = True) -> None:
        full = self.resolve(path)
        node = self._nodes.get(full)
        if node is not None:
            if parents and node.type == "dir":
                return
            raise FileExistsError(errno.EEXIST, "file exists", full)
        self._need_parent(full, make=parents)
        self._nodes[full] = _Node("dir", mode=0o755)

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        full = self._inner(path)
        node = self._node(full)
        if node.type == "dir":
            below = [p for p in self._nodes if p.startswith(full + "/")]
            if below and not recursive:
                raise OSError(errno.ENOTEMPTY, "directory not empty", full)
            for p in below:
                del self._nodes[p]
        del self._nodes[full]

    async def rename(self, src: str, dst: str) -> None:
        old, new = self._inner(src), self._inner(dst)
        self._node(old)
        if new == old or new.startswith(old + "/"):
            raise OSError(errno.EINVAL, "cannot move a directory into itself", new)
        self._need_parent(new, make=False)
        moved = {p: n for p, n in self._nodes.items() if p == old or p.startswith(old + "/")}
        for p in moved:
            del self._nodes[p]
        for p, n in moved.items():
            self._nodes[new + p[len(old):]] = n


class _FakeProcess:
    """A spawned command. It runs to completion at once (nothing runs in the background);
    its output is then streamed. No writable stdin."""

    def __init__(self, provider: str, result: ExecResult) -> None:
        self._provider = provider
        self._result = result

    @property
    def pid(self) -> int | None:
        return None

    @property
    def stdout(self) -> AsyncIterator[bytes]:
        return _once(self._result.stdout)

    @property
    def stderr(self) -> AsyncIterator[bytes]:
        return _once(self._result.stderr)

    async def write_stdin(self, data: bytes) -> None:
        raise UnsupportedCapability(self._provider, "writable_stdin", "pass stdin to exec()")

    async def close_stdin(self) -> None:
        raise UnsupportedCapability(self._provider, "writable_stdin", "pass stdin to exec()")

    async def wait(self) -> ExecResult:
        r = self._result
        return ExecResult(r.exit_code, b"", b"", r.signal, r.timed_out, r.limit_hit)

    async def kill(self, sig: int = _signal.SIGKILL) -> None:
        """The command has already finished: there is nothing left to signal."""


async def _once(data: bytes) -> AsyncIterator[bytes]:
    if data:
        yield data


class _FakeProcessApi:
    def __init__(self, sandbox: _FakeSandbox) -> None:
        self._sandbox = sandbox

    async def exec(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        sb = self._sandbox
        sb.check_alive()
        argv = _argv(sb.provider_name, command)
        where = sb.fs.resolve(cwd or ".")
        if not sb.fs.is_dir(where):
            raise ConfigError(f"working directory {cwd!r} does not exist in the sandbox")
        full_env = dict(sb.spec.env)
        for name, value in (env or {}).items():
            full_env[check_env_name(name)] = value
        cmd = FakeCommand(argv, where, full_env, stdin or b"", sb.fs)
        with anyio.move_on_after(timeout) as scope:
            return await sb.answer(cmd)
        assert scope.cancelled_caught
        return ExecResult(TIMEOUT_EXIT_CODE, b"", b"", timed_out=True)

    async def spawn(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> _FakeProcess:
        return _FakeProcess(self._sandbox.provider_name,
                            await self.exec(command, cwd=cwd, env=env))


def _argv(provider: str, command: Command) -> list[str]:
    if isinstance(command, str):
        if _SHELL_SYNTAX.search(command):
            raise UnsupportedCapability(
                provider, "shell syntax", "give an argv list; the fake provider runs no shell")
        argv = shlex.split(command)
    else:
        argv = [str(a) for a in command]
    if not argv:
        raise ConfigError("empty command: give a program to run")
    return argv


class _FakeSandbox:
    def __init__(self, provider: FakeProvider, sandbox_id: str, spec: SandboxSpec) -> None:
        self.provider_name = provider.name
        self.id = sandbox_id
        self.spec = spec
        self.alive = True
        self.fs = _FakeFs(self)
        self._handler = provider.handler

    def check_alive(self) -> None:
        if not self.alive:
            raise SandboxGoneError(f"sandbox {self.id!r} was destroyed")

    async def answer(self, cmd: FakeCommand) -> ExecResult:
        if self._handler is not None:
            got = self._handler(cmd)
            if inspect.isawaitable(got):
                got = await got
            if got is not None:
                return got
        return await _builtin(cmd)


async def _builtin(cmd: FakeCommand) -> ExecResult:
    name, args = cmd.argv[0], cmd.argv[1:]
    if name == "true":
        return ExecResult(0, b"", b"")
    if name == "false":
        return ExecResult(1, b"", b"")
    if name == "echo":
        return ExecResult(0, " ".join(args).encode() + b"\n", b"")
    if name == "pwd":
        return ExecResult(0, cmd.cwd.encode() + b"\n", b"")
    if name == "cat":
        if not args:
            return ExecResult(0, cmd.stdin, b"")
        out, err, code = b"", b"", 0
        for arg in args:
            try:
                out += await cmd.fs.read(posixpath.join(cmd.cwd, arg))
            except (OSError, PathEscapeError) as exc:
                err += f"cat: {arg}: {exc.strerror or exc}\n".encode()
                code = 1
        return ExecResult(code, out, err)
    return ExecResult(127, b"", f"{name}: command not found\n".encode())


class FakeHandle:
    """A :class:`FakeProvider` sandbox."""

    def __init__(self, sandbox: _FakeSandbox) -> None:
        self._sb = sandbox
        self._process = _FakeProcessApi(sandbox)

    @property
    def id(self) -> str:
        return self._sb.id

    @property
    def ref(self) -> SandboxRef:
        return SandboxRef(self._sb.provider_name, self._sb.id)

    @property
    def workdir(self) -> str:
        return WORKDIR

    @property
    def capabilities(self) -> Capabilities:
        return FAKE_CAPABILITIES

    @property
    def process(self) -> _FakeProcessApi:
        return self._process

    @property
    def fs(self) -> _FakeFs:
        return self._sb.fs

    async def connect_port(self, port: int) -> str:
        raise UnsupportedCapability(self._sb.provider_name, "ports",
                                    "the fake provider runs no servers")

    @property
    def private_dir(self) -> str:
        raise UnsupportedCapability(self._sb.provider_name, "host_processes",
                                    "the fake provider has no host-side directory")

    def host_command(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> HostCommand:
        raise UnsupportedCapability(self._sb.provider_name, "host_processes",
                                    "use process.exec(); nothing runs on the host")


class FakeProvider:
    """An in-memory provider for tests (see the module docstring). ``handler`` answers
    commands (``None`` from it falls through to the built-ins); ``name`` is the provider
    name sandbox refs carry."""

    def __init__(self, handler: Handler | None = None, *, name: str = "fake") -> None:
        self.handler = handler
        self._name = name
        self._sandboxes: dict[str, _FakeSandbox] = {}
        self._ids = itertools.count(1)

    @property
    def name(self) -> str:
        return self._name

    @property
    def capabilities(self) -> Capabilities:
        return FAKE_CAPABILITIES

    @property
    def host_route(self) -> HostRoute:
        return "none"

    def fingerprint(self) -> str:
        return hashlib.sha256(f"fake:{self._name}".encode()).hexdigest()

    async def create(self, spec: SandboxSpec | None = None) -> FakeHandle:
        spec = spec or SandboxSpec()
        for name in spec.env:
            check_env_name(name)
        if spec.name is None:
            sandbox_id = f"fake-{next(self._ids)}"
            while sandbox_id in self._sandboxes:
                sandbox_id = f"fake-{next(self._ids)}"
        else:
            sandbox_id = spec.name
            if not _ID_RE.match(sandbox_id):
                raise ConfigError(
                    f"invalid sandbox name {sandbox_id!r}: use 1-64 letters, digits, '_', '.' "
                    "or '-', starting with a letter or digit")
            if sandbox_id in self._sandboxes:
                raise ConfigError(f"sandbox {sandbox_id!r} already exists: pick another name")
        sandbox = _FakeSandbox(self, sandbox_id, spec)
        self._sandboxes[sandbox_id] = sandbox
        return FakeHandle(sandbox)

    def _id(self, ref: SandboxRef | str) -> str:
        return ref.id if isinstance(ref, SandboxRef) else ref

    async def resume(self, ref: SandboxRef | str) -> FakeHandle | None:
        sandbox = self._sandboxes.get(self._id(ref))
        return FakeHandle(sandbox) if sandbox is not None else None

    async def destroy(self, ref: SandboxRef | str) -> None:
        sandbox = self._sandboxes.pop(self._id(ref), None)
        if sandbox is not None:
            sandbox.alive = False

    async def list(self) -> list[SandboxRef]:
        return [SandboxRef(self._name, i) for i in self._sandboxes]

    async def snapshot(self, handle: object, label: str = "") -> SnapshotRef:
        raise UnsupportedCapability(self._name, "snapshots", "the fake provider keeps none")

    async def restore(self, snapshot: SnapshotRef, spec: SandboxSpec | None = None) -> FakeHandle:
        raise UnsupportedCapability(self._name, "snapshots", "the fake provider keeps none")
