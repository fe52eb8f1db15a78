"""The bubblewrap provider: the default isolated provider on Linux.

A sandbox is a host state directory (``$CORRAL_HOME/sandboxes/bubblewrap/<id>``) plus,
where the machine has them, cgroups that hold its limits, and (from its first command on)
its agent: one long-lived process that starts its commands, each one request over a unix
socket (:mod:`corral.providers._bwrap_agent`; ``agent=False``, or a host where the agent
cannot start, takes the launcher chain below for every command: ``corral doctor`` says
which). The agent is started exactly as a command is, below; its sandbox, and so each
command's, is one ``bwrap`` invocation over the state directory, with

* new user, pid, ipc, uts, net and cgroup namespaces (``--unshare-all``), no further user
  namespaces inside (``--disable-userns``), a new session;
* the system (``/usr``, ``/etc`` and the merged-usr links) bound read-only, a fresh
  ``/proc`` and a minimal ``/dev``; nothing else of the host (no ``/home``, ``/root``,
  ``/run``, ``/sys``, no project checkout);
* private writable ``/workspace``, ``/tmp`` and ``/home/agent`` (``HOME``) bound from the
  state directory's ``root/``; ``private/`` is never mounted (journals live there);
* the command running as uid/gid 1000 (``agent``) inside, which is an unprivileged host
  uid outside when corral runs as root (``host_uid``, default 1000000000), so the
  read-only system's root-only files (``/etc/shadow``) stay unreadable;
* no network at all unless the spec asks for it (``--share-net``);
* memory, pids and CPU limits on the sandbox's cgroup v1 groups, which every process of
  the sandbox is born in (corral moves the launcher into them before bwrap forks the
  sandbox, see "How a command starts" below); without usable cgroups, rlimits via ``prlimit`` (per process,
  weaker; ``corral doctor`` says which one is in force);
* a disk limit when corral runs as root: the writable areas are a quota-limited btrfs
  subvolume in corral's own pool (:mod:`corral.providers._diskquota`).

How a command (or the agent) starts on the launcher chain: corral starts the launcher, which is ``bwrap``
behind the uid drop (when corral runs as root: the sandbox's host uid and gid, no
supplementary groups, no_new_privs; corral's own compiled launcher, built and cached with
the init by :mod:`corral.providers._bwrap_init`, or ``setpriv`` where there is no C
compiler) and, in the rlimit mode, ``prlimit``; each execs the
next, so it is one process throughout. bwrap gets its options over a pipe (``--args FD``):
it sets no_new_privs first thing, then reads that pipe to its end before it does anything
else, so until corral closes the pipe the launcher is one process that has forked nothing.
Meanwhile corral writes its pid to the sandbox's ``cgroup.procs`` files, then sends the
options. bwrap forks the sandbox's init only after that, so the init and everything it
starts are born in the cgroups, and its cgroup namespace's root is the sandbox's own group
(the sandbox sees ``/``, not corral's group names). bwrap closes the options pipe, so the
command inherits none of it. Three programs per command: the launcher, ``bwrap``, the
init (no ``sh`` to join the cgroups any more), the first and last small static programs.
Popen's own ``user``/``group``/``extra_groups`` could replace the launcher, but they make
CPython ``fork`` (not ``vfork``) the whole Python process, and that costs more than an
exec does (measured: docs/benchmarks.md, #17 launcher chain). ``host_command`` (run by a separate host process, the durable-run
supervisor) cannot be held like that, so its argv stays self-contained: ``sh`` joining the
cgroups as root, then the same ``prlimit`` and launcher, then ``bwrap``.

What host processes see: ``bwrap`` (and, for ``host_command``, its launcher chain) runs
with a fixed environment (``PATH`` and corral's own tag), never a variable a user, a secret
or a repository's corral.toml names: those reach the command inside the sandbox only, over
the head of its stdin (see :mod:`corral.providers._bwrap_init`). ``bwrap --clearenv``
starts the sandbox's pid 1 with no environment at all.

Each command runs under corral's own init as pid 1 of a fresh pid namespace
(``--as-pid-1``; a small C program compiled on first use and bound read-only into the
sandbox, or a ``perl`` script on hosts without a C compiler: see
:mod:`corral.providers._bwrap_init`). The init makes
itself non-dumpable before the command starts, so the command (same uid) cannot ptrace it,
read its ``/proc`` entries or take its descriptors; as a namespace's init it cannot be
signalled from inside. It alone reports the command's raw wait status, on a pipe whose
other end only the host holds: nothing the agent can reach decides the status corral
reports. When the command ends the init exits and the kernel kills everything left in the
namespace, stopped or traced processes included.

Consequences worth knowing: each command gets its own pid namespace, so a command sees
only its own processes, and whatever an ``exec``/``spawn`` leaves running in the
background (``cmd &``, ``setsid``, daemons) is killed when its main process ends. Use
``spawn`` for long-lived processes: they survive the Python process that started them.
Killing a process tree kills the namespace's init, which takes everything in it; a timeout
does the same and reports exit status 124. ``destroy`` freezes and kills the whole cgroup.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.to_thread
from pydantic import field_validator

from corral._errors import ConfigError, CorralError, PrerequisiteMissing
from corral._log import library_logger
from corral._paths import SHARED_ROOT, corral_home, net_root
from corral.providers import _btrfs as btrfs
from corral.providers import _cgroups as cgroups
from corral.providers import _diskquota as diskquota
from corral.providers import _procscan as procscan
from corral.providers._base import HostDirHandle
from corral.providers._agent_client import (
    AgentConnection,
    AgentLost,
    AgentProcess,
    StatusFinisher,
)
from corral.providers._bwrap_agent import AgentUnavailable, BwrapAgentLink, agent_argv
from corral.providers._bwrap_init import (
    AGENT_INSIDE_PATH,
    INSIDE_PATH,
    PERL_INIT,
    InitProgram,
    find_init,
)
from corral.providers._snapshots import HostDirSnapshots
from corral.providers._limits import merged_limits
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
    check_env,
    make_files_dir,
    make_sandbox_dir,
    new_id,
    provider_root,
    remove_tree,
    validate_id,
)
import corral._validate as validate
from corral.sandbox._gc import LabelledSandbox
from corral.sandbox._redact import Redactor
from corral.sandbox._provider_registry import ProviderConfig
from corral.sandbox._contracts import (
    Capabilities,
    Command,
    ExecResult,
    HostCommand,
    HostRoute,
    ProcessApi,
    ResourceLimits,
    SandboxRef,
    SandboxSpec,
    SnapshotRef,
    UnsupportedCapability,
)

__all__ = [
    "BWRAP_CAPABILITIES",
    "DEFAULT_HOST_UID",
    "DEFAULT_LIMITS",
    "BubblewrapConfig",
    "BubblewrapHandle",
    "BubblewrapProvider",
]

BWRAP_CAPABILITIES = Capabilities(
    background_processes=True,
    killable_processes=True,
    writable_stdin=True,
    snapshots=False,
    network_policy=True,
    durable_filesystem=True,
    ports=False,
    isolated=True,
    host_processes=True,
)

DEFAULT_HOST_UID = 1_000_000_000
FILES_ROOT = Path(os.environ.get("CORRAL_BWRAP_FILES", SHARED_ROOT / "bubblewrap"))
SANDBOX_UID = 1000
DEFAULT_LIMITS = ResourceLimits(memory_bytes=4 << 30, pids=2048, cpus=None, disk_bytes=10 << 30)
MIN_DISK_BYTES = 8 << 20
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/home/agent",
    "USER": "agent",
    "LOGNAME": "agent",
    "SHELL": "/bin/sh",
    "LANG": "C.UTF-8",
    "TMPDIR": "/tmp",
}

_log = library_logger("corral.providers._bubblewrap")

STDIN_INLINE = 256 << 10
"""An ``exec``'s stdin up to this size goes with its request; more is streamed."""

# Joins the sandbox's cgroups by writing its own pid, then execs the rest of argv.
_JOIN = 'while [ "$1" != -- ]; do echo $$ >"$1" || exit 125; shift; done; shift; exec "$@"'

# pid 1 of every command's pid namespace (``bwrap --as-pid-1``): see
# corral.providers._bwrap_init for what it does and where its program comes from.

# prctl(2)'s number per machine (perl's syscall() takes the raw number).
_PRCTL_NR = {"x86_64": 157, "aarch64": 167, "riscv64": 167, "ppc64le": 171, "s390x": 172}


def launch_fields(cwd: str, env: Mapping[str, str], argv: Sequence[str]) -> bytes:
    """The launch fields of a command (NUL-terminated: cwd, the number of variables,
    ``NAME=VALUE`` each, then argv): the agent's start request, and the body of
    :func:`launch_prefix`."""
    head = [cwd, str(len(env)), *(f"{k}={v}" for k, v in env.items())]
    return b"".join(f.encode() + b"\0" for f in head) + argv_fields(argv)


def argv_fields(argv: Sequence[str]) -> bytes:
    """The argv part of :func:`launch_fields`."""
    if any("\0" in a for a in argv):
        raise ConfigError("a command argument contains a NUL byte, which no program can receive")
    return b"".join(a.encode() + b"\0" for a in argv)


def launch_prefix(cwd: str, env: Mapping[str, str], argv: Sequence[str]) -> bytes:
    """The head of a sandboxed command's stdin, read by the init: what to run, where and
    with which environment (``<length>\n`` + NUL-terminated fields: cwd, the number of
    variables, ``NAME=VALUE`` each, then argv). None of it is in a host process's argv or
    environment."""
    blob = launch_fields(cwd, env, argv)
    return str(len(blob)).encode() + b"\n" + blob


def _system_binds() -> list[str]:
    args: list[str] = []
    for path in SYSTEM_PATHS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def _passwd_files(etc: Path) -> None:
    """Write passwd/group for the sandbox: the host's entries plus ``agent`` (uid 1000)."""
    etc.mkdir(exist_ok=True)

    def rewrite(src: str, line: str) -> str:
        keep = []
        with contextlib.suppress(OSError), open(src) as fh:
            for raw in fh:
                parts = raw.split(":")
                if len(parts) > 2 and (parts[0] == "agent" or parts[2] == str(SANDBOX_UID)):
                    continue
                keep.append(raw if raw.endswith("\n") else raw + "\n")
        return "".join(keep) + line

    (etc / "passwd").write_text(
        rewrite("/etc/passwd", f"agent:x:{SANDBOX_UID}:{SANDBOX_UID}:corral agent:/home/agent:/bin/sh\n")
    )
    (etc / "group").write_text(rewrite("/etc/group", f"agent:x:{SANDBOX_UID}:\n"))


class _BwrapProcessApi:
    def __init__(self, handle: BubblewrapHandle) -> None:
        self._h = handle

    async def spawn(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> SandboxProcess | AgentProcess:
        """Start ``command`` in the sandbox and return at once (stream its output)."""
        return await self._h._start(command, cwd, env)

    async def exec(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        """Run to completion; a timeout kills everything the command started."""
        return await self._h._exec(command, cwd, env, stdin, timeout)


class _Run:
    """Bookkeeping of one bwrap invocation: status pipes and limit counters."""

    def __init__(self, handle: BubblewrapHandle, status_r: int, report_r: int | None) -> None:
        self.h = handle
        self.status_r = status_r
        self.report_r = report_r
        self.init_pid: int | None = None
        self.before = handle._limits_now()
        self._status_buf = b""
        self.proc: subprocess.Popen[bytes] | None = None

    def _read_status(self) -> None:
        while b"\n" not in self._status_buf:
            try:
                chunk = os.read(self.status_r, 4096)
            except BlockingIOError:
                return
            if not chunk:
                return
            self._status_buf += chunk
        line = self._status_buf.split(b"\n", 1)[0]
        with contextlib.suppress(ValueError):
            info: dict[str, Any] = json.loads(line)
            if "child-pid" in info:
                self.init_pid = int(info["child-pid"])

    async def find_init(self) -> int | None:
        """The host pid of the sandbox's pid-namespace init for this run (bwrap's child)."""
        assert self.proc is not None
        with anyio.move_on_after(5):
            while self.init_pid is None and self.proc.poll() is None:
                self._read_status()
                if self.init_pid is None:
                    await anyio.sleep(0.001)
        return self.init_pid

    async def kill(self, sig: int) -> None:
        assert self.proc is not None
        init = await self.find_init()
        if init is None:
            # bwrap never got to start the sandbox (or is gone): kill it directly.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            return
        if sig == signal.SIGKILL:
            # The death of a pid namespace's init kills every process in that namespace.
            with contextlib.suppress(ProcessLookupError):
                os.kill(init, signal.SIGKILL)
            return
        await anyio.to_thread.run_sync(self._signal_namespace, init, sig)

    def _signal_namespace(self, init: int, sig: int) -> None:
        try:
            ns = os.readlink(f"/proc/{init}/ns/pid")
        except OSError:
            return
        if self.h.state.cgroups:
            candidates: Sequence[int] = sorted(cgroups.members(self.h.state.cgroups))
        else:
            candidates = procscan.descendants(init)
        for pid in candidates:
            if pid == init:
                continue
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/ns/pid") == ns:
                    os.kill(pid, sig)

    def finish(self, rc: int) -> Outcome:
        status: int | None = None
        if self.report_r is not None:
            with contextlib.suppress(OSError, ValueError):
                raw = os.read(self.report_r, 64)
                if raw.strip():
                    status = int(raw.split()[0])
        self.close()
        return self.h._outcome(status, rc, self.before)

    def close(self) -> None:
        for fd in (self.status_r, self.report_r):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.report_r = None
        self.status_r = -1


class BubblewrapHandle(HostDirHandle):
    """A bubblewrap sandbox. Cheap to build: all argv work is done here, once."""

    provider_name = "bubblewrap"

    def __init__(self, sandbox_dir: Path, state: SandboxState, provider: BubblewrapProvider) -> None:
        uid = state.host_uid
        super().__init__(
            sandbox_dir,
            state,
            BWRAP_CAPABILITIES,
            owner=(uid, uid) if uid is not None else None,
        )
        self._provider = provider
        self._process = _BwrapProcessApi(self)
        root = self._files / "root"
        bwrap = [
            provider.bwrap,
            "--unshare-all",
            "--unshare-user",
            *(["--share-net"] if state.network else []),
            "--disable-userns",
            "--new-session",
            "--hostname",
            "corral",
            "--uid",
            str(SANDBOX_UID),
            "--gid",
            str(SANDBOX_UID),
            *provider.system_binds,
            "--ro-bind",
            str(self._files / "etc" / "passwd"),
            "/etc/passwd",
            "--ro-bind",
            str(self._files / "etc" / "group"),
            "/etc/group",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--bind",
            str(root / "workspace"),
            "/workspace",
            "--bind",
            str(root / "tmp"),
            "/tmp",
            "--bind",
            str(root / "home" / "agent"),
            "/home/agent",
        ]
        for host, inside in state.binds:
            bwrap += ["--ro-bind", host, inside]
        # The sandbox's own root (a tmpfs) read-only too: only the areas are writable. The
        # init starts with no environment at all (the command's comes over stdin).
        self._init_program = provider.init
        init = self._init_program.path
        if init is not None:  # last of the binds: nothing above can hide it
            bwrap += ["--ro-bind", str(init), INSIDE_PATH]
        tail = ["--remount-ro", "/", "--clearenv", "--as-pid-1", "--chdir", "/"]
        agent = self._init_program.agent if provider.use_agent else None
        # The agent's sandbox: the same, plus the agent's program and the one capability it
        # keeps for itself, in the sandbox's own user namespace (see _bwrap_agent).
        self._agent_args: bytes | None = None
        if agent is not None:
            self._agent_args = b"".join(a.encode() + b"\0" for a in [
                *bwrap[1:], "--ro-bind", str(agent), AGENT_INSIDE_PATH, *tail,
                "--cap-add", "CAP_SYS_ADMIN"])
        bwrap += tail
        self._bwrap = bwrap
        # In front of bwrap for every command: rlimits (the rlimit mode), then the drop to
        # the sandbox's host uid when corral is root (the launcher; see "How a command
        # starts" in the module docstring for why not Popen's own ``user=``). All exec()s
        # in one process.
        prefix: list[str] = []
        if state.limit_mode == "rlimit":
            prefix = [provider.prlimit or "prlimit", *_rlimit_args(state.limits), "--"]
        launcher = self._init_program.launcher
        if uid is not None and launcher is not None:
            # corral's own compiled launcher: the same drop as setpriv's below, as one
            # static program (see corral.providers._bwrap_init).
            prefix += [str(launcher), str(uid), str(uid)]
        elif uid is not None:
            prefix += [
                provider.setpriv,
                f"--reuid={uid}",
                f"--regid={uid}",
                "--clear-groups",
                "--no-new-privs",
                "--",
            ]
        self._start_prefix = prefix
        # host_command's chain also joins the cgroups itself (``sh``, as root, first): it
        # runs in a process corral cannot hold before bwrap forks, as ``_start`` does.
        join: list[str] = []
        if state.limit_mode == "cgroup":
            join = ["/bin/sh", "-c", _JOIN, "corral-join", *cgroups.procs_files(state.cgroups), "--"]
        self._launcher = [*join, *prefix]
        # ``_start`` gives bwrap its options over a pipe (``--args``) and moves it into
        # these cgroups meanwhile; see there.
        self._bwrap_args = b"".join(a.encode() + b"\0" for a in bwrap[1:])
        self._procs_files = cgroups.procs_files(state.cgroups) if state.limit_mode == "cgroup" else []
        # What host processes (the launcher chain, bwrap) get: fixed, nothing a user or a
        # repository controls (a name like LD_PRELOAD would run code on the host as root).
        self._host_env = {"PATH": BASE_ENV["PATH"], procscan.TOKEN_ENV: state.token}
        # What the sandboxed command gets, delivered inside the sandbox only.
        self._env = merge_env(BASE_ENV, state.env)
        self._env["CORRAL_SANDBOX_ID"] = state.id
        self._init_nr = str(provider.prctl_nr)
        self._filter = provider.seccomp.hex() if provider.seccomp else "-"
        self._agent = BwrapAgentLink(self._dir / "private", f"sandbox {state.id!r}")
        self._counters = cgroups.LimitCounters(state.cgroups) if state.cgroups else None
        # The launch fields' head for the default cwd and environment (most commands).
        self._default_head = launch_fields("/workspace", self._env, [])

    def _limits_now(self) -> tuple[int, int] | None:
        """The cgroups' limit counters now (None without cgroups)."""
        return self._counters.read() if self._counters is not None else None

    @property
    def process(self) -> ProcessApi:
        return self._process

    def _env_for(self, env: Mapping[str, str] | None) -> dict[str, str]:
        if not env:
            return self._env
        check_env(dict(env))
        merged = dict(self._env)
        merged.update(env)
        return merged

    def _init(self, report_fd: int, keeper_fd: int) -> list[str]:
        args = [str(report_fd), str(keeper_fd), self._filter]
        if self._init_program.kind == "c":
            return [INSIDE_PATH, *args]
        return ["/usr/bin/perl", "-e", PERL_INIT, "--", *args, self._init_nr]

    async def _agent_conn(self) -> AgentConnection | None:
        """The connection to the sandbox's agent (started if needed), or None when commands
        take the launcher chain (see :meth:`BubblewrapProvider.command_path`)."""
        if self._agent_args is None or self._provider.agent_problem is not None:
            return None
        try:
            return await self._agent.connection(self._launch_agent)
        except AgentUnavailable as exc:
            self._check_alive()  # destroyed meanwhile: say that instead
            self._provider.agent_failed(str(exc))
            return None

    async def _exec(self, command: Command, cwd: str | None, env: Mapping[str, str] | None,
                    stdin: bytes | None, timeout: float | None) -> ExecResult:
        if self._gone():
            self._check_alive()
        argv = to_argv(command)
        chdir = self._check_cwd(cwd) if cwd is not None else "/workspace"
        conn = await self._agent_conn()
        if conn is None:
            proc = await self._start(command, cwd, env)
            return await collect(proc, stdin=stdin, timeout=timeout)
        if stdin is not None and len(stdin) > STDIN_INLINE:
            # Streamed, each chunk acknowledged: the agent never holds more than one (its
            # memory is the sandbox's).
            proc = await self._start(command, cwd, env)
            return await collect(proc, stdin=stdin, timeout=timeout)
        if env or cwd is not None:
            blob = launch_fields(chdir, self._env_for(env), argv)
        else:  # the default cwd and environment: only argv is encoded per command
            blob = self._default_head + argv_fields(argv)
        finish = self._finisher()
        try:
            return await conn.run(blob, finish, self._gone, stdin=stdin, timeout=timeout)
        except AgentLost:
            self._check_alive()
            if not await self._fall_back():
                raise
        proc = await self._start(command, cwd, env)
        return await collect(proc, stdin=stdin, timeout=timeout)

    async def _fall_back(self) -> bool:
        """After a lost agent: whether it never started (then commands take the launcher
        chain from now on, and this one did not run)."""
        why = await self._agent.failed_start()
        if why is not None:
            self._provider.agent_failed(why)
        return why is not None

    def _finisher(self) -> StatusFinisher:
        before = self._limits_now()

        def finish(status: int | None, reported: bool) -> Outcome:
            # Could not start (status None): the agent said why on the command's stderr.
            return self._outcome(126 << 8 if status is None else status, 0, before)

        return finish

    async def _start(
        self, command: Command, cwd: str | None, env: Mapping[str, str] | None
    ) -> SandboxProcess | AgentProcess:
        self._check_alive()
        self._provider.init  # noqa: B018 - rebuilds the cached programs if they were removed
        argv = to_argv(command)
        chdir = self._check_cwd(cwd) if cwd is not None else "/workspace"
        conn = await self._agent_conn()
        if conn is not None:
            try:
                return await conn.start(launch_fields(chdir, self._env_for(env), argv),
                                        self._finisher(), self._gone)
            except AgentLost:
                self._check_alive()
                if not await self._fall_back():
                    raise
        prefix = launch_prefix(chdir, self._env_for(env), argv)
        status_r, status_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        report_r, report_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        # bwrap keeps a read end of its own status pipe open: when the process that
        # spawned it exits early (a background process outliving its creator), bwrap's
        # status writes must not fail (it would die of EPIPE and take the tree with it).
        keeper = os.dup(status_r)
        # bwrap's options come over this pipe: bwrap reads it to the end before it does
        # anything else (it has already set no_new_privs, and it closes the pipe), so until
        # corral closes the write end, the launched process (the launcher then bwrap, the
        # same pid) is one process that has forked nothing.
        args_r, args_w = os.pipe2(os.O_CLOEXEC)
        fds = [status_w, report_w, keeper, args_r]
        full = [
            *self._start_prefix,
            self._provider.bwrap,
            "--args",
            str(args_r),
            "--json-status-fd",
            str(status_w),
            "--",
            *self._init(report_w, keeper),
        ]
        run = _Run(self, status_r, report_r)
        try:
            try:
                proc = popen(full, env=self._host_env, pass_fds=fds)
            finally:
                for fd in fds:
                    os.close(fd)
            try:
                # Cgroups first: the sandbox's pid-namespace init (and with it every process
                # of the sandbox) is forked by bwrap only after this, so it is born in the
                # cgroups (as is its cgroup namespace, whose root is the sandbox's group).
                # This replaces the ``sh`` that host_command's chain still needs.
                self._confine(proc.pid)
                with contextlib.suppress(BrokenPipeError):  # killed meanwhile (destroy):
                    _write_all(args_w, self._bwrap_args)  # its exit status says so
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()  # at once: it was blocked reading its options
                for stream in (proc.stdin, proc.stdout, proc.stderr):
                    if stream is not None:
                        stream.close()
                raise
        except BaseException:
            run.close()
            raise
        finally:
            os.close(args_w)
        run.proc = proc
        sandboxed = SandboxProcess(proc, killer=run.kill, finisher=run.finish)
        try:
            await sandboxed.write_stdin(prefix)
        except BrokenPipeError:
            pass  # bwrap failed before the init ran; its exit status says why
        return sandboxed

    def _confine(self, pid: int) -> None:
        """Put ``pid`` (the launcher execing bwrap, which has not forked yet)
        into the sandbox's cgroups."""
        for path in self._procs_files:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                self._check_alive()  # destroyed meanwhile: say so
                raise
            try:
                os.write(fd, str(pid).encode())
            finally:
                os.close(fd)

    def _outcome(self, status: int | None, rc: int,
                 before: tuple[int, int] | None) -> Outcome:
        """The outcome of a command: its raw wait ``status`` as its init reported it (None:
        no report, then the launcher's return code ``rc`` says what it can), and which
        limit it hit (the cgroups' counters against ``before``, the disk quota)."""
        sig: int | None = None
        if status is not None:
            if status & 0x7F:
                sig = status & 0x7F
                code = 128 + sig
            else:
                code = (status >> 8) & 0xFF
        elif rc < 0:
            sig, code = -rc, 128 - rc
        elif 128 < rc <= 128 + 64:
            sig, code = rc - 128, rc  # no reporter: read bwrap's 128+N as a signal
        else:
            code = rc
        limit: str | None = None
        now = self._limits_now() if before is not None else None
        if before is not None and now is not None:
            oom, refused = now
            if oom > before[0]:
                limit = "memory"
            elif refused > before[1]:
                limit = "pids"
        st = self._state
        if limit is None and (code != 0 or sig is not None) and st.disk_fsid and st.disk_bytes:
            # The quota fails writes (EDQUOT) rather than killing anything: a failed command
            # in a sandbox that is now full is taken to have failed for that reason.
            if diskquota.reached(st.disk_fsid, st.disk_subvol, st.disk_bytes):
                limit = "disk"
        if limit is None and sig == signal.SIGXCPU:
            limit = "cpu"
        return Outcome(exit_code=code, signal=sig, limit_hit=limit)


    def _prestart_agent(self) -> None:
        """Start the agent ahead of the first command (see BwrapAgentLink.prestart)."""
        if self._agent_args is not None and self._provider.agent_problem is None:
            self._agent.prestart(self._launch_agent)

    def _gone(self) -> bool:
        return not os.path.exists(f"{self._dir_name}/state.json")

    def _launch_agent(self, listen_fd: int, stdin: bytes, log_fd: int) -> subprocess.Popen[bytes]:
        """Start the sandbox's agent: the launcher chain, then bwrap with the agent's
        options (over a pipe, as :meth:`_start` gives a command's), moved into the
        sandbox's cgroups before bwrap forks; its key on stdin."""
        assert self._agent_args is not None
        self._provider.init  # noqa: B018 - rebuilds the cached programs if they were removed
        args_r, args_w = os.pipe2(os.O_CLOEXEC)
        full = [*self._start_prefix, self._provider.bwrap, "--args", str(args_r), "--",
                *agent_argv(listen_fd, self._filter)]
        try:
            try:
                proc = subprocess.Popen(full, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                        stderr=log_fd, env=self._host_env, start_new_session=True,
                                        pass_fds=(listen_fd, args_r), bufsize=0)
            finally:
                os.close(args_r)
            try:
                self._confine(proc.pid)
                with contextlib.suppress(BrokenPipeError):
                    _write_all(args_w, self._agent_args)
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
                raise
        finally:
            os.close(args_w)
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(stdin)
        proc.stdin.close()
        return proc

    async def host_gid(self) -> int | None:
        """The sandbox's host gid: the unprivileged ``host_uid`` when corral is root (the
        launcher drops to it), else corral's own (a user namespace maps it)."""
        uid = self._state.host_uid
        return uid if uid is not None else os.getegid()

    def host_command(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> HostCommand:
        """A self-contained host argv that joins the cgroups, drops to the sandbox's host
        uid (the launcher, when corral runs as root) and runs ``command`` in the sandbox.

        Its exit status is the command's (``128 + N`` for a death by signal ``N``). The
        launcher's pid stays the same through the chain (every step execs), and the
        sandboxed tree dies with it: signalling the launcher (or its process group), or
        the death of the launcher's parent, kills everything the command started
        (``bwrap --die-with-parent``). There is no graceful SIGTERM through it.
        """
        self._check_alive()
        argv = to_argv(command)
        chdir = self._check_cwd(cwd) if cwd is not None else "/workspace"
        full = [*self._launcher, *self._bwrap, "--die-with-parent", "--", *self._init(-1, -1)]
        return HostCommand(
            argv=tuple(full),
            env=dict(self._host_env),
            cwd=None,
            cgroup_procs=tuple(cgroups.procs_files(self._state.cgroups)),
            stdin_prefix=launch_prefix(chdir, self._env_for(env), argv),
        )


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _rlimit_args(limits: ResourceLimits) -> list[str]:
    args = []
    if limits.memory_bytes is not None:
        args.append(f"--as={limits.memory_bytes}")
    if limits.pids is not None:
        args.append(f"--nproc={limits.pids}")
    return args


def _limits_from(value: ResourceLimits | Mapping[str, Any]) -> tuple[ResourceLimits, bool]:
    """The provider's default limits, and whether they ask for a disk limit explicitly.

    A mapping is ``[provider] limits = { memory = "4G", pids = 2048, cpus = 2,
    disk = "10G" }`` from corral.toml: keys left out keep :data:`DEFAULT_LIMITS`' values.
    """
    if isinstance(value, ResourceLimits):
        return value, value is not DEFAULT_LIMITS and value.disk_bytes is not None
    if not isinstance(value, Mapping):
        raise ConfigError("provider.limits: expected a table such as { disk = \"10G\" }")
    validate.no_unknown(value, ("memory", "pids", "cpus", "disk"), "provider.limits")
    d = DEFAULT_LIMITS
    cpus = value.get("cpus", d.cpus)
    if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, int | float)):
        raise ConfigError(f"provider.limits.cpus: expected a number, got {cpus!r}")
    lim = ResourceLimits(
        memory_bytes=(validate.size(value["memory"], "provider.limits.memory")
                      if "memory" in value else d.memory_bytes),
        pids=validate.positive_int(value["pids"], "provider.limits.pids") if "pids" in value else d.pids,
        cpus=float(cpus) if cpus is not None else None,
        disk_bytes=(validate.size(value["disk"], "provider.limits.disk")
                    if "disk" in value else d.disk_bytes),
    )
    return lim, "disk" in value


class BubblewrapConfig(ProviderConfig):
    """``[provider]`` settings of the bubblewrap provider (see :class:`BubblewrapProvider`)."""

    home: Path | None = None
    """corral's home directory (default ``$CORRAL_HOME``); sandboxes live under it."""
    limits: dict[str, Any] | None = None
    """Default limits, ``{ memory = "4G", pids = 2048, cpus = 2, disk = "10G" }``."""
    host_uid: int = DEFAULT_HOST_UID
    """The unprivileged host uid sandboxes run as when corral runs as root."""
    bwrap: str | None = None
    """The ``bwrap`` program (default: found on ``PATH``)."""
    agent: bool = True
    """Run commands through one long-lived agent per sandbox (false: a launcher chain and
    ``bwrap`` per command, as before)."""

    @field_validator("limits")
    @classmethod
    def _check_limits(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            _limits_from(value)  # ConfigError names the key and what it expected
        return value


class BubblewrapProvider:
    """Isolated sandboxes with bubblewrap (see the module docstring for what that means).

    ``limits`` are the defaults for fields a spec leaves ``None`` (a mapping, as in
    corral.toml, overrides :data:`DEFAULT_LIMITS` key by key); ``host_uid`` is the
    unprivileged host uid sandboxes run as when corral runs as root; ``init="perl"`` runs
    the perl init even where the C one can be built (see
    :mod:`corral.providers._bwrap_init`).

    The default disk limit is enforced where the machine can (see
    :mod:`corral.providers._diskquota`) and otherwise only logged once; a disk limit asked
    for explicitly (here or in a spec) that cannot be enforced is a ConfigError at create.
    """

    config_model: type[ProviderConfig] = BubblewrapConfig

    def __init__(
        self,
        home: Path | str | None = None,
        *,
        limits: ResourceLimits | Mapping[str, Any] = DEFAULT_LIMITS,
        host_uid: int = DEFAULT_HOST_UID,
        bwrap: str | None = None,
        init: Literal["auto", "perl"] = "auto",
        agent: bool = True,
    ) -> None:
        found = bwrap or shutil.which("bwrap")
        if not found:
            raise PrerequisiteMissing(
                "bubblewrap is not installed: `apt-get install bubblewrap` (or use --provider local "
                "for an unisolated sandbox)"
            )
        self.bwrap = found
        self._home = Path(home) if home is not None else None
        self._limits, self._disk_asked = _limits_from(limits)
        self._host_uid = host_uid if os.geteuid() == 0 else None
        self._init_prefer: Literal["auto", "perl"] = init
        self.use_agent = agent
        self.agent_problem: str | None = None
        if self.init.kind == "perl" and not os.path.exists("/usr/bin/perl"):
            raise PrerequisiteMissing(
                "the sandboxes' init process (it decides the exit status out of the "
                f"command's reach) needs a C compiler or perl ({self.init.reason}): "
                "`apt-get install gcc` or `apt-get install perl-base`"
            )
        nr = _PRCTL_NR.get(platform.machine())
        if nr is None:
            raise PrerequisiteMissing(
                f"the bubblewrap provider does not know prctl's syscall number on "
                f"{platform.machine()!r}; use --provider local or docker"
            )
        self.prctl_nr = nr
        self.seccomp = btrfs.no_subvolumes_filter()
        self.prlimit = shutil.which("prlimit")
        self.setpriv = shutil.which("setpriv") or "setpriv"
        if self._host_uid is not None and self.init.launcher is None and not shutil.which("setpriv"):
            raise PrerequisiteMissing(
                "setpriv is needed to run sandboxes as an unprivileged uid: install util-linux"
            )
        self.system_binds = _system_binds()

    @property
    def init(self) -> InitProgram:
        """The sandboxes' init (and, as root, the launcher): see
        :mod:`corral.providers._bwrap_init`."""
        return find_init(prefer=self._init_prefer)

    def agent_failed(self, reason: str) -> None:
        """An agent could not start: this provider's commands take the launcher chain from
        now on (said once in the log, and by :meth:`command_path`)."""
        if self.agent_problem is None:
            self.agent_problem = reason
            _log.warning("bubblewrap: commands take the launcher chain (%s)", reason)

    def command_path(self) -> tuple[Literal["agent", "launcher"], str]:
        """How commands start, and why: ``"agent"`` (one long-lived agent per sandbox,
        :mod:`corral.providers._bwrap_agent`) or ``"launcher"`` (a launcher chain and
        ``bwrap`` per command)."""
        if not self.use_agent:
            return "launcher", "the agent is turned off (agent = false)"
        if self.init.agent is None:
            return "launcher", f"no compiled agent ({self.init.reason})"
        if self.agent_problem is not None:
            return "launcher", self.agent_problem
        return "agent", f"one agent per sandbox ({self.init.agent})"

    @property
    def name(self) -> str:
        return "bubblewrap"

    @property
    def default_limits(self) -> ResourceLimits:
        """The limits of sandboxes whose spec leaves a field ``None``."""
        return self._limits

    @property
    def capabilities(self) -> Capabilities:
        return BWRAP_CAPABILITIES

    @property
    def host_route(self) -> HostRoute:
        return "unix-socket"

    @property
    def base_dir(self) -> Path:
        return provider_root("bubblewrap", self._home or corral_home())

    def _files_dir(
        self, sandbox_id: str, sandbox_dir: Path, pool: diskquota.Pool | None
    ) -> Path:
        """Where the writable areas live. Running as root, the sandbox's host uid must be
        able to reach them (bwrap resolves bind sources by path with its own rights), and
        $CORRAL_HOME is usually under a private home; so they go under FILES_ROOT (in the
        btrfs pool when there is one), in a directory per $CORRAL_HOME, and only
        ``state.json``/``private/`` stay in it."""
        if self._host_uid is None:
            return sandbox_dir
        home = str((self._home or corral_home()).resolve())
        key = hashlib.sha256(home.encode()).hexdigest()[:16]
        if pool is not None:
            return pool.root / key / sandbox_id  # the subvolume; its parent made with it
        base = FILES_ROOT / key
        base.mkdir(mode=0o711, exist_ok=True)
        return base / sandbox_id

    def _disk_pool(self, spec: SandboxSpec, lim: ResourceLimits) -> diskquota.Pool | None:
        """The btrfs pool for the new sandbox's files, or None (then no disk quota)."""
        if self._host_uid is None:
            reason = "corral is not running as root"
        else:
            for d in (FILES_ROOT.parent, FILES_ROOT):
                d.mkdir(mode=0o711, exist_ok=True)
            try:
                return diskquota.pool(FILES_ROOT)
            except diskquota.PoolUnavailable as exc:
                reason = str(exc)
        if lim.disk_bytes is not None:
            if spec.limits.disk_bytes is not None or self._disk_asked:
                raise diskquota.unenforceable(lim.disk_bytes, reason)
            diskquota.warn_unenforced(reason)
        return None

    def fingerprint(self) -> str:
        raw = json.dumps(
            {
                "v": 1,
                "limits": [self._limits.memory_bytes, self._limits.pids, self._limits.cpus],
                "binds": self.system_binds,
                "uid": self._host_uid,
                # Only when not the default: keys of existing sandboxes stay the same.
                **({"disk": self._limits.disk_bytes}
                   if self._limits.disk_bytes != DEFAULT_LIMITS.disk_bytes else {}),
            },
            sort_keys=True,
        )
        return hashlib.sha256(raw.encode()).hexdigest()

    def snapshotter(self, *, redactor: Redactor | None = None) -> HostDirSnapshots:
        """Snapshots are copies of the sandbox's directories, kept on the host."""
        return HostDirSnapshots(self, redactor=redactor)

    def _limits_for(self, spec: SandboxSpec) -> ResourceLimits:
        lim = merged_limits(self._limits, spec.limits)
        if lim.disk_bytes is not None and lim.disk_bytes < MIN_DISK_BYTES:
            raise ConfigError(f"disk limit must be at least {diskquota.format_size(MIN_DISK_BYTES)}")
        return lim

    async def create(self, spec: SandboxSpec | None = None) -> BubblewrapHandle:
        spec = spec or SandboxSpec()
        sandbox_id = validate_id(spec.name) if spec.name is not None else new_id()
        state = SandboxState.from_spec(sandbox_id, "bubblewrap", spec)
        lim = self._limits_for(spec)
        state.memory_bytes, state.pids, state.cpus = lim.memory_bytes, lim.pids, lim.cpus
        state.host_uid = self._host_uid
        uid = self._host_uid
        pool = self._disk_pool(spec, lim)
        sandbox_dir = make_sandbox_dir(self.base_dir, sandbox_id)
        files = self._files_dir(sandbox_id, sandbox_dir, pool)
        state.files_dir = str(files)
        try:
            if files != sandbox_dir and os.path.lexists(files):
                diskquota.remove_files(files)  # left over by an earlier sandbox of that name
            if pool is not None:
                state.disk_subvol = diskquota.make_subvolume(pool, files, lim.disk_bytes)
                state.disk_fsid, state.disk_bytes = pool.fsid, lim.disk_bytes
            make_files_dir(files, (uid, uid) if uid is not None else None)
            _passwd_files(files / "etc")
            has_limits = any(v is not None for v in (lim.memory_bytes, lim.pids, lim.cpus))
            ok, _why = cgroups.available()
            if ok:
                state.cgroups = cgroups.create(
                    f"{sandbox_id}.{state.token}",
                    memory_bytes=lim.memory_bytes,
                    pids=lim.pids,
                    cpus=lim.cpus,
                    owner_uid=uid,
                )
                state.limit_mode = "cgroup"
            elif has_limits and self.prlimit:
                state.limit_mode = "rlimit"
            if files != sandbox_dir:
                (files / "cgroups").write_text("\n".join(state.cgroups))
            state.save(sandbox_dir)  # the sandbox exists once state.json does
            if files != sandbox_dir:
                # A back-pointer, so that prune_orphans can tell when $CORRAL_HOME is gone
                # (written after state.json: a sandbox being created is never pruned).
                (files / "owner").write_text(str(sandbox_dir.resolve()))
        except BaseException:
            cgroups.remove(state.cgroups)
            diskquota.remove_files(files)
            remove_tree(sandbox_dir)
            raise
        handle = BubblewrapHandle(sandbox_dir, state, self)
        handle._prestart_agent()
        return handle

    def _locate(self, sandbox_id: str) -> Path:
        """The state directory of sandbox ``sandbox_id``: in this ``$CORRAL_HOME``, or else
        in another home of this machine (:func:`_elsewhere`), or else (nowhere) where it
        would be in this one."""
        own = self.base_dir / sandbox_id
        if os.path.lexists(own):
            return own
        return _elsewhere(sandbox_id, own) or own

    async def resume(self, ref: SandboxRef | str) -> BubblewrapHandle | None:
        """The sandbox, from any process of this machine: made by this ``$CORRAL_HOME`` or,
        as root, by another (found through corral's own files index, see
        :func:`_elsewhere`); None when it is gone or being destroyed."""
        sandbox_id = validate_id(ref.id if isinstance(ref, SandboxRef) else ref)
        sandbox_dir = self._locate(sandbox_id)
        state = SandboxState.load(sandbox_dir)
        if state is None or state.destroying:
            return None
        _mount_pool_of(state)
        if not (Path(state.files_dir or sandbox_dir) / "root" / "workspace").is_dir():
            return None
        return BubblewrapHandle(sandbox_dir, state, self)

    async def destroy(self, ref: SandboxRef | str) -> None:
        """Kill every process of the sandbox, remove its cgroups and files. Idempotent.

        Like :meth:`resume`, it reaches the sandbox whichever ``$CORRAL_HOME`` of this
        machine made it, so the host that finishes a run taken over from another home
        destroys its sandbox (nothing is left that no record points to)."""
        sandbox_id = validate_id(ref.id if isinstance(ref, SandboxRef) else ref)
        sandbox_dir = self._locate(sandbox_id)
        state = SandboxState.load(sandbox_dir)
        if state is None:
            await anyio.to_thread.run_sync(remove_tree, sandbox_dir)
            return
        # First make the sandbox unusable (no new launches), then stop what runs.
        with contextlib.suppress(FileNotFoundError):
            os.rename(sandbox_dir / "state.json", sandbox_dir / "state.destroying.json")
        await anyio.to_thread.run_sync(_kill_sandbox, state)
        await anyio.to_thread.run_sync(_remove_socket_dirs, state)
        if state.files_dir and Path(state.files_dir) != sandbox_dir:
            _mount_pool_of(state)
            await anyio.to_thread.run_sync(diskquota.remove_files, Path(state.files_dir))
            with contextlib.suppress(OSError):
                Path(state.files_dir).parent.rmdir()  # the per-$CORRAL_HOME dir, if empty
        await anyio.to_thread.run_sync(remove_tree, sandbox_dir)

    async def labelled(self) -> builtins.list[LabelledSandbox]:
        """Every sandbox of this home and, as root, of every other home of this machine
        (corral's files index), with its labels: what ``corral gc`` judges orphans by (a
        sandbox labelled with an instance key of its store that no record points to)."""
        return await anyio.to_thread.run_sync(self._labelled)

    def _labelled(self) -> builtins.list[LabelledSandbox]:
        dirs = {p.resolve() for p in self.base_dir.iterdir() if not p.name.startswith(".")}
        dirs.update(_indexed())
        found = []
        for sandbox_dir in sorted(dirs):
            try:
                state = SandboxState.load(sandbox_dir)
            except ConfigError:
                continue
            if state is None or state.destroying or state.id != sandbox_dir.name:
                continue
            found.append(LabelledSandbox(state.id, dict(state.labels), state.created_at))
        return found

    async def prune_orphans(self) -> list[str]:
        """Destroy sandboxes whose state directory vanished (e.g. a deleted $CORRAL_HOME):
        kill their processes, remove their cgroups and files. Returns their files dirs.

        Looks at every sandbox under FILES_ROOT, whatever $CORRAL_HOME created it.
        """
        return await anyio.to_thread.run_sync(_prune_orphans)

    async def list(self) -> list[SandboxRef]:
        return [
            SandboxRef("bubblewrap", p.name)
            for p in sorted(self.base_dir.iterdir())
            if not p.name.startswith(".") and (p / "state.json").exists()
        ]

    async def snapshot(self, handle: object, label: str = "") -> SnapshotRef:
        raise UnsupportedCapability("bubblewrap", "snapshots", "copy the workspace with handle.fs")

    async def restore(
        self, snapshot: SnapshotRef, spec: SandboxSpec | None = None
    ) -> BubblewrapHandle:
        raise UnsupportedCapability("bubblewrap", "snapshots", "copy the workspace with handle.fs")


def _remove_socket_dirs(state: SandboxState) -> None:
    """The sandbox's own socket directory (bound at /run/corral for agent runs) goes with
    it. Only a direct child of corral's net root is removed, whatever the state says."""
    root = net_root(create=False).resolve()
    for host, _inside in state.binds:
        path = Path(host)
        if path.parent.resolve() == root and path.name and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)


def _mount_pool_of(state: SandboxState) -> None:
    """Make sure the pool holding the sandbox's files is mounted (after a reboot it is
    not). Its files dir is ``<FILES_ROOT>/btrfs/<hash>/<id>``."""
    if state.disk_fsid and state.files_dir:
        with contextlib.suppress(diskquota.PoolUnavailable):
            diskquota.pool(Path(state.files_dir).parents[2], create=False)


def _kill_sandbox(state: SandboxState) -> None:
    if state.cgroups:
        if not cgroups.destroy(state.cgroups):

            raise CorralError(
                f"could not stop every process of sandbox {state.id!r}; run "
                f"`corral sandboxes rm {state.id}` again"
            )
        return
    # No cgroups: the launchers carry the sandbox's tag in their environment; killing
    # each one's namespace init (its child) takes the namespace down with it.
    for _ in range(50):
        pids = procscan.tagged(state.token)
        if not pids:
            return
        for pid in pids:
            for p in [*procscan.descendants(pid), pid]:
                with contextlib.suppress(OSError):
                    os.kill(p, signal.SIGKILL)
        time.sleep(0.01)


_GENERATED_ID = re.compile(r"^sb-[0-9a-f]{12}$")
"""The ids corral makes (:func:`new_id`): random, so one names one sandbox machine-wide.
Only those are looked for in other homes (a name someone chose may be taken in several)."""


def _index_roots() -> list[Path]:
    """Where corral's files index lives (root only): FILES_ROOT and its btrfs pool."""
    if os.geteuid() != 0 or not FILES_ROOT.is_dir():
        return []
    roots = [FILES_ROOT]
    with contextlib.suppress(diskquota.PoolUnavailable):
        roots.append(diskquota.pool(FILES_ROOT, create=False).root)
    return roots


def _owner_of(files: Path) -> Path | None:
    """The state directory an index entry (``<root>/<home key>/<id>``) names, if the entry
    is corral's and consistent: ``owner`` a regular root-owned file, naming an absolute
    ``<home>/sandboxes/bubblewrap/<id>`` whose home hashes to the entry's key and whose
    state file is root's too. Nothing a store row says goes into this."""
    try:
        st = os.lstat(files / "owner")
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            return None
        owner = Path((files / "owner").read_text().strip())
    except (OSError, UnicodeDecodeError):
        return None
    if (not owner.is_absolute() or owner.name != files.name or ".." in owner.parts
            or owner.parent.name != "bubblewrap" or owner.parents[1].name != "sandboxes"):
        return None
    home = owner.parents[2]
    if hashlib.sha256(str(home).encode()).hexdigest()[:16] != files.parent.name:
        return None
    for name in ("state.json", "state.destroying.json"):
        with contextlib.suppress(OSError):
            st = os.lstat(owner / name)
            if stat.S_ISREG(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022:
                return owner
    return None


def _indexed() -> list[Path]:
    """The state directories of every sandbox in corral's files index (root only)."""
    found = []
    for root in _index_roots():
        with contextlib.suppress(OSError):
            for home_dir in root.iterdir():
                if home_dir == FILES_ROOT / diskquota.POOL_DIR or not home_dir.is_dir():
                    continue
                with contextlib.suppress(OSError):
                    for files in home_dir.iterdir():
                        owner = _owner_of(files)
                        if owner is not None:
                            found.append(owner)
    return found


def _elsewhere(sandbox_id: str, own: Path) -> Path | None:
    """The state directory of sandbox ``sandbox_id`` made by another ``$CORRAL_HOME`` of
    this machine, or None.

    Found only through corral's root-owned files index (each entry's ``owner`` back-pointer,
    checked by :func:`_owner_of`), only for ids corral generated, and only when exactly one
    home has it: a record in the store names an id, never a path, so a hostile row reaches
    no directory corral did not make for a sandbox of that id."""
    if not _GENERATED_ID.match(sandbox_id):
        return None
    found = set()
    for root in _index_roots():
        with contextlib.suppress(OSError):
            for home_dir in root.iterdir():
                files = home_dir / sandbox_id
                if home_dir == FILES_ROOT / diskquota.POOL_DIR or not os.path.isdir(files):
                    continue
                owner = _owner_of(files)
                if owner is not None and owner != own.resolve():
                    found.add(owner)
    return found.pop() if len(found) == 1 else None


def _prune_orphans() -> list[str]:
    pruned: list[str] = []
    if not FILES_ROOT.is_dir():
        return pruned
    roots = [FILES_ROOT]
    with contextlib.suppress(diskquota.PoolUnavailable):
        roots.append(diskquota.pool(FILES_ROOT, create=False).root)
    for home_dir in [d for root in roots for d in root.iterdir()]:
        if not home_dir.is_dir() or home_dir == FILES_ROOT / diskquota.POOL_DIR:
            continue
        for files in home_dir.iterdir():
            try:
                owner = Path((files / "owner").read_text().strip())
            except OSError:
                continue  # being created, or not ours
            if (owner / "state.json").exists() or (owner / "state.destroying.json").exists():
                continue
            if not owner.is_absolute():
                continue
            with contextlib.suppress(OSError):
                dirs = [d for d in (files / "cgroups").read_text().split("\n") if d]
                if dirs and all(d.startswith(str(cgroups.CGROUP_ROOT) + "/") for d in dirs):
                    cgroups.destroy(dirs)
            diskquota.remove_files(files)
            pruned.append(str(files))
        with contextlib.suppress(OSError):
            home_dir.rmdir()
    return pruned
