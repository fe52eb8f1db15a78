"""On-disk state of host-directory sandboxes (local and bubblewrap).

Layout of one sandbox, ``$CORRAL_HOME/sandboxes/<provider>/<id>/``::

    state.json   what the sandbox was created with (written atomically, last); the
                 local provider keeps it in the directory's ``user.corral.state``
                 extended attribute instead, where the filesystem has them
    root/        the sandbox's writable areas, mirroring its view:
                 root/workspace, root/tmp, root/home/agent
    private/     host-only files (journals, nonces); never mounted into the sandbox
    etc/         generated passwd/group (bubblewrap)

(The local provider makes ``root/`` and ``private/`` on first use: ``_localdirs``.)

A sandbox exists when its state does; ``resume`` from any process reads it. The state is
written whole or not at all (a file renamed into place, or one ``setxattr``), and what
does not parse as a whole state is never taken for a sandbox: a directory whose create
died before its state was written is not listed, resumes as None and is removed by
``destroy``; a state that is there but unreadable is refused (:class:`ConfigError`).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import os
import queue
import re
import secrets
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from corral._errors import ConfigError
from corral._paths import corral_home
from corral.sandbox._contracts import ResourceLimits, SandboxSpec, check_env_name

__all__ = ["AREAS_REL", "STATE_XATTR", "SandboxState", "new_id", "provider_root",
           "state_exists", "validate_id"]

STATE_XATTR = "user.corral.state"
"""The extended attribute of a sandbox directory that holds its state (local provider)."""
# setxattr errors that mean "no such attribute here" (the filesystem has no user xattrs,
# or not of that size): the state goes to state.json instead.
_NO_XATTR = frozenset({errno.ENOTSUP, errno.EOPNOTSUPP, errno.E2BIG, errno.ERANGE,
                       errno.ENOSPC, errno.EPERM, errno.EACCES})

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
AREAS_REL = ("workspace", "tmp", "home/agent")


def validate_id(sandbox_id: str) -> str:
    """Return ``sandbox_id`` if it is a valid sandbox id, else raise :class:`ConfigError`."""
    if not isinstance(sandbox_id, str) or not _ID_RE.match(sandbox_id) or ".." in sandbox_id:
        raise ConfigError(
            f"invalid sandbox id {sandbox_id!r}: use 1-64 characters from A-Z a-z 0-9 _ . - "
            "starting with a letter or digit"
        )
    return sandbox_id


def new_id() -> str:
    return "sb-" + os.urandom(6).hex()  # secrets.token_hex(6), without its two calls


_made_roots: set[Path] = set()


def provider_root(provider: str, home: Path | None = None) -> Path:
    """``$CORRAL_HOME/sandboxes/<provider>``, created on demand (once per process: a root
    removed later is remade by ``make_sandbox_dir``)."""
    path = (home or corral_home()) / "sandboxes" / provider
    if path not in _made_roots or not path.is_dir():
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        if path not in _made_roots:
            _queue_left_graves(path)
        _made_roots.add(path)
    return path


@dataclass(slots=True)
class SandboxState:
    """What ``state.json`` holds."""

    id: str
    provider: str
    token: str
    """Random per-sandbox tag: names its cgroups and marks its processes."""
    created_at: float = field(default_factory=time.time)
    env: dict[str, str] = field(default_factory=dict)
    memory_bytes: int | None = None
    pids: int | None = None
    cpus: float | None = None
    disk_bytes: int | None = None
    """The disk limit in force (None: none is enforced)."""
    disk_fsid: str = ""
    """UUID of the btrfs pool holding the files dir as a quota-limited subvolume, if so."""
    disk_subvol: int = 0
    """That subvolume's id (its quota group is ``0/<id>``)."""
    network: bool = False
    binds: list[tuple[str, str]] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    host_uid: int | None = None
    cgroups: list[str] = field(default_factory=list)
    """Cgroup directories (one per v1 controller) every process of the sandbox joins."""
    kill_group: str = ""
    """The cgroup v2 directory that holds every process of the sandbox, made on its first
    launch (local provider; ``""``: none, destroy falls back to the environment tag)."""
    limit_mode: str = "none"
    """How limits are enforced: ``cgroup``, ``rlimit`` or ``none``."""
    destroying: bool = False
    """Read from a sandbox whose destroy began; it cannot be resumed, only destroyed."""
    files_dir: str = ""
    """Directory holding ``root/`` (the writable areas) and ``etc/``; the sandbox dir itself
    unless the sandbox runs as another host uid, which must be able to traverse to it."""

    @classmethod
    def from_spec(cls, sandbox_id: str, provider: str, spec: SandboxSpec) -> SandboxState:
        for key, value in spec.env.items():
            _check_env(key, value)
        for host, inside in spec.binds:
            if not os.path.isabs(host) or not os.path.isabs(inside):
                raise ConfigError(f"bind {host!r} -> {inside!r}: both paths must be absolute")
            if not os.path.exists(host):
                raise ConfigError(f"bind source {host!r} does not exist on the host")
        lim = spec.limits
        return cls(
            id=sandbox_id,
            provider=provider,
            token=os.urandom(8).hex(),  # as secrets.token_hex(8)
            env=dict(spec.env),
            memory_bytes=lim.memory_bytes,
            pids=lim.pids,
            cpus=lim.cpus,
            network=spec.network,
            binds=[(h, i) for h, i in spec.binds],
            labels=dict(spec.labels),
        )

    @property
    def limits(self) -> ResourceLimits:
        return ResourceLimits(
            memory_bytes=self.memory_bytes, pids=self.pids, cpus=self.cpus,
            disk_bytes=self.disk_bytes,
        )

    def save(self, sandbox_dir: Path | str, *, fresh: bool = False) -> None:
        """Write ``state.json``; ``fresh``: ``sandbox_dir`` was just made by this process
        (no other writer: the temporary file needs no random name)."""
        # Atomic: readers (resume, list, another process's destroy) see the old file or the
        # whole new one, never a part. One open, one write, one rename.
        tmp = f"{sandbox_dir}/.state.tmp" if fresh else f"{sandbox_dir}/.state.{secrets.token_hex(4)}.tmp"
        raw = memoryview(self._encoded())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:
            while raw:
                raw = raw[os.write(fd, raw) :]
        finally:
            os.close(fd)
        os.replace(tmp, f"{sandbox_dir}/state.json")

    def _encoded(self) -> bytes:
        # A shallow dict in field order (json copies nothing) through json's shared C
        # encoder: no encoder object is built per call, as one would be for any option.
        return json.dumps({name: getattr(self, name) for name in _SAVED_FIELDS}).encode()

    def save_new(self, sandbox_dir: str) -> None:
        """Write the state of a sandbox whose directory this process has just made: as the
        directory's :data:`STATE_XATTR` (one ``setxattr``: atomic, and no file to create,
        write and rename), or as ``state.json`` where the filesystem keeps no such
        attribute."""
        raw = self._encoded()
        try:
            os.setxattr(sandbox_dir, STATE_XATTR, raw, os.XATTR_CREATE)
            return
        except OSError as exc:
            if exc.errno not in _NO_XATTR:
                raise
        self.save(sandbox_dir, fresh=True)

    @classmethod
    def load(cls, sandbox_dir: Path | str) -> SandboxState | None:
        """The state in ``sandbox_dir`` (its attribute, else ``state.json``, else the
        ``state.destroying.json`` of a destroy that was interrupted); None when there is
        none. :class:`ConfigError` for a state that does not read as a whole one."""
        where = str(sandbox_dir)
        destroying = False
        try:
            blob = os.getxattr(where, STATE_XATTR)
            source = f"{where} (attribute {STATE_XATTR})"
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return None
            source = f"{where}/state.json"
            try:
                with open(source, "rb") as f:
                    blob = f.read()
            except (FileNotFoundError, NotADirectoryError):
                try:  # a destroy that was interrupted: let it be finished
                    with open(f"{where}/state.destroying.json", "rb") as f:
                        blob = f.read()
                    destroying = True
                except OSError:
                    return None
                source = f"{where}/state.destroying.json"
            except OSError as err:
                raise ConfigError(f"sandbox state {source} is unreadable: {err}") from err
        return cls._parsed(blob, source, destroying)

    @classmethod
    def _parsed(cls, blob: bytes, source: str, destroying: bool) -> SandboxState | None:
        try:
            raw = json.loads(blob)
            if not isinstance(raw, dict):
                raise ValueError("not a JSON object")
            raw["binds"] = [tuple(b) for b in raw.get("binds", [])]
            known = cls.__dataclass_fields__
            state = cls(**{k: v for k, v in raw.items() if k in known})
            if not (isinstance(state.id, str) and isinstance(state.token, str)
                    and isinstance(state.provider, str)):
                raise ValueError("id, provider and token must be strings")
        except (ValueError, TypeError) as exc:
            # A torn or foreign state is never taken for a sandbox. (Every strict prefix of
            # a JSON object fails to parse: its outer brace closes last.)
            if destroying:
                return None  # the destroy that wrote it is finished by removing the dir
            raise ConfigError(f"sandbox state {source} is unreadable: {exc}") from None
        if destroying:
            state.destroying = True
        return state


_SAVED_FIELDS = tuple(f for f in SandboxState.__dataclass_fields__ if f != "destroying")


def _check_env(key: str, value: str) -> None:
    check_env_name(key)
    if not isinstance(value, str) or "\x00" in value:
        raise ConfigError(f"environment variable {key!r}: the value must be a string without NUL")


def state_exists(sandbox_dir: Path | str) -> bool:
    """Whether ``sandbox_dir`` holds a live (not being destroyed) sandbox's state."""
    where = str(sandbox_dir)
    try:
        os.getxattr(where, STATE_XATTR)
        return True
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return False
    return os.path.exists(f"{where}/state.json")


def mark_destroying(sandbox_dir: Path | str) -> None:
    """Record that the destroy of the sandbox in ``sandbox_dir`` began: its state moves to
    ``state.destroying.json`` (resume refuses it; the next destroy finishes it)."""
    where = str(sandbox_dir)
    try:
        blob = os.getxattr(where, STATE_XATTR)
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            os.rename(f"{where}/state.json", f"{where}/state.destroying.json")
        return
    # Written whole before the attribute goes: a crash in between leaves the sandbox as
    # it was (its state still live), and the next destroy starts over.
    tmp = f"{where}/.state.{secrets.token_hex(4)}.tmp"
    with open(tmp, "xb") as f:
        f.write(blob)
    os.replace(tmp, f"{where}/state.destroying.json")
    with contextlib.suppress(OSError):
        os.removexattr(where, STATE_XATTR)


def check_env(env: dict[str, str] | None) -> None:
    """Raise :class:`ConfigError` for environment entries no process could receive."""
    for key, value in (env or {}).items():
        _check_env(key, value)


def make_sandbox_dir(parent: Path, sandbox_id: str, *, private: bool = True) -> Path:
    """Create ``<parent>/<id>`` (with its private dir unless ``private`` is False); raise
    when the id is taken."""
    return Path(make_sandbox_dir_name(parent, sandbox_id, private=private))


def make_sandbox_dir_name(parent: Path, sandbox_id: str, *, private: bool = True) -> str:
    """:func:`make_sandbox_dir`, returning the path as a string (no Path object made)."""
    path = f"{parent}/{sandbox_id}"
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        raise ConfigError(
            f"sandbox {sandbox_id!r} already exists: pick another name or remove it with "
            f"`corral sandboxes rm {sandbox_id}`"
        ) from None
    except FileNotFoundError:  # the provider root went away since it was made: remake it
        parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        return make_sandbox_dir_name(parent, sandbox_id, private=private)
    if private:
        os.mkdir(f"{path}/private", 0o700)
    return path


def make_files_dir(path: Path, owner: tuple[int, int] | None, *, exists: bool = False) -> None:
    """Create ``path/root`` with the writable areas (owned by ``owner``); ``exists``: ``path``
    itself was made already (it is the sandbox dir)."""
    if not exists:
        path.mkdir(mode=0o711, exist_ok=True)
    root = f"{path}/root"
    os.mkdir(root, 0o755)
    os.mkdir(f"{root}/home", 0o755)
    for area in AREAS_REL:
        where = f"{root}/{area}"
        if area == "tmp":
            os.mkdir(where, 0o1777)
            os.chmod(where, 0o1777)  # mkdir's mode passes through the umask
        else:
            os.mkdir(where, 0o755)
        if owner is not None:
            os.chown(where, *owner)


# What create makes and a fresh sandbox still holds, deepest first (see remove_tree).
_SKELETON_FILES = ("state.destroying.json", "state.json")
_SKELETON_DIRS = ("root/workspace", "root/tmp", "root/home/agent", "root/home", "root", "etc", "private")


def bury(path: Path) -> Path | None:
    """Move a sandbox directory aside (it disappears atomically); the grave, or None when
    there was nothing to move."""
    grave = path.parent / f".{path.name}.deleting-{secrets.token_hex(4)}"
    try:
        os.rename(path, grave)
    except FileNotFoundError:
        return None
    return grave


def remove_if_skeleton(grave: Path) -> bool:
    """Remove ``grave`` when it holds no more than create made (a few rmdirs, no walk);
    False when something else is in it (then ``shutil.rmtree`` it)."""
    g = str(grave)
    for name in _SKELETON_FILES:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{g}/{name}")
    for name in _SKELETON_DIRS:
        try:
            os.rmdir(f"{g}/{name}")
        except FileNotFoundError:
            continue
        except OSError:
            return False
    try:
        os.rmdir(g)
    except OSError:
        return False
    return True


# Graves are deleted by one background thread per process, started on first use and kept
# (a thread start costs more than the rmdirs it saves). It is a daemon, and an exit handler
# waits until every grave queued so far is deleted, so a process that destroys and exits
# leaves nothing. A grave left by a killed process is queued by the next process that
# opens the provider root (``provider_root``).
_graves: queue.SimpleQueue[Path] = queue.SimpleQueue()
_digger_pid = 0  # the process whose digger runs (a forked child starts its own)
_digger_lock = threading.Lock()
_pending = 0
_idle = threading.Condition(_digger_lock)


def delete_later(grave: Path) -> None:
    """Delete ``grave`` (a buried directory) in the background."""
    global _digger_pid, _pending
    with _digger_lock:
        _pending += 1
        if _digger_pid != os.getpid():
            try:
                threading.Thread(target=_dig, name="corral-graves", daemon=True).start()
            except RuntimeError:  # interpreter shutting down: no new threads
                _pending -= 1
                shutil.rmtree(grave, ignore_errors=True)
                return
            if _digger_pid == 0:
                atexit.register(wait_for_graves)
            _digger_pid = os.getpid()
    _graves.put(grave)


def _dig() -> None:
    global _pending
    while True:
        grave = _graves.get()
        try:
            if not remove_if_skeleton(grave):
                shutil.rmtree(grave, ignore_errors=True)
        except OSError:
            shutil.rmtree(grave, ignore_errors=True)  # whatever is left: the next process
        finally:  # counted down whatever happened: the exit handler waits for zero
            with _digger_lock:
                _pending -= 1
                if not _pending:
                    _idle.notify_all()


def wait_for_graves() -> None:
    """Block until every grave queued so far is deleted (at exit; tests, benchmarks)."""
    with _digger_lock:
        if _digger_pid == os.getpid():
            _idle.wait_for(lambda: not _pending)


def _forked() -> None:
    global _graves, _digger_lock, _idle, _pending
    # The parent's digger is not in this process: start afresh (graves queued by the
    # parent are the parent's to delete).
    _graves = queue.SimpleQueue()
    _digger_lock = threading.Lock()
    _idle = threading.Condition(_digger_lock)
    _pending = 0


os.register_at_fork(after_in_child=_forked)


def _queue_left_graves(root: Path) -> None:
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            if name.startswith(".") and ".deleting-" in name:
                delete_later(root / name)


def remove_tree(path: Path) -> None:
    """Remove a sandbox directory; first move it aside so it disappears atomically."""
    grave = bury(path)
    if grave is not None and not remove_if_skeleton(grave):
        shutil.rmtree(grave, ignore_errors=True)
