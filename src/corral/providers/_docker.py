"""The Docker provider: one container per sandbox, through the Docker Engine API.

A sandbox is a container named ``corral-<id>`` (labels ``corral=1``, ``corral.sandbox``,
``corral.created-by``, and the spec's labels, e.g. the run id) with:

* the agent as an unprivileged uid (1000 by default) with no capabilities at all; every
  capability of the container is dropped but the four root needs to run the durable-run
  supervisor and set the sandbox up (``CHOWN``, ``SETUID``, ``SETGID``, ``KILL``), which a
  process of the agent's uid never holds; ``no-new-privileges``;
* a read-only root filesystem; writable ``/workspace`` and ``/home/agent`` are named volumes
  (``corral-<id>-workspace``, ``corral-<id>-home``, labelled like the container), ``/tmp``
  a tmpfs, ``/run/corral-private`` a root-only tmpfs (the durable-run supervisor's state);
* for agent runs (a spec binding corral's agents root), the host's agents root and the
  run's socket directory bound read-only (``/opt/corral/agents``, ``/run/corral``) and the
  host's ``node`` bound read-only at ``/opt/corral/node/bin/node``, first on ``PATH``;
* pids, memory and CPU limits; no network (``network_mode=none``); the gVisor runtime when
  configured (``runtime = "runsc"``); ``docker-init`` as pid 1 (it reaps orphans).

Everything goes through the API (the official SDK, blocking, in worker threads), so a
process with another ``$CORRAL_HOME`` on another machine finds, drives and destroys the
same sandboxes: the container is the state. Commands run through the sandbox's agent
(:mod:`._docker_agent`), file operations through its long-lived file server
(:mod:`._docker_fs_server`), both as the agent's uid; without the agent, each runs under the
in-container helper (:mod:`corral._insandbox.container`) started by a ``docker exec``. The sandbox's
own environment (``SandboxSpec.env``, which never holds a secret) is the container's; a
command's environment, secrets included, travels on the exec's stdin, never in a container's
or an exec's configuration.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import json
import os
import posixpath
import shutil
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.to_thread
from pydantic import field_validator

from corral._errors import ConfigError
from corral._log import library_logger
from corral.providers._docker_client import (
    BASE_IMAGE,
    LABEL,
    connect,
    daemon_is_local,
    docker_errors,
    unavailable,
)
from corral.providers._agent_client import AgentConnection, AgentLost, AgentProcess
from corral.providers._docker_agent import (
    AgentUnavailable,
    DockerAgentLink,
    agent_problem,
    docker_outcome,
    launch_fields,
)
from corral.providers._docker_fs_server import FsServers
from corral.providers._docker_exec import (
    DockerProcess,
    collect,
    fields,
    header,
    helper_argv,
    open_exec,
    run_to_end,
    start_exec,
    start_helper,
)
from corral.providers._limits import merged_limits
from corral.providers._process import Outcome, to_argv
from corral.providers._state import new_id, validate_id
import corral._validate as validate
from corral.sandbox._contracts import (
    Capabilities,
    Command,
    ExecResult,
    FileInfo,
    HostCommand,
    HostRoute,
    PathEscapeError,
    Process,
    ProcessApi,
    ResourceLimits,
    SandboxGoneError,
    SandboxRef,
    SandboxSpec,
    SnapshotRef,
    UnsupportedCapability,
    check_env_name,
)
from corral.sandbox._gc import LabelledSandbox
from corral.sandbox._redact import Redactor
from corral.sandbox._provider_registry import ProviderConfig

if TYPE_CHECKING:
    from corral.providers._docker_snapshots import DockerSnapshots

__all__ = ["DOCKER_CAPABILITIES", "DockerConfig", "DockerHandle", "DockerProvider"]

_log = library_logger("corral.providers._docker")

DOCKER_CAPABILITIES = Capabilities(
    background_processes=True,
    killable_processes=True,
    writable_stdin=True,
    snapshots=False,
    network_policy=True,
    durable_filesystem=True,
    ports=False,
    isolated=True,
    host_processes=False,
    supervisor_inside=True,
)

WORKDIR = "/workspace"
HOME = "/home/agent"
AREAS = (WORKDIR, "/tmp", HOME)
AREAS_SNAPSHOT = (WORKDIR, HOME)
"""What a snapshot keeps (``/tmp`` is a tmpfs: scratch, as after a reboot)."""
PRIVATE = "/run/corral-private"
"""Root-only tmpfs: the durable-run supervisor's journal and nonce (not ``/run/corral``:
that is where agent runs get their socket directory)."""
AGENTS_TARGET = "/opt/corral/agents"
"""Where corral's agents root is bound (``corral.agents`` ``AGENTS_MOUNT``: the providers
sit below the harness layer, so the value is repeated here)."""
NODE_DIR = "/opt/corral/node/bin"
"""Where the host's ``node`` is bound for agent CLIs (they are npm packages)."""
ROOT_CAPS = ["CHOWN", "SETUID", "SETGID", "KILL"]
DEFAULT_LIMITS = ResourceLimits(memory_bytes=4 << 30, pids=2048, cpus=None)
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": HOME,
    "USER": "agent",
    "LOGNAME": "agent",
    "SHELL": "/bin/sh",
    "LANG": "C.UTF-8",
    "TMPDIR": "/tmp",
}
CREATED_BY = "corral"


def container_name(sandbox_id: str) -> str:
    return f"corral-{sandbox_id}"


def volume_names(sandbox_id: str) -> dict[str, str]:
    """The sandbox's named volumes by mount point."""
    return {WORKDIR: f"corral-{sandbox_id}-workspace", HOME: f"corral-{sandbox_id}-home"}


def _limits_from(value: ResourceLimits | Mapping[str, Any]) -> ResourceLimits:
    if isinstance(value, ResourceLimits):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError("provider.limits: expected a table such as { memory = \"4G\" }")
    validate.no_unknown(value, ("memory", "pids", "cpus"), "provider.limits")
    cpus = value.get("cpus", DEFAULT_LIMITS.cpus)
    if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, int | float)):
        raise ConfigError(f"provider.limits.cpus: expected a number, got {cpus!r}")
    d = DEFAULT_LIMITS
    return ResourceLimits(
        memory_bytes=(validate.size(value["memory"], "provider.limits.memory")
                      if "memory" in value else d.memory_bytes),
        pids=(validate.positive_int(value["pids"], "provider.limits.pids")
              if "pids" in value else d.pids),
        cpus=float(cpus) if cpus is not None else None,
    )



def _tmpfs(memory: int | None) -> dict[str, str]:
    """The container's tmpfs mounts, sized below its memory limit. Their files are charged
    to the container's memory and no OOM kill frees them: a ``/tmp`` filled to the limit
    left no memory for any exec (the host could no longer read the journal, stop the agent
    or see its end). Half the limit for ``/tmp``, a quarter for the supervisor's journals
    (its output budget is what fits), the rest for processes, which the OOM killer can
    reclaim (the agent's first: its ``oom_score_adj`` is 1000)."""
    tmp, private = "rw,nosuid,nodev,mode=1777", "rw,nosuid,nodev,mode=0700"
    if memory:
        tmp += f",size={max(memory // 2, 1 << 20)}"
        private += f",size={max(memory // 4, 4 << 20)}"
    return {"/tmp": tmp, PRIVATE: private}


def _epoch(*values: object) -> float:
    """The first of ``values`` that is a number of seconds, else 0."""
    for value in values:
        try:
            return float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
    return 0.0

def _named_as_labelled(container: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether ``container`` is the sandbox its ``corral.sandbox`` label names (its name is
    ``corral-<id>``). Anyone who can reach the daemon can label a container: one labelled
    with another sandbox's id made ``corral gc`` destroy that sandbox, which the gc
    finds, and destroys, by the label's name."""
    want = "/" + container_name(str(labels.get("corral.sandbox")))
    return want in (container.get("Names") or [])


class DockerConfig(ProviderConfig):
    """``[provider]`` settings of the docker provider (see :class:`DockerProvider`)."""

    image: str | None = None
    """The image (default: corral's base image, made by ``corral images build``)."""
    runtime: str | None = None
    """An OCI runtime registered with the daemon, e.g. ``"runsc"`` (gVisor)."""
    limits: dict[str, Any] | None = None
    """Default limits, ``{ memory = "4G", pids = 2048, cpus = 2 }``."""
    docker_host: str | None = None
    """The daemon (default: ``$DOCKER_HOST``, else the local socket)."""
    uid: int = 1000
    """The agent's uid (and gid) inside the container."""
    agent: bool = True
    """Run commands through one long-lived agent per sandbox (``false``: a ``docker exec``
    per command, the fallback where the agent cannot start)."""

    @field_validator("limits")
    @classmethod
    def _check_limits(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            _limits_from(value)
        return value


# ---------------------------------------------------------------------- paths


def confine(path: str, workdir: str = WORKDIR) -> str:
    """The normalized sandbox path of ``path`` if it lies in a writable area, else raise
    (lexically: the helper in the container re-checks after resolving symlinks)."""
    if not isinstance(path, str) or not path or "\x00" in path:
        raise PathEscapeError(f"invalid sandbox path {path!r}")
    full = posixpath.normpath(path if path.startswith("/") else posixpath.join(workdir, path))
    if not any(full == a or full.startswith(a + "/") for a in AREAS):
        raise PathEscapeError(
            f"path {path!r} is outside the sandbox's writable areas ({', '.join(AREAS)})")
    return full


def host_node() -> str | None:
    """The host's ``node`` executable (resolved), the runtime the agent CLIs were installed
    and checked with, or ``None``."""
    found = shutil.which("node")
    return os.path.realpath(found) if found else None


def _helper_outcome(status: int | None, _reported: bool) -> Outcome:
    """A helper's outcome (it has no working directory of the caller's to miss)."""
    return docker_outcome(status, WORKDIR)


def _not_area(path: str) -> str:
    if path in AREAS:
        raise PathEscapeError(f"{path!r} is one of the sandbox's areas: it cannot be removed "
                              "or renamed")
    return path


# ---------------------------------------------------------------------- handle


class _DockerProcessApi:
    def __init__(self, handle: DockerHandle) -> None:
        self._h = handle

    async def spawn(self, command: Command, *, cwd: str | None = None,
                    env: Mapping[str, str] | None = None) -> Process:
        return await self._h.start(to_argv(command), cwd=cwd, env=env)

    async def exec(self, command: Command, *, cwd: str | None = None,
                   env: Mapping[str, str] | None = None, stdin: bytes | None = None,
                   timeout: float | None = None) -> Any:
        return await self._h.run(to_argv(command), cwd=cwd, env=env, stdin=stdin,
                                 timeout=timeout)


def _fs_error(path: str, stderr: bytes) -> OSError:
    """The error the helper reported (exit 3: a JSON line on stderr) for ``path``. The
    helper runs as the agent's uid, so its answer is read as hostile: any other shape is
    an I/O error, never a host traceback."""
    try:
        err = json.loads(stderr)
    except ValueError:
        err = None
    if not isinstance(err, dict):
        return OSError(5, f"the sandbox's file helper failed: "
                          f"{stderr.decode(errors='replace').strip()[:200]}", path)
    if err.get("escape") is True:
        return PathEscapeError(f"path {path!r} resolves outside the sandbox's writable "
                               f"areas ({', '.join(AREAS)})")
    code = err.get("errno")
    if not isinstance(code, int) or isinstance(code, bool) or not 0 < code < 4096:
        code = 5
    return OSError(code, str(err.get("msg", ""))[:200], path)


_FILE_TYPES = ("file", "dir", "symlink", "other")


def _bad_answer(op: str, path: str) -> OSError:
    return OSError(5, f"the sandbox's file helper gave a malformed answer to {op}", path)


def _file_info(item: Any, op: str, path: str) -> FileInfo:
    """One ``FileInfo`` from the helper's JSON, checked field by field (hostile input)."""
    if not isinstance(item, dict) or set(item) != {"path", "name", "type", "size", "mtime",
                                                   "mode"}:
        raise _bad_answer(op, path)
    ok = (isinstance(item["path"], str) and isinstance(item["name"], str)
          and item["type"] in _FILE_TYPES
          and all(isinstance(item[k], int) and not isinstance(item[k], bool)
                  for k in ("size", "mode"))
          and isinstance(item["mtime"], int | float) and not isinstance(item["mtime"], bool))
    if not ok:
        raise _bad_answer(op, path)
    return FileInfo(path=item["path"], name=item["name"], type=item["type"],
                    size=item["size"], mtime=float(item["mtime"]), mode=item["mode"])


def _json_answer(raw: bytes, op: str, path: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        raise _bad_answer(op, path) from None


class _DockerFS:
    """The sandbox's files, through the handle's file server, else the in-container helper
    per operation (as the agent's uid either way)."""

    def __init__(self, handle: DockerHandle) -> None:
        self._h = handle

    async def _op(self, op: str, path: str, *, data: bytes | None = None,
                  **extra: Any) -> bytes:
        full = confine(path)
        head = {"op": op, "path": full, **extra}
        answer = await self._h.fs_servers.call(head, path, data)
        if answer is not None:  # the handle's file server
            if not answer.ok:
                raise _fs_error(path, answer.payload)
            return answer.data if op == "read" else answer.payload
        res = await self._h.run_helper("fs", head, data)
        if res.exit_code == 3:
            raise _fs_error(path, res.stderr)
        if not res.ok:
            raise OSError(5, f"file operation {op} failed: {res.describe()}: "
                             f"{res.stderr.decode(errors='replace').strip()[:200]}", path)
        return res.stdout

    async def read(self, path: str) -> bytes:
        return await self._op("read", path)

    async def write(self, path: str, data: bytes, *, mode: int | None = None) -> None:
        await self._op("write", path, data=bytes(data), mode=mode)

    async def read_stream(self, path: str, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        full = confine(path)
        served = await self._h.fs_servers.read_stream({"op": "read", "path": full}, path)
        if served is not None:
            async with contextlib.aclosing(served):
                buf = bytearray()
                async for chunk in served:
                    buf += chunk
                    while len(buf) >= chunk_size:
                        yield bytes(buf[:chunk_size])
                        del buf[:chunk_size]
                if buf:
                    yield bytes(buf)
            return
        proc = await self._h.start_helper("fs", {"op": "read", "path": full})
        await proc.close_stdin()
        buf = bytearray()
        try:
            async for chunk in proc.stdout:
                buf += chunk
                while len(buf) >= chunk_size:
                    yield bytes(buf[:chunk_size])
                    del buf[:chunk_size]
            err = b"".join([c async for c in proc.stderr])
            res = await proc.wait()
            if res.exit_code == 3:
                raise _fs_error(path, err)
            if buf:
                yield bytes(buf)
        finally:
            with anyio.CancelScope(shield=True):
                await proc.aclose()

    async def write_stream(self, path: str, chunks: AsyncIterator[bytes]) -> int:
        full = confine(path)
        served = await self._h.fs_servers.write_stream({"op": "write", "path": full}, path,
                                                       chunks)
        if served is not None:
            answer, written = served
            if not answer.ok:
                raise _fs_error(path, answer.payload)
            return written
        proc = await self._h.start_helper("fs", {"op": "write", "path": full})
        total = 0
        try:
            async for chunk in chunks:
                await proc.write_stdin(chunk)
                total += len(chunk)
            await proc.close_stdin()
            err = b"".join([c async for c in proc.stderr])
            res = await proc.wait()
        finally:
            with anyio.CancelScope(shield=True):
                await proc.aclose()
        if res.exit_code == 3:
            raise _fs_error(path, err)
        return total

    async def list(self, path: str = ".") -> list[FileInfo]:
        out = _json_answer(await self._op("list", path), "list", path)
        if not isinstance(out, list):
            raise _bad_answer("list", path)
        return [_file_info(item, "list", path) for item in out]

    async def stat(self, path: str) -> FileInfo:
        return _file_info(_json_answer(await self._op("stat", path), "stat", path), "stat", path)

    async def exists(self, path: str) -> bool:
        out = _json_answer(await self._op("exists", path), "exists", path)
        if not isinstance(out, bool):
            raise _bad_answer("exists", path)
        return out

    async def mkdir(self, path: str, *, parents: bool = True) -> None:
        await self._op("mkdir", path, parents=parents)

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        _not_area(confine(path))
        await self._op("remove", path, recursive=recursive)

    async def rename(self, src: str, dst: str) -> None:
        _not_area(confine(src))
        await self._op("rename", src, dst=_not_area(confine(dst)))


class DockerHandle:
    """A live Docker sandbox (its container)."""

    def __init__(self, provider: DockerProvider, sandbox_id: str, info: Mapping[str, Any]) -> None:
        self._provider = provider
        self._id = sandbox_id
        self._info = info
        self._fs = _DockerFS(self)
        self._process = _DockerProcessApi(self)
        self.fs_servers = provider.fs_servers(self)

    @property
    def id(self) -> str:
        return self._id

    @property
    def ref(self) -> SandboxRef:
        return SandboxRef("docker", self._id)

    @property
    def container(self) -> str:
        """The container's name."""
        return container_name(self._id)

    @property
    def workdir(self) -> str:
        return WORKDIR

    @property
    def capabilities(self) -> Capabilities:
        return DOCKER_CAPABILITIES

    @property
    def process(self) -> ProcessApi:
        return self._process

    @property
    def fs(self) -> _DockerFS:
        return self._fs

    @property
    def labels(self) -> Mapping[str, str]:
        return dict(self._info.get("Config", {}).get("Labels") or {})

    @property
    def image(self) -> str:
        """The image the container was made from."""
        return str(self._info.get("Config", {}).get("Image") or self._provider.image)

    @property
    def created_at(self) -> float:
        return _epoch(self.labels.get("corral.created-at"))

    @property
    def binds(self) -> builtins.list[tuple[str, str]]:
        """The read-only host path -> container path binds it was created with."""
        return [(str(m.get("Source")), str(m.get("Destination")))
                for m in self._info.get("Mounts") or [] if m.get("Type") == "bind"]

    async def host_gid(self) -> int | None:
        """The agent's gid on the host (:class:`corral.sandbox._contracts.SandboxIds`)."""
        runtime = (self._info.get("HostConfig") or {}).get("Runtime")
        return await self._provider.agent_host_gid(runtime)

    async def connect_port(self, port: int) -> str:
        raise UnsupportedCapability("docker", "ports",
                                    "expose the service over a unix socket bind instead")

    @property
    def private_dir(self) -> str:
        raise UnsupportedCapability("docker", "host_processes",
                                    "the container's private state is read through the API")

    def host_command(self, command: Command, *, cwd: str | None = None,
                     env: Mapping[str, str] | None = None) -> HostCommand:
        raise UnsupportedCapability("docker", "host_processes",
                                    "commands run through the Docker API, not a host process")

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        merged = dict(BASE_ENV)
        spec_env = self._info.get("Config", {}).get("Env") or []
        for item in spec_env:
            key, _, value = item.partition("=")
            merged[key] = value
        for key, value in (env or {}).items():
            check_env_name(key)
            if not isinstance(value, str) or "\x00" in value:
                raise ConfigError(f"environment variable {key!r}: the value must be a string "
                                  "without NUL")
            merged[key] = value
        return merged

    # ------------------------------------------------------------ commands

    async def _agent(self) -> AgentConnection | None:
        """The connection to this handle's agent (started if needed), or None when
        commands take ``docker exec`` (see :meth:`DockerProvider.command_path`)."""
        link = self._provider.agent_link(self._id)
        if link is None:
            return None
        conn = link.live()
        if conn is not None:
            return conn
        try:
            return await link.connection()
        except AgentUnavailable as exc:
            self._check_running()  # destroyed meanwhile: say that instead
            self._provider.agent_failed(str(exc))
            return None
        except Exception as exc:
            raise self._provider.translate(exc, self._id) from None

    def _gone(self) -> bool:
        """Whether the container is gone or stopped (blocking: only asked when an agent's
        stream ended under a running command)."""
        try:
            info = self._provider.api.inspect_container(self.container)
        except Exception:  # noqa: BLE001 - gone, or the daemon with it
            return True
        return not (info.get("State") or {}).get("Running")

    def _check_running(self) -> None:
        if self._gone():
            raise SandboxGoneError(f"sandbox {self._id!r} (docker) no longer exists or is "
                                   "not running")

    def _lost(self, exc: AgentLost) -> BaseException:
        if self._gone():
            return SandboxGoneError(f"sandbox {self._id!r} (docker) was destroyed while a "
                                    "command ran")
        return exc

    async def run(self, argv: list[str], *, cwd: str | None, env: Mapping[str, str] | None,
                  stdin: bytes | None, timeout: float | None) -> ExecResult:
        """``exec``: through the agent (one request), else ``docker exec``."""
        want = cwd or WORKDIR
        full = confine(want)
        conn = await self._agent()
        if conn is None:
            proc = await self._exec_start(argv, full, want, env)
            return await collect(proc, stdin=stdin, timeout=timeout)
        blob = launch_fields(full, self._env(env), argv)
        try:
            return await conn.run(blob, lambda st, _rep: docker_outcome(st, want), self._gone,
                                  stdin=stdin, timeout=timeout)
        except AgentLost as exc:
            raise self._lost(exc) from None

    async def start(self, argv: list[str], *, cwd: str | None,
                    env: Mapping[str, str] | None) -> DockerProcess | AgentProcess:
        """``spawn``: through the agent, else ``docker exec``."""
        want = cwd or WORKDIR
        full = confine(want)
        conn = await self._agent()
        if conn is None:
            return await self._exec_start(argv, full, want, env)
        blob = launch_fields(full, self._env(env), argv)
        try:
            return await conn.start(blob, lambda st, _rep: docker_outcome(st, want),
                                    self._gone)
        except AgentLost as exc:
            raise self._lost(exc) from None

    async def _start_fs_server(self) -> AgentProcess | None:
        """A file server (the helper's ``serve`` mode, as the agent's uid) through the
        agent, or None when commands take ``docker exec``."""
        conn = await self._agent()
        if conn is None:
            return None
        blob = launch_fields(WORKDIR, BASE_ENV, helper_argv("serve"))
        try:
            return await conn.start(blob, _helper_outcome, self._gone)
        except AgentLost as exc:
            raise self._lost(exc) from None

    async def run_helper(self, mode: str, obj: Mapping[str, Any],
                         data: bytes | None) -> ExecResult:
        """The in-container helper's ``mode`` (as the agent's uid) to its end, ``data`` on
        its stdin after the header: through the agent when there is one."""
        conn = await self._agent()
        if conn is None:
            proc = await self._exec_helper(mode, obj)
            return await collect(proc, stdin=data, timeout=None)
        blob = launch_fields(WORKDIR, BASE_ENV, helper_argv(mode))
        try:
            return await conn.run(blob, _helper_outcome, self._gone,
                                  stdin=header(obj) + (data or b""), timeout=None)
        except AgentLost as exc:
            raise self._lost(exc) from None

    async def start_helper(self, mode: str, obj: Mapping[str, Any],
                           user: str | None = None) -> DockerProcess | AgentProcess:
        """Start the helper's ``mode`` with ``obj`` as its header: as the agent's uid through
        the agent when there is one, else (and as root, ``user="0:0"``) ``docker exec``."""
        if user is None:
            conn = await self._agent()
            if conn is not None:
                blob = launch_fields(WORKDIR, BASE_ENV, helper_argv(mode))
                try:
                    proc = await conn.start(blob, _helper_outcome, self._gone)
                    await proc.write_stdin(header(obj))
                except AgentLost as exc:
                    raise self._lost(exc) from None
                except BrokenPipeError:
                    pass  # the helper ended at once: its status says why
                return proc
        return await self._exec_helper(mode, obj, user)

    async def _exec_start(self, argv: list[str], full: str, want: str,
                          env: Mapping[str, str] | None) -> DockerProcess:
        merged = self._env(env)
        p = self._provider
        try:
            return await anyio.to_thread.run_sync(lambda: start_exec(
                p.api, self.container, uid=p.uid, argv=argv, env=merged, cwd=full,
                killer=self._kill_tagged, inspect_exec=p.inspect_exec, cwd_name=want))
        except Exception as exc:
            raise self._provider.translate(exc, self._id) from None

    async def _exec_helper(self, mode: str, obj: Mapping[str, Any],
                           user: str | None = None) -> DockerProcess:
        p = self._provider
        try:
            return await anyio.to_thread.run_sync(lambda: start_helper(
                p.api, self.container, mode, obj, user=user or p.user,
                inspect_exec=p.inspect_exec))
        except Exception as exc:
            raise self._provider.translate(exc, self._id) from None

    # ------------------------------------------------------------ durable runs (inside)

    async def _root(self, mode: str, obj: Mapping[str, Any]) -> Any:
        """Run the in-container supervisor script's ``mode`` as root; its result."""
        proc = await self._exec_helper(mode, obj, user="0:0")
        return await collect(proc, stdin=None, timeout=120)

    async def launch_supervised(
        self, run: str, *, argv: Sequence[str], env: Mapping[str, str], cwd: str | None,
        nonce: str, stdin: bytes | None, timeout: float | None, max_output: int | None,
        redact: Mapping[str, str],
    ) -> int:
        """Start the run's supervisor as root in the container (see
        :mod:`corral._insandbox.container_supervisor`); the agent runs as the agent's uid."""
        res = await self._root("start", {
            "run": run, "argv": list(argv), "env": self._env(env),
            "cwd": confine(cwd or WORKDIR), "uid": self._provider.uid, "nonce": nonce,
            "stdin": (stdin or b"").decode("latin-1"), "timeout": timeout,
            "max_output": max_output, "redact": dict(redact)})
        if not res.ok:
            raise ConfigError(f"starting the run's supervisor in sandbox {self._id!r} failed "
                              f"({res.describe()}): {res.stderr.decode(errors='replace')[-300:]}")
        return int(json.loads(res.stdout)["pid"])

    async def read_journal(self, run: str, name: str, offset: int,
                           limit: int = 4 << 20) -> bytes | None:
        res = await self._root("read", {"run": run, "name": name, "offset": offset,
                                        "limit": limit})
        if res.exit_code == 4:
            return None
        if not res.ok:
            raise OSError(5, f"reading the journal in sandbox {self._id!r} failed: "
                             f"{res.describe()}")
        data: bytes = res.stdout
        return data

    async def supervisor_status(self, run: str) -> Mapping[str, Any]:
        res = await self._root("status", {"run": run})
        doc: Mapping[str, Any] = json.loads(res.stdout or b"{}") if res.ok else {}
        return doc

    async def stop_supervised(self, run: str, grace: float = 2.0) -> None:
        await self._root("stop", {"run": run, "grace": grace})

    def _kill_tagged(self, token: str, sig: int) -> None:
        """Signal every process carrying ``token`` (blocking; the helper's ``kill`` mode)."""
        p = self._provider
        with contextlib.suppress(Exception):
            _exec_id, sock = open_exec(p.api, self.container, "kill", user=p.user,
                                       head=fields(token, str(sig)))
            run_to_end(sock)


# ---------------------------------------------------------------------- provider


class DockerProvider:
    """Sandboxes as Docker containers (see the module docstring for the isolation).

    ``image`` is any image with ``/bin/sh`` and ``python3`` (corral's helpers are stdlib
    Python; default: corral's base image from ``corral images build``); ``runtime`` an OCI
    runtime the daemon knows (``"runsc"`` for gVisor); ``limits`` the defaults for fields
    a spec leaves ``None``; ``docker_host`` the daemon (default ``$DOCKER_HOST`` or the local
    socket); ``uid`` the agent's uid.
    """

    config_model: type[ProviderConfig] = DockerConfig

    def __init__(self, image: str | None = None, *, runtime: str | None = None,
                 limits: ResourceLimits | Mapping[str, Any] = DEFAULT_LIMITS,
                 docker_host: str | None = None, uid: int = 1000, agent: bool = True) -> None:
        docker_errors()  # the SDK is installed, or a one-line error naming the extra
        self.use_agent = agent
        self.agent_problem: str | None = None
        self._agent_binary: Path | None | bool = False  # False: not looked for yet
        self._links: dict[str, DockerAgentLink] = {}
        self._fs_servers: dict[str, FsServers] = {}
        self.image = image or BASE_IMAGE
        self.runtime = runtime
        self._limits = _limits_from(limits)
        self.docker_host = docker_host
        self.uid = uid
        self.user = f"{uid}:{uid}"
        self._client: Any = None
        self._remaps: bool | None = None

    async def agent_host_gid(self, runtime: str | None) -> int | None:
        """The gid the agent's processes have on the host: the agent's own (``uid``) when
        the daemon is local, maps no ids (no user-namespace remapping, not rootless) and
        the runtime is runc or crun (gVisor's gofer, for one, makes the host connections
        itself); ``None`` otherwise."""
        if not daemon_is_local(self.docker_host) or (runtime or "runc") not in ("runc",
                                                                               "crun"):
            return None
        if self._remaps is None:
            def remaps() -> bool:
                options = self.api.info().get("SecurityOptions") or []
                return any("userns" in o or "rootless" in o for o in map(str, options))

            self._remaps = await anyio.to_thread.run_sync(remaps)
        return None if self._remaps else self.uid

    # ------------------------------------------------------------ the agent

    def _find_agent(self) -> Path | None:
        if self._agent_binary is False:
            from corral.providers._bwrap_init import find_init

            program = find_init()
            binary = program.agent if program.kind == "c" else None
            arch = None
            with contextlib.suppress(Exception):
                arch = str(self.api.info().get("Architecture") or "") or None
            problem = agent_problem(binary, arch)
            if problem is not None:
                self.agent_failed(problem if binary is not None
                                  else f"no compiled agent ({program.reason})")
            self._agent_binary = binary
        return self._agent_binary if isinstance(self._agent_binary, Path) else None

    def agent_link(self, sandbox_id: str) -> DockerAgentLink | None:
        """The way to the sandbox's agent (one per sandbox in this provider), or None when
        commands take ``docker exec``."""
        link = self._links.get(sandbox_id)
        if link is not None:
            return link if self.agent_problem is None else None
        if not self.use_agent or self.agent_problem is not None:
            return None
        binary = self._find_agent()
        if binary is None or self.agent_problem is not None:
            return None
        link = self._links[sandbox_id] = DockerAgentLink(
            lambda: self.api, container_name(sandbox_id), self.uid,
            f"sandbox {sandbox_id!r}", binary)
        return link

    def agent_failed(self, reason: str) -> None:
        """An agent could not start: this provider's commands take ``docker exec`` from now
        on (said once in the log, and by :meth:`command_path`)."""
        if self.agent_problem is None:
            self.agent_problem = reason
            _log.warning("docker: commands take docker exec (%s)", reason)

    def command_path(self) -> tuple[Literal["agent", "exec"], str]:
        """How commands start, and why: ``"agent"`` (one long-lived agent per sandbox
        behind one exec stream, :mod:`corral.providers._docker_agent`) or ``"exec"`` (a
        ``docker exec`` per command)."""
        if not self.use_agent:
            return "exec", "the agent is turned off (agent = false)"
        if self.agent_problem is None:
            self._find_agent()
        if self.agent_problem is not None:
            return "exec", self.agent_problem
        return "agent", f"one agent per sandbox over one exec stream ({self._agent_binary})"

    def fs_servers(self, handle: DockerHandle) -> FsServers:
        """The sandbox's file servers: one pool per sandbox in this provider, like its agent
        link (a handle made per turn must not leave servers behind)."""
        servers = self._fs_servers.get(handle.id)
        if servers is None:
            servers = self._fs_servers[handle.id] = FsServers(
                handle._start_fs_server, handle._gone, _fs_error, f"sandbox {handle.id!r}")
        return servers

    def _drop_link(self, sandbox_id: str) -> None:
        self._fs_servers.pop(sandbox_id, None)  # they end with the agent's stream
        link = self._links.pop(sandbox_id, None)
        if link is not None:
            link.close()

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = connect(self.docker_host)
        return self._client

    @property
    def api(self) -> Any:
        return self.client.api

    async def preflight(self) -> None:
        """Connect to the daemon now (a run checks this before it records anything):
        :class:`DockerUnavailable` with the fix when it does not answer."""
        if self._client is None:
            self._client = await anyio.to_thread.run_sync(connect, self.docker_host)

    @property
    def name(self) -> str:
        return "docker"

    @property
    def capabilities(self) -> Capabilities:
        return DOCKER_CAPABILITIES

    @property
    def host_route(self) -> HostRoute:
        """Unix sockets bound in from this host when the daemon is local; none when it is
        remote (host services cannot reach its containers)."""
        return "unix-socket" if daemon_is_local(self.docker_host) else "none"

    @property
    def default_limits(self) -> ResourceLimits:
        return self._limits

    def fingerprint(self) -> str:
        lim = self._limits
        raw = json.dumps({"v": 1, "image": self.image, "runtime": self.runtime, "uid": self.uid,
                          "limits": [lim.memory_bytes, lim.pids, lim.cpus]}, sort_keys=True)
        return hashlib.sha256(raw.encode()).hexdigest()

    def translate(self, exc: BaseException, sandbox_id: str) -> BaseException:
        """A Docker SDK error as corral's."""
        errors = docker_errors()
        if isinstance(exc, errors.NotFound):
            return SandboxGoneError(
                f"sandbox {sandbox_id!r} (docker) no longer exists; create a new one")
        if isinstance(exc, errors.APIError):
            text = str(exc.explanation or exc)
            if "is not running" in text:
                return SandboxGoneError(f"sandbox {sandbox_id!r} (docker) is not running")
            return ConfigError(f"docker: {text.splitlines()[0]}")
        if isinstance(exc, errors.DockerException | OSError):
            return unavailable(exc, self.docker_host)
        return exc

    def inspect_exec(self, exec_id: str) -> Any:
        try:
            return self.api.exec_inspect(exec_id)
        except Exception as exc:
            raise self.translate(exc, "?") from None

    def _limits_for(self, spec: SandboxSpec) -> ResourceLimits:
        if spec.limits.disk_bytes is not None:
            raise UnsupportedCapability("docker", "disk limit",
                                        "the docker provider cannot enforce a disk limit; "
                                        "leave limits.disk unset")
        return merged_limits(self._limits, spec.limits)

    def container_config(self, sandbox_id: str, spec: SandboxSpec,
                         image: str | None = None) -> dict[str, Any]:
        """The create call's arguments (what ``docker inspect`` will show: no secret)."""
        from docker.types import Mount  # the SDK, an optional extra: see _docker_client

        lim = self._limits_for(spec)
        for key, value in spec.env.items():
            check_env_name(key)
            if not isinstance(value, str) or "\x00" in value:
                raise ConfigError(f"environment variable {key!r}: the value must be a string "
                                  "without NUL")
        labels = {str(k): str(v) for k, v in spec.labels.items()}
        labels.update({LABEL: "1", "corral.sandbox": sandbox_id,
                       "corral.created-by": CREATED_BY,
                       "corral.created-at": f"{time.time():.3f}",
                       "corral.home-agent": self.user})
        mounts = [Mount(target, name, type="volume", labels={LABEL: "1",
                                                             "corral.sandbox": sandbox_id})
                  for target, name in volume_names(sandbox_id).items()]
        env = dict(spec.env)
        for host, inside in spec.binds:
            mounts.append(Mount(inside, host, type="bind", read_only=True))
        node = host_node()
        if node is not None and any(inside == AGENTS_TARGET for _h, inside in spec.binds):
            # Agent CLIs are npm packages: they run on the host's node (a single executable
            # needing glibc and libstdc++), the one `corral agents install` checked them
            # with, whatever the image brings (bubblewrap sees the host's /usr likewise).
            mounts.append(Mount(f"{NODE_DIR}/node", node, type="bind", read_only=True))
            env["PATH"] = f"{NODE_DIR}:{env.get('PATH', BASE_ENV['PATH'])}"
        host_config = self.api.create_host_config(
            mounts=mounts,
            tmpfs=_tmpfs(lim.memory_bytes),
            read_only=True,
            cap_drop=["ALL"],
            cap_add=ROOT_CAPS,
            security_opt=["no-new-privileges"],
            network_mode="bridge" if spec.network else "none",
            pids_limit=lim.pids,
            mem_limit=lim.memory_bytes,
            memswap_limit=lim.memory_bytes,
            nano_cpus=int(lim.cpus * 1e9) if lim.cpus else None,
            init=True,
            runtime=self.runtime,
            ipc_mode="private",
        )
        return {
            "image": image or self.image,
            "command": ["sleep", "infinity"],
            "name": container_name(sandbox_id),
            "labels": labels,
            "environment": [f"{k}={v}" for k, v in env.items()],
            "working_dir": WORKDIR,
            "host_config": host_config,
            "hostname": "sandbox",
        }

    async def create(self, spec: SandboxSpec | None = None, *,
                     image: str | None = None) -> DockerHandle:
        """A new sandbox (``image``: another than the provider's, e.g. a snapshot's)."""
        spec = spec or SandboxSpec()
        sandbox_id = validate_id(spec.name) if spec.name is not None else new_id()
        return await self._create(sandbox_id, spec, image or self.image)

    def snapshotter(self, *, redactor: Redactor | None = None) -> DockerSnapshots:
        """Snapshots are committed images without secrets (:mod:`._docker_snapshots`)."""
        # made on request: that module imports this one (its handle, the areas)
        from corral.providers._docker_snapshots import DockerSnapshots

        return DockerSnapshots(self, redactor=redactor)

    async def _create(self, sandbox_id: str, spec: SandboxSpec, image: str) -> DockerHandle:
        config = self.container_config(sandbox_id, spec, image)
        errors = docker_errors()

        def make() -> Any:
            api = self.api
            self._no_planted_volumes(sandbox_id)
            try:
                api.create_container(**config)
            except errors.APIError as exc:
                if exc.status_code == 409:
                    raise ConfigError(
                        f"sandbox {sandbox_id!r} already exists: pick another name or remove "
                        f"it with `corral sandboxes rm {sandbox_id}`") from None
                if exc.status_code == 404 and "image" in str(exc.explanation).lower():
                    raise ConfigError(
                        f"docker image {image!r} not found: build corral's base image with "
                        "`corral images build`, or set [provider] image") from None
                raise
            try:
                api.start(config["name"])
                if image != self.image or self.image != BASE_IMAGE:
                    self._own_areas(config["name"])
                return api.inspect_container(config["name"])
            except BaseException:
                self._remove(sandbox_id)
                raise

        try:
            info = await anyio.to_thread.run_sync(make)
        except (ConfigError, UnsupportedCapability):
            raise
        except Exception as exc:
            raise self.translate(exc, sandbox_id) from None
        return DockerHandle(self, sandbox_id, info)

    def _no_planted_volumes(self, sandbox_id: str) -> None:
        """Refuse to make a sandbox whose volumes exist already: the daemon would mount
        them as they are (files someone planted, or an earlier sandbox's of the same name),
        and destroying the sandbox would remove volumes that are not its own."""
        errors = docker_errors()
        for name in volume_names(sandbox_id).values():
            try:
                self.api.inspect_volume(name)
            except errors.NotFound:
                continue
            raise ConfigError(
                f"docker volume {name} already exists: sandbox {sandbox_id!r} would use "
                f"files it did not make; pick another name, or remove the volume "
                f"(docker volume rm {name}) if it is an old sandbox's")

    def _own_areas(self, container: str) -> None:
        """Give the agent its writable areas (an image without them, or root-owned)."""
        exec_id, sock = open_exec(self.api, container, "fs", user="0:0", head=header(
            {"op": "chown", "path": WORKDIR, "paths": [WORKDIR, HOME],
             "uid": self.uid, "gid": self.uid}))
        run_to_end(sock)
        code = self.api.exec_inspect(exec_id).get("ExitCode")
        if code != 0:
            raise ConfigError(f"docker image {self.image!r}: setting up the sandbox failed "
                              f"(exit {code}); the image needs /bin/sh and python3")

    async def resume(self, ref: SandboxRef | str) -> DockerHandle | None:
        sandbox_id = ref.id if isinstance(ref, SandboxRef) else ref
        try:
            validate_id(sandbox_id)
        except ConfigError:
            return None
        errors = docker_errors()

        def find() -> Any:
            try:
                info = self.api.inspect_container(container_name(sandbox_id))
            except errors.NotFound:
                return None
            if (info.get("Config", {}).get("Labels") or {}).get(LABEL) != "1":
                return None
            if not info.get("State", {}).get("Running"):
                if info.get("State", {}).get("Status") in ("removing", "dead"):
                    return None
                try:  # e.g. after a daemon restart
                    self.api.start(container_name(sandbox_id))
                    info = self.api.inspect_container(container_name(sandbox_id))
                except errors.NotFound:
                    return None
                except errors.APIError as exc:
                    # `docker rm -f` stops it before it is "removing": it is going
                    if exc.status_code == 409 and "removal" in str(exc.explanation or exc):
                        return None
                    raise
            return info

        try:
            info = await anyio.to_thread.run_sync(find)
        except Exception as exc:
            raise self.translate(exc, sandbox_id) from None
        return DockerHandle(self, sandbox_id, info) if info is not None else None

    def _remove(self, sandbox_id: str) -> None:
        errors = docker_errors()
        image = None
        with contextlib.suppress(errors.NotFound):
            image = self.api.inspect_container(container_name(sandbox_id)).get("Image")
            self.api.remove_container(container_name(sandbox_id), force=True, v=True)
        if image:
            self._drop_deleted_snapshot(image)
        # a loaded daemon takes seconds to let go of a removed container's volumes: 2 s
        # was not enough (volumes were left behind, and since a sandbox whose volumes
        # exist is refused, a named sandbox could not be made again)
        deadline = time.monotonic() + 30
        for name in volume_names(sandbox_id).values():
            while True:
                try:
                    self.api.remove_volume(name, force=True)
                    break
                except errors.NotFound:
                    break
                except errors.APIError as exc:
                    # 409, in use: the container is still going away
                    if exc.status_code != 409 or time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)

    def _drop_deleted_snapshot(self, image: str) -> None:
        """A snapshot image deleted while a sandbox restored from it lived is only untagged;
        remove it with its last sandbox."""
        errors = docker_errors()
        with contextlib.suppress(errors.APIError):
            info = self.api.inspect_image(image)
            if ((info.get("Config") or {}).get("Labels") or {}).get("corral.snapshot") and \
                    not info.get("RepoTags"):
                self.api.remove_image(image)

    async def destroy(self, ref: SandboxRef | str) -> None:
        sandbox_id = ref.id if isinstance(ref, SandboxRef) else ref
        try:
            validate_id(sandbox_id)
        except ConfigError:
            return
        self._drop_link(sandbox_id)
        try:
            await anyio.to_thread.run_sync(self._remove, sandbox_id)
        except Exception as exc:
            raise self.translate(exc, sandbox_id) from None

    def _labelled(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.api.containers(all=True,
                                                          filters={"label": f"{LABEL}=1"})
        return found

    async def list(self) -> list[SandboxRef]:
        try:
            found = await anyio.to_thread.run_sync(self._labelled)
        except Exception as exc:
            raise self.translate(exc, "?") from None
        return [SandboxRef("docker", c["Labels"]["corral.sandbox"]) for c in found
                if (c.get("Labels") or {}).get("corral.sandbox")
                and _named_as_labelled(c, c["Labels"])]

    async def labelled(self) -> builtins.list[LabelledSandbox]:
        """Every corral container with its labels (orphan collection, :mod:`corral.sandbox._gc`)."""
        try:
            found = await anyio.to_thread.run_sync(self._labelled)
        except Exception as exc:
            raise self.translate(exc, "?") from None
        out = []
        for c in found:
            labels = dict(c.get("Labels") or {})
            if labels.get("corral.sandbox") and _named_as_labelled(c, labels):
                # a label anyone with the daemon can set: a bad one falls back to the
                # daemon's own creation time, and never stops the listing
                created = _epoch(labels.get("corral.created-at"), c.get("Created"))
                out.append(LabelledSandbox(labels["corral.sandbox"], labels, created))
        return out

    async def snapshot(self, handle: object, label: str = "") -> SnapshotRef:
        raise UnsupportedCapability("docker", "snapshots",
                                    "use the provider's snapshotter() (they need a redactor)")

    async def restore(self, snapshot: SnapshotRef, spec: SandboxSpec | None = None) -> DockerHandle:
        raise UnsupportedCapability("docker", "snapshots",
                                    "use the provider's snapshotter() (they need a redactor)")

