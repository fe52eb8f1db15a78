"""The local provider: a host directory per sandbox and NO ISOLATION.

Commands run directly on the host, as the user running corral, with full access to
everything that user can reach: files, network, other processes. Use it for development
and for trusted commands only; ``corral doctor`` and the capabilities (``isolated=False``,
``network_policy=False``) say so.

Each sandbox is ``$CORRAL_HOME/sandboxes/local/<id>/``; its ``root/workspace``,
``root/tmp`` and ``root/home/agent`` stand in for ``/workspace``, ``/tmp`` and
``/home/agent``. ``create`` makes only the directory, with the sandbox's state in its
``user.corral.state`` attribute (``state.json`` where the filesystem has no such
attributes); the areas and ``private/`` are made by their first use (see ``_localdirs``). The agent's view is mapped as well as it can be without isolation: the
working directory (default ``/workspace``) is translated to the host directory, and
``HOME``, ``TMPDIR``, ``PWD`` and ``CORRAL_WORKSPACE`` point at the host directories.
Literal ``/workspace/...`` paths inside commands are NOT rewritten.

Process trees are killed through their process group and their descendants, which a
double-forking daemon escapes, so ``killable_processes`` is False.

``destroy`` kills every process of the sandbox. Where the host has a cgroup v2 hierarchy
corral may create groups in (with ``cgroup.kill``), each sandbox gets one group that holds
its processes (see ``_cgroups``): destroy kills the group, and a daemon that left its
session by ``setsid`` and a double fork dies with it, without a scan of the host's
processes. corral starts each command inside the group (``clone3`` with
``CLONE_INTO_CGROUP``, see ``_cgspawn``): no moment outside it, and no cgroup move, which
the kernel makes wait for an RCU grace period after an idle moment. Where that cannot be
used (no C compiler, ``clone3`` refused) the command is moved into the group right after it
starts (one write; a program that forks and lets its intermediate exit between its exec
and that write could escape it). A host command's own argv joins the group before it
execs the command. When a move may have lost that race (the command had already forked
or exited when corral moved it) or could not join, the sandbox is marked, and its destroy also kills every
process that carries the sandbox's tag in its environment, which reads the environment of
every process on the host; so does destroy on hosts without such a hierarchy. Neither
holds against a hostile command: the local provider isolates nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import time
from functools import partial
from collections.abc import Mapping
from pathlib import Path

import anyio
import anyio.to_thread

from corral._errors import CorralError
from corral._paths import corral_home
from corral.providers import _cgroups as cgroups
from corral.providers import _cgspawn as cgspawn
from corral.providers import _procscan as procscan
from corral.providers._base import HostDirHandle
from corral.providers._hostfs import HostFS
from corral.providers._localdirs import clear_grave, make_areas, make_private
from corral.providers._snapshots import HostDirSnapshots
from corral.providers._process import (
    Outcome,
    SandboxProcess,
    collect,
    merge_env,
    popen,
    to_argv,
)
from corral.providers._state import (
    SandboxState,
    bury,
    check_env,
    make_sandbox_dir_name,
    mark_destroying,
    new_id,
    provider_root,
    remove_tree,
    state_exists,
    validate_id,
)
from corral.sandbox._redact import Redactor
from corral.sandbox._provider_registry import ProviderConfig
from corral.sandbox._contracts import (
    Capabilities,
    Command,
    ExecResult,
    HostCommand,
    HostRoute,
    ProcessApi,
    SandboxGoneError,
    SandboxRef,
    SandboxSpec,
    SnapshotRef,
    UnsupportedCapability,
)

__all__ = ["LOCAL_CAPABILITIES", "LocalConfig", "LocalHandle", "LocalProvider"]

# Joins the sandbox's cgroup by writing its own pid, then execs the rest of argv; exit
# status 125 when the group is gone (the sandbox is being destroyed).
_JOIN = 'while [ "$1" != -- ]; do echo $$ >"$1" || exit 125; shift; done; shift; exec "$@"'
_UNGROUPED = "ungrouped"

_NO_SPEC = SandboxSpec()  # frozen; create copies what it keeps

LOCAL_CAPABILITIES = Capabilities(
    background_processes=True,
    killable_processes=False,
    writable_stdin=True,
    snapshots=False,
    network_policy=False,
    durable_filesystem=True,
    ports=True,
    isolated=False,
    host_processes=True,
)


class _LocalProcessApi:
    def __init__(self, handle: LocalHandle) -> None:
        self._h = handle

    async def spawn(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> SandboxProcess:
        """Start ``command`` on the host in its own session; stream its output."""
        argv, host_env, host_cwd = self._h._launch(command, cwd, env)
        group = self._h._kill_group()
        try:
            proc = self._h._start(argv, host_env, host_cwd, group)
        except (FileNotFoundError, PermissionError) as exc:
            # Report like a shell would (127 not found, 126 not executable), as the
            # isolated providers do, instead of raising for the command's own problem.
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            script = f'echo "corral: $0: {exc.strerror}" >&2; exit {code}'
            proc = self._h._start(["/bin/sh", "-c", script, argv[0]], host_env, host_cwd, group)
        pid = proc.pid

        async def killer(sig: int) -> None:
            await anyio.to_thread.run_sync(_kill_tree, pid, sig)

        return SandboxProcess(proc, killer=killer, finisher=_finish)

    async def exec(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        """Run to completion. A background job that keeps stdout open delays the result."""
        proc = await self.spawn(command, cwd=cwd, env=env)
        return await collect(proc, stdin=stdin, timeout=timeout)


def _finish(rc: int) -> Outcome:
    if rc < 0:
        sig = -rc
        return Outcome(exit_code=128 + sig, signal=sig, limit_hit="cpu" if sig == signal.SIGXCPU else None)
    return Outcome(exit_code=rc)


def _kill_tree(pid: int, sig: int) -> None:
    # Collect descendants first: once the parent dies they are re-parented and lost.
    pids = procscan.descendants(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    for p in [pid, *pids]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)


class LocalHandle(HostDirHandle):
    """A local sandbox: a host directory. No isolation at all."""

    provider_name = "local"

    def __init__(self, sandbox_dir: Path | str, state: SandboxState) -> None:
        super().__init__(sandbox_dir, state, LOCAL_CAPABILITIES)
        self._process = _LocalProcessApi(self)
        self._group_made = False
        self._areas_made = False
        self._private_made = False

    def _check_alive(self) -> None:
        if not state_exists(self._dir_name):
            raise SandboxGoneError(
                f"sandbox {self.id!r} ({self.provider_name}) no longer exists; create a new one"
            )

    def _areas(self) -> None:
        """Make the writable areas on first use (create made only the state file)."""
        if self._areas_made:
            return
        try:
            make_areas(self._dir_name)
        except (FileNotFoundError, NotADirectoryError):
            raise SandboxGoneError(
                f"sandbox {self.id!r} ({self.provider_name}) no longer exists; create a new one"
            ) from None
        self._areas_made = True

    @property
    def fs(self) -> HostFS:
        self._areas()
        return self._fs

    @property
    def host_root(self) -> str:
        self._areas()
        return super().host_root

    def host_path(self, sandbox_path: str) -> str:
        self._areas()
        return super().host_path(sandbox_path)

    @property
    def private_dir(self) -> str:
        """Host-only directory of this sandbox (made on first use), never visible inside it."""
        if not self._private_made:
            try:
                make_private(self._dir_name)
            except (FileNotFoundError, NotADirectoryError):
                raise SandboxGoneError(
                    f"sandbox {self.id!r} ({self.provider_name}) no longer exists; create a "
                    "new one"
                ) from None
            self._private_made = True
        return super().private_dir

    def _kill_group(self) -> str | None:
        """The sandbox's cgroup (made on first use), or None: then destroy must scan."""
        group = self._state.kill_group
        if not group:
            return None
        if not self._group_made:
            if not cgroups.ensure_kill_group(group):
                self._mark_ungrouped()
                return None
            self._group_made = True
        return group

    def _mark_ungrouped(self) -> None:
        # A process outside the group: destroy must fall back to the tag scan.
        with contextlib.suppress(OSError):
            os.close(os.open(Path(self.private_dir, _UNGROUPED), os.O_WRONLY | os.O_CREAT, 0o600))

    def _start(self, argv: list[str], env: dict[str, str], cwd: str,
               group: str | None) -> subprocess.Popen[bytes]:
        """Start a command in its own session, in the sandbox's group when it has one:
        created there where the host allows it (``_cgspawn``: no move, no moment
        outside), else moved there right after it starts."""
        if group is not None and (spawner := cgspawn.spawner()) is not None:
            try:
                fd = os.open(group, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except FileNotFoundError:
                raise self._gone() from None
            except OSError:
                fd = -1
            if fd >= 0:
                try:
                    return cgspawn.InGroupPopen(argv, spawner=spawner, cgroup_fd=fd, env=env,
                                                cwd=cwd)
                except cgroups.GroupGone:
                    raise self._gone() from None
                except cgspawn.CloneRefused:
                    pass  # clone3 refused here (seccomp, permissions): move it instead
                finally:
                    os.close(fd)
        proc = popen(argv, env=env, cwd=cwd)
        if group is not None:
            self._join(group, proc)
        return proc

    def _gone(self) -> SandboxGoneError:
        # destroy removed the group after our liveness check: the sandbox is gone.
        return SandboxGoneError(
            f"sandbox {self.id!r} ({self.provider_name}) no longer exists; create a new one")

    def _join(self, group: str, proc: subprocess.Popen[bytes]) -> None:
        try:
            if not cgroups.join_kill_group(group, proc.pid):
                self._mark_ungrouped()  # it may have forked before the move: destroy scans
        except cgroups.GroupGone:
            # destroy removed the group after our liveness check: the sandbox is gone.
            _kill_tree(proc.pid, signal.SIGKILL)
            proc.wait()
            raise self._gone() from None
        except OSError:
            self._mark_ungrouped()

    @property
    def process(self) -> ProcessApi:
        return self._process

    async def connect_port(self, port: int) -> str:
        """The sandbox is the host: the port is on the host's loopback."""
        return f"http://127.0.0.1:{int(port)}"

    def _launch(
        self, command: Command, cwd: str | None, env: Mapping[str, str] | None
    ) -> tuple[list[str], dict[str, str], str]:
        self._check_alive()
        check_env(dict(env or {}))
        argv = to_argv(command)
        self._areas()
        sandbox_cwd = self._check_cwd(cwd)
        root = self._files / "root"
        host_cwd = str(root / sandbox_cwd.lstrip("/"))
        base = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": str(root / "home" / "agent"),
            "TMPDIR": str(root / "tmp"),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "CORRAL_WORKSPACE": str(root / "workspace"),
            "CORRAL_SANDBOX_ID": self.id,
        }
        host_env = merge_env(base, self._state.env, env)
        host_env["PWD"] = host_cwd
        host_env[procscan.TOKEN_ENV] = self._state.token
        return argv, host_env, host_cwd

    def host_command(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> HostCommand:
        """The command as a plain host process (no isolation); it joins the sandbox's
        cgroup, if it has one, before it execs the command."""
        argv, host_env, host_cwd = self._launch(command, cwd, env)
        group = self._kill_group()
        if group is None:
            return HostCommand(argv=tuple(argv), env=host_env, cwd=host_cwd)
        procs = os.path.join(group, "cgroup.procs")
        return HostCommand(
            argv=("/bin/sh", "-c", _JOIN, "corral-join", procs, "--", *argv),
            env=host_env, cwd=host_cwd, cgroup_procs=(procs,),
        )


class LocalConfig(ProviderConfig):
    """``[provider]`` settings of the local provider."""

    home: Path | None = None
    """corral's home directory (default ``$CORRAL_HOME``); sandboxes live under it."""


class LocalProvider:
    """Sandboxes that are plain host directories. Gives NO isolation; dev use only.

    A subclass may run under another name: set ``provider_name`` and ``handle_class``
    (a :class:`LocalHandle` subclass with the same ``provider_name``)."""

    config_model: type[ProviderConfig] = LocalConfig
    provider_name = "local"
    handle_class: type[LocalHandle] = LocalHandle

    def __init__(self, home: Path | str | None = None) -> None:
        self._home = Path(home) if home is not None else None
        self._roots: dict[object, Path] = {}

    @property
    def name(self) -> str:
        return self.provider_name

    @property
    def capabilities(self) -> Capabilities:
        return LOCAL_CAPABILITIES

    @property
    def host_route(self) -> HostRoute:
        return "loopback"

    @property
    def base_dir(self) -> Path:
        # Made once per home (corral_home and provider_root cost syscalls on every call);
        # a root removed meanwhile is remade by create (make_sandbox_dir).
        env = os.environ
        key = self._home or (env.get("CORRAL_HOME"), env.get("HOME"))  # what names the home
        root = self._roots.get(key)
        if root is None:
            root = self._roots[key] = provider_root(
                self.provider_name, self._home or corral_home())
        return root

    def fingerprint(self) -> str:
        return hashlib.sha256(f"{self.provider_name}:v1".encode()).hexdigest()

    def snapshotter(self, *, redactor: Redactor | None = None) -> HostDirSnapshots:
        """Snapshots are copies of the sandbox's directories, kept on the host."""
        return HostDirSnapshots(self, redactor=redactor)

    async def create(self, spec: SandboxSpec | None = None) -> LocalHandle:
        spec = spec or _NO_SPEC
        lim = spec.limits
        if any(v is not None for v in (lim.memory_bytes, lim.pids, lim.cpus, lim.disk_bytes)):
            raise UnsupportedCapability(
                self.name, "resource limits", "use the bubblewrap provider to enforce limits"
            )
        if spec.binds:
            raise UnsupportedCapability(
                self.name, "binds", "the local provider sees the host as is; drop the binds"
            )
        sandbox_id = validate_id(spec.name) if spec.name is not None else new_id()
        state = SandboxState.from_spec(sandbox_id, self.name, spec)
        state.limit_mode = "none"
        state.kill_group = cgroups.kill_group_for(f"{self.name}.{sandbox_id}.{state.token}")
        # One mkdir and one setxattr (the state): the areas and private/ are made on first
        # use.
        sandbox_dir = make_sandbox_dir_name(self.base_dir, sandbox_id, private=False)
        try:
            state.save_new(sandbox_dir)
        except BaseException:
            remove_tree(Path(sandbox_dir))
            raise  # last: the sandbox exists once its state does
        return self.handle_class(sandbox_dir, state)

    async def resume(self, ref: SandboxRef | str) -> LocalHandle | None:
        sandbox_id = validate_id(ref.id if isinstance(ref, SandboxRef) else ref)
        sandbox_dir = self.base_dir / sandbox_id
        state = SandboxState.load(sandbox_dir)
        if state is None or state.destroying:
            return None
        root = Path(state.files_dir or sandbox_dir) / "root"
        if root.is_dir() and not (root / "workspace").is_dir():
            return None  # its files were wiped underneath (a never used one has no root/)
        return self.handle_class(sandbox_dir, state)

    async def destroy(self, ref: SandboxRef | str) -> None:
        """Kill the sandbox's processes and delete its directory. Idempotent."""
        sandbox_id = validate_id(ref.id if isinstance(ref, SandboxRef) else ref)
        sandbox_dir = self.base_dir / sandbox_id
        state = SandboxState.load(sandbox_dir)
        destroying = state is None or state.destroying
        if state is not None:
            group = state.kill_group
            scan = not group or os.path.exists(sandbox_dir / "private" / _UNGROUPED)
            # The common case costs no thread and no state rename: a group with nothing
            # left in it is one rmdir, and the directory is buried right after.
            if scan or (group and not cgroups.remove_kill_group_if_empty(group)):
                # Killing takes a while: mark the destroy as begun (resume refuses it, and
                # a destroy interrupted here is finished by the next one).
                mark_destroying(sandbox_dir)
                destroying = True
                if group:
                    await anyio.to_thread.run_sync(_kill_group, state)
                if scan:
                    await anyio.to_thread.run_sync(_kill_tagged, state.token)
        # Gone for everyone once moved aside; its files are deleted before destroy returns:
        # they may hold what the agent wrote (secrets included), and "destroyed" must mean
        # gone from the disk. Only the empty directories corral made (fixed names, no
        # content) may be left to the background digger (see _localdirs).
        grave = bury(sandbox_dir)
        if grave is not None and not clear_grave(grave, destroying=destroying):
            await anyio.to_thread.run_sync(partial(shutil.rmtree, grave, ignore_errors=True))

    async def list(self) -> list[SandboxRef]:
        base = provider_root(self.provider_name, self._home or corral_home())
        return [
            SandboxRef(self.name, p.name)
            for p in sorted(base.iterdir())
            if not p.name.startswith(".") and state_exists(p)
        ]

    async def snapshot(self, handle: object, label: str = "") -> SnapshotRef:
        raise UnsupportedCapability(self.name, "snapshots", "use lifecycle.snapshot, or copy "
                                    "the workspace with handle.fs")

    async def restore(self, snapshot: SnapshotRef, spec: SandboxSpec | None = None) -> LocalHandle:
        raise UnsupportedCapability(self.name, "snapshots", "use lifecycle.snapshot, or copy "
                                    "the workspace with handle.fs")


def _kill_group(state: SandboxState) -> None:
    if not cgroups.kill_group(state.kill_group):
        raise CorralError(
            f"could not stop every process of sandbox {state.id!r}; run "
            f"`corral sandboxes rm {state.id}` again"
        )


def _kill_tagged(token: str) -> None:
    for _ in range(50):  # a process may fork while we kill; repeat until none is left
        pids = procscan.tagged(token)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
