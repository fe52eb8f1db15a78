"""The sandbox contract (DESIGN §2): what every provider and handle offers.

Code above this layer branches on :class:`Capabilities`, never on a provider's name.
Calling something a provider lacks raises :class:`UnsupportedCapability`.
"""

from __future__ import annotations

import re
import signal as _signal
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal, Protocol, runtime_checkable

from corral._errors import ConfigError, CorralError
from corral.journal._sentinel import TIMEOUT_EXIT_CODE

__all__ = [
    "Capabilities",
    "Command",
    "DEFAULT_PROVIDER",
    "DefaultLimits",
    "Described",
    "ExecResult",
    "FileInfo",
    "FileSystem",
    "Handle",
    "HostCommand",
    "HostPaths",
    "HostRoute",
    "PathEscapeError",
    "Process",
    "ProcessApi",
    "Provider",
    "PrunesOrphans",
    "ResourceLimits",
    "SandboxGoneError",
    "SandboxDirs",
    "SandboxIds",
    "SandboxRef",
    "SandboxSpec",
    "SnapshotRef",
    "TIMEOUT_EXIT_CODE",
    "UnsupportedCapability",
    "check_env_name",
    "signal_name",
]

Command = str | Sequence[str]
"""A shell string (run with ``/bin/sh -c``) or an argv list (run directly)."""

DEFAULT_PROVIDER: Final = "bubblewrap"
"""The provider of a sandbox that names none: a definition without ``[provider]``, a
``RunRequest``, ``corral run``, ``exec`` and ``acp`` without ``--provider``, the server's
inline sandboxes."""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_env_name(name: object, what: str = "environment variable") -> str:
    """Return ``name`` if it is a POSIX environment variable name (letters, digits and
    ``_``, not starting with a digit), else raise :class:`~corral._errors.ConfigError`.

    Every variable given for a sandbox (``SandboxSpec.env``, ``exec(env=...)``, secrets,
    ``corral exec --env``) must pass: such names reach the sandboxed command only, never a
    host process, and a name a shell cannot even export is a mistake worth naming.
    """
    if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
        raise ConfigError(
            f"invalid {what} name {name!r}: use letters, digits and '_', not starting with "
            "a digit (POSIX)"
        )
    return name


def signal_name(signum: int) -> str:
    """Return the symbolic name of a signal number (``SIGKILL``), or ``SIG<n>``."""
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


class UnsupportedCapability(CorralError):
    """A provider was asked for something it does not offer.

    Carries the provider's name, the capability, and a hint naming what to use instead.
    """

    def __init__(self, provider: str, capability: str, hint: str = "") -> None:
        self.provider = provider
        self.capability = capability
        self.hint = hint
        msg = f"provider {provider!r} does not support {capability!r}"
        super().__init__(f"{msg}: {hint}" if hint else msg)


class PathEscapeError(CorralError, PermissionError):
    """A filesystem path would resolve outside the sandbox (``..``, absolute, symlink)."""


class SandboxGoneError(CorralError):
    """The sandbox behind a handle no longer exists (destroyed, or wiped underneath)."""

    code = "sandbox_gone"
    """What a run that ends for this reason records as its error's code."""

    @classmethod
    def of(cls, provider: str, sandbox_id: str, why: str) -> SandboxGoneError:
        """The error naming the provider and the sandbox (a docker container by its name),
        never a host path; ``why`` says what was lost."""
        what = _GONE_KIND.get(provider, f"{provider} sandbox")
        name = f"corral-{sandbox_id}" if provider == "docker" else sandbox_id
        return cls(f"the sandbox is gone ({what} {name}): {why}")


_GONE_KIND = {"docker": "docker container", "bubblewrap": "bubblewrap sandbox",
              "local": "local sandbox"}


@dataclass(frozen=True, slots=True)
class Capabilities:
    """Declared booleans that callers branch on. A provider must be honest about each."""

    background_processes: bool = False
    """Processes started with ``spawn`` outlive the host process that started them."""
    killable_processes: bool = False
    """``Process.kill`` reaches the whole tree, grandchildren included."""
    writable_stdin: bool = False
    """``Process.write_stdin`` / ``close_stdin`` work on spawned processes."""
    snapshots: bool = False
    """``Provider.snapshot`` / ``Provider.restore`` are implemented."""
    network_policy: bool = False
    """The sandbox has no network unless policy grants egress (through the proxy)."""
    durable_filesystem: bool = False
    """The sandbox's files survive the host process; ``resume`` from another process works."""
    ports: bool = False
    """``Handle.connect_port`` gives a host-reachable URL for a port inside the sandbox."""
    isolated: bool = False
    """Processes are isolated from the host (namespaces, containers, VMs). False for local."""
    host_processes: bool = False
    """``Handle.host_command`` and ``Handle.private_dir`` work: a separate host process (not a
    child of this Python process) can run a command inside the sandbox, and the handle has a
    host-side directory the sandbox cannot see (for journals and nonces). Container and cloud
    providers say no."""
    supervisor_inside: bool = False
    """Durable runs' supervisors run inside the sandbox, reached through the provider's API
    (the handle is a :class:`corral.sandbox._inside.InsideSupervisor`): container providers,
    whose sandboxes outlive every host."""


@dataclass(frozen=True, slots=True)
class ResourceLimits:
    """Limits applied to everything running in one sandbox. ``None`` means no limit."""

    memory_bytes: int | None = None
    pids: int | None = None
    cpus: float | None = None
    disk_bytes: int | None = None
    """Space the sandbox's files (workspace, home, /tmp) may take on the host's disk. A
    provider that cannot enforce it refuses a spec that sets it (never ignores it)."""


HostRoute = Literal["loopback", "unix-socket", "docker-gateway", "none"]


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """What to create. Providers ignore fields that do not apply to them."""

    name: str | None = None
    """Sandbox id to use; generated when ``None``. Must match ``[A-Za-z0-9_.-]{1,64}``."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment every process in the sandbox starts with."""
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    network: bool = False
    """Whether the sandbox gets egress at all (the default is no network)."""
    binds: Sequence[tuple[str, str]] = ()
    """Extra read-only host path -> sandbox path binds (agent CLIs, unix sockets)."""
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SandboxRef:
    """Enough to find a sandbox again from any process: provider name and sandbox id."""

    provider: str
    id: str


@dataclass(frozen=True, slots=True)
class SnapshotRef:
    provider: str
    id: str
    label: str = ""


@dataclass(frozen=True, slots=True)
class ExecResult:
    """The outcome of a finished command.

    ``exit_code`` is the process's exit status; a death by signal is reported as
    ``128 + N`` with ``signal`` set, so it is never mistaken for success.
    """

    exit_code: int
    stdout: bytes
    stderr: bytes
    signal: int | None = None
    timed_out: bool = False
    limit_hit: str | None = None
    """Which resource limit killed or failed the command (``memory``, ``pids``, ``cpu``,
    ``disk``), if known."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.signal is None and not self.timed_out

    @property
    def signal_name(self) -> str | None:
        return signal_name(self.signal) if self.signal is not None else None

    def describe(self) -> str:
        """A one-line human description of how the command ended."""
        if self.timed_out:
            return "timed out"
        # A limit may kill (memory: SIGKILL) or only refuse (pids: "Cannot fork", then
        # whatever exit status the command chose): name it either way.
        extra = f" (the sandbox's {self.limit_hit} limit was reached)" if self.limit_hit else ""
        if self.signal is not None:
            return f"killed by {signal_name(self.signal)}{extra}"
        return f"exit code {self.exit_code}{extra}"


@dataclass(frozen=True, slots=True)
class HostCommand:
    """How a separate host process runs a command inside a sandbox (capability
    ``host_processes``).

    The launcher (for example the durable-run supervisor) execs ``argv`` with exactly
    ``env`` as its environment (``cwd`` is the host directory to start in; ``None`` means
    any). ``argv`` is self-contained: it joins the sandbox's cgroups (listed in
    ``cgroup_procs`` for information; the argv writes its own pid there before it
    enters the sandbox), drops privileges and enters the sandbox's namespaces, so
    ``destroy`` and the resource limits cover it. Redirect its stdout/stderr to files in
    ``Handle.private_dir`` to keep them out of the sandbox's reach. Secrets and every
    other variable given for the command travel in ``stdin_prefix``, not in ``env``.

    The exit status of ``argv`` is the command's, with a death by signal ``N`` reported
    as exit status ``128 + N``. The process must be started in its own session
    (``setsid``) if it should survive the launcher's terminal.
    """

    argv: tuple[str, ...]
    env: Mapping[str, str]
    """The launcher's own environment: fixed by the provider, never user-controlled."""
    cwd: str | None = None
    cgroup_procs: tuple[str, ...] = ()
    stdin_prefix: bytes = field(default=b"", repr=False)
    """Bytes to write to the process's stdin before anything else (the sandboxed
    command's environment, which reaches it inside the sandbox only). Give the process a
    stdin pipe whenever this is not empty, even if the command reads no input."""


@dataclass(frozen=True, slots=True)
class FileInfo:
    path: str
    """Path relative to the sandbox root as the caller named it (normalized)."""
    name: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mtime: float
    mode: int


@runtime_checkable
class Process(Protocol):
    """A running process in a sandbox. stdout/stderr are separate async byte streams."""

    @property
    def pid(self) -> int | None: ...

    @property
    def stdout(self) -> AsyncIterator[bytes]: ...

    @property
    def stderr(self) -> AsyncIterator[bytes]: ...

    async def write_stdin(self, data: bytes) -> None: ...

    async def close_stdin(self) -> None: ...

    async def wait(self) -> ExecResult:
        """Wait for exit. ``stdout``/``stderr`` in the result are empty when streamed."""
        ...

    async def kill(self, sig: int = _signal.SIGKILL) -> None:
        """Signal the whole process tree (grandchildren included when killable)."""
        ...


class ProcessApi(Protocol):
    async def exec(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        """Run to completion and collect output. A timeout kills the whole tree."""
        ...

    async def spawn(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Process:
        """Start a process and return at once; stream its output."""
        ...


class FileSystem(Protocol):
    """Byte-level file access confined to the sandbox.

    Relative paths are relative to the handle's workdir; absolute paths are sandbox paths
    (``/workspace/x``). Nothing may resolve outside the sandbox's writable areas:
    ``..`` and symlinks that point out raise :class:`PathEscapeError`.
    """

    async def read(self, path: str) -> bytes: ...

    async def write(self, path: str, data: bytes, *, mode: int | None = None) -> None: ...

    def read_stream(self, path: str, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        """Stream a file's bytes without loading it whole."""
        ...

    async def write_stream(self, path: str, chunks: AsyncIterator[bytes]) -> int:
        """Write a file from a stream of chunks; return the byte count."""
        ...

    async def list(self, path: str = ".") -> list[FileInfo]: ...

    async def stat(self, path: str) -> FileInfo: ...

    async def exists(self, path: str) -> bool: ...

    async def mkdir(self, path: str, *, parents: bool = True) -> None: ...

    async def remove(self, path: str, *, recursive: bool = False) -> None: ...

    async def rename(self, src: str, dst: str) -> None: ...


@runtime_checkable
class Handle(Protocol):
    """A live sandbox."""

    @property
    def id(self) -> str: ...

    @property
    def ref(self) -> SandboxRef: ...

    @property
    def workdir(self) -> str:
        """The agent's view of the workspace, ``/workspace`` by default."""
        ...

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def process(self) -> ProcessApi: ...

    @property
    def fs(self) -> FileSystem: ...

    async def connect_port(self, port: int) -> str:
        """A host-reachable URL for ``port`` inside the sandbox (capability ``ports``)."""
        ...

    @property
    def private_dir(self) -> str:
        """A host directory that belongs to this sandbox but is not visible inside it
        (capability ``host_processes``). It is removed with the sandbox."""
        ...

    def host_command(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> HostCommand:
        """Describe how a separate host process runs ``command`` in this sandbox
        (capability ``host_processes``); ``cwd`` and ``env`` as for ``process.exec``."""
        ...


@runtime_checkable
class Provider(Protocol):
    """Creates, finds and destroys sandboxes of one kind."""

    @property
    def name(self) -> str: ...

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def host_route(self) -> HostRoute:
        """How a process in the sandbox reaches the host."""
        ...

    def fingerprint(self) -> str:
        """A stable digest of the provider's configuration (image, limits, …).

        It goes into the instance key so that a changed configuration gets a new sandbox.
        """
        ...

    async def create(self, spec: SandboxSpec | None = None) -> Handle: ...

    async def resume(self, ref: SandboxRef | str) -> Handle | None:
        """Reattach to an existing sandbox, from any process; ``None`` when it is gone."""
        ...

    async def destroy(self, ref: SandboxRef | str) -> None:
        """Kill every process of the sandbox and delete it. Idempotent."""
        ...

    async def list(self) -> list[SandboxRef]: ...

    async def snapshot(self, handle: Handle, label: str = "") -> SnapshotRef:
        """Capability ``snapshots``; raises :class:`UnsupportedCapability` otherwise."""
        ...

    async def restore(self, snapshot: SnapshotRef, spec: SandboxSpec | None = None) -> Handle:
        """Capability ``snapshots``; raises :class:`UnsupportedCapability` otherwise."""
        ...


# ---------------------------------------------------------------------- optional capabilities
# Code checks these with isinstance, never by probing attributes.


@runtime_checkable
class HostPaths(Protocol):
    """Optional handle capability: the sandbox's files are a host directory, so host code
    (file watchers, the file feed) reads them directly."""

    def host_path(self, sandbox_path: str) -> str:
        """The host path behind ``sandbox_path`` (lexically, not resolved)."""
        ...


@runtime_checkable
class Described(Protocol):
    """Optional handle capability: what the sandbox was created with."""

    @property
    def created_at(self) -> float: ...

    @property
    def labels(self) -> Mapping[str, str]: ...

    @property
    def binds(self) -> Sequence[tuple[str, str]]:
        """The read-only host path -> sandbox path binds of its spec."""
        ...


@runtime_checkable
class SandboxIds(Protocol):
    """Optional handle capability: the host ids the sandbox's processes run with, so that
    the unix sockets corral binds in for a run open to them and to nobody else."""

    async def host_gid(self) -> int | None:
        """The host gid of the sandbox's processes (the gid they reach host unix sockets
        with); ``None`` when it is not known (a remapped or remote container): then the
        run's token alone guards the run's sockets."""
        ...


@runtime_checkable
class DefaultLimits(Protocol):
    """Optional provider capability: the limits a sandbox gets where its spec leaves one
    ``None``."""

    @property
    def default_limits(self) -> ResourceLimits: ...


@runtime_checkable
class SandboxDirs(Protocol):
    """Optional provider capability: its sandboxes are directories of this host under
    ``base_dir`` (``$CORRAL_HOME/sandboxes/<provider>``, one per sandbox id), so an unlabelled
    sandbox is this home's, and a half-made one is found by its directory."""

    @property
    def base_dir(self) -> Path: ...


@runtime_checkable
class PrunesOrphans(Protocol):
    """Optional provider capability: destroy the sandboxes whose state vanished (e.g. a
    deleted ``$CORRAL_HOME``) — ``corral sandboxes prune``."""

    async def prune_orphans(self) -> list[str]:
        """Destroy them; return what was removed (for the user to read)."""
        ...
