"""cgroup v1 groups for sandboxes: limits, membership, "who hit which limit", kill-all.

A sandbox gets one directory per controller (``memory``, ``pids``, ``cpu``, ``freezer``)
named ``corral/<id>.<token>``. Processes join by writing their own pid to each
``cgroup.procs`` before they enter the sandbox; the file is chowned to the sandbox's host
uid so that the (unprivileged) launcher can do that itself. Everything forked later is a
member, so ``kill_all`` reaches every process of the sandbox, however it daemonized.

Only cgroup v1 with writable hierarchies is supported for limits (this is what the
development machine has, and we run as root). Elsewhere the bubblewrap provider falls back
to rlimits and says so in ``corral doctor``.

The local provider uses one cgroup v2 group per sandbox instead, with no controller: only
to find and kill the sandbox's processes (see "kill groups" below).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = [
    "CONTROLLERS",
    "GroupGone",
    "available",
    "create",
    "destroy",
    "ensure_kill_group",
    "join_kill_group",
    "kill_all",
    "kill_group",
    "kill_group_for",
    "limit_counters",
    "members",
    "procs_files",
    "remove",
    "remove_kill_group_if_empty",
    "v2_parent",
]

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids", "cpu", "freezer")
_PARENT = "corral"


def _controller_dir(controller: str) -> Path:
    return CGROUP_ROOT / controller


def available() -> tuple[bool, str]:
    """Whether v1 hierarchies for our controllers exist and are writable, with a reason."""
    missing = [c for c in CONTROLLERS if not (_controller_dir(c) / "cgroup.procs").exists()]
    if missing:
        return False, f"cgroup v1 controllers not mounted: {', '.join(missing)}"
    for c in CONTROLLERS:
        parent = _controller_dir(c) / _PARENT
        try:
            parent.mkdir(exist_ok=True)
        except OSError as exc:
            return False, f"cannot create {parent}: {exc.strerror}"
        if not os.access(parent, os.W_OK):
            return False, f"{parent} is not writable"
    return True, "cgroup v1 (memory, pids, cpu, freezer)"


def create(
    name: str,
    *,
    memory_bytes: int | None,
    pids: int | None,
    cpus: float | None,
    owner_uid: int | None,
) -> list[str]:
    """Create the sandbox's groups with limits applied; return their directories."""
    dirs: list[str] = []
    try:
        for c in CONTROLLERS:
            d = _controller_dir(c) / _PARENT / name
            d.mkdir(parents=True)
            dirs.append(str(d))
            if owner_uid is not None:
                os.chown(d / "cgroup.procs", owner_uid, -1)
            if c == "memory" and memory_bytes is not None:
                _write(d / "memory.limit_in_bytes", memory_bytes)
                # Without this, a memory-limited sandbox would just swap instead of failing.
                if (d / "memory.memsw.limit_in_bytes").exists():
                    _write(d / "memory.memsw.limit_in_bytes", memory_bytes)
                _write(d / "memory.swappiness", 0)
            if c == "pids" and pids is not None:
                _write(d / "pids.max", pids)
            if c == "cpu" and cpus is not None:
                period = 100_000
                _write(d / "cpu.cfs_period_us", period)
                _write(d / "cpu.cfs_quota_us", max(1000, int(cpus * period)))
    except BaseException:
        remove(dirs)
        raise
    return dirs


def _write(path: Path, value: object) -> None:
    path.write_text(f"{value}\n")


def procs_files(dirs: Sequence[str]) -> list[str]:
    return [os.path.join(d, "cgroup.procs") for d in dirs]


def members(dirs: Sequence[str]) -> set[int]:
    """Pids currently in any of the groups."""
    pids: set[int] = set()
    for d in dirs:
        with contextlib.suppress(OSError):
            pids.update(int(x) for x in Path(d, "cgroup.procs").read_text().split())
    return pids


def limit_counters(dirs: Sequence[str]) -> tuple[int, int]:
    """(memory OOM kills, forks refused by pids.max) so far; compare before/after."""
    oom = refused = 0
    for d in dirs:
        base = os.path.basename(os.path.dirname(os.path.dirname(d)))
        try:
            if base == "memory":
                for line in Path(d, "memory.oom_control").read_text().splitlines():
                    key, _, val = line.partition(" ")
                    if key == "oom_kill":
                        oom = int(val)
            elif base == "pids":
                for line in Path(d, "pids.events").read_text().splitlines():
                    key, _, val = line.partition(" ")
                    if key == "max":
                        refused = int(val)
        except OSError:
            continue
    return oom, refused


class LimitCounters:
    """:func:`limit_counters` for one sandbox's groups, read twice per command: the files
    are kept open and re-read with one ``pread`` each (no path walk, no ``open``). A file
    that stops answering (its group was removed and made again) is opened afresh once."""

    __slots__ = ("_files",)

    def __init__(self, dirs: Sequence[str]) -> None:
        self._files: list[tuple[str, bytes, int | None]] = []
        for d in dirs:
            base = os.path.basename(os.path.dirname(os.path.dirname(d)))
            if base == "memory":
                self._files.append((os.path.join(d, "memory.oom_control"), b"oom_kill", None))
            elif base == "pids":
                self._files.append((os.path.join(d, "pids.events"), b"max", None))

    def read(self) -> tuple[int, int]:
        """(memory OOM kills, forks refused by pids.max) so far."""
        oom = refused = 0
        for i, (path, key, fd) in enumerate(self._files):
            data = None
            for _attempt in (0, 1):
                if fd is None:
                    try:
                        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                    except OSError:
                        break
                    self._files[i] = (path, key, fd)
                try:
                    data = os.pread(fd, 4096, 0)
                    break
                except OSError:
                    os.close(fd)
                    fd = None
                    self._files[i] = (path, key, None)
            if data is None:
                continue
            for line in data.split(b"\n"):
                name, _, val = line.partition(b" ")
                if name == key:
                    if key == b"max":
                        refused = int(val)
                    else:
                        oom = int(val)
        return oom, refused

    def close(self) -> None:
        for i, (path, key, fd) in enumerate(self._files):
            if fd is not None:
                os.close(fd)
                self._files[i] = (path, key, None)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def kill_all(dirs: Sequence[str], *, timeout: float = 10.0) -> bool:
    """SIGKILL every member; freeze first so nothing can fork in between. True when empty."""
    freezer = next((d for d in dirs if "/freezer/" in d), None)
    deadline = time.monotonic() + timeout
    if freezer is not None:
        with contextlib.suppress(OSError):
            _write(Path(freezer, "freezer.state"), "FROZEN")
            while time.monotonic() < deadline:
                state = Path(freezer, "freezer.state").read_text().strip()
                if state == "FROZEN" or not members([freezer]):
                    break
                time.sleep(0.002)
    while True:
        pids = members(dirs)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if freezer is not None:
            with contextlib.suppress(OSError):
                _write(Path(freezer, "freezer.state"), "THAWED")  # killed tasks die on thaw
        if not pids:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)


def destroy(dirs: Sequence[str], *, timeout: float = 10.0) -> bool:
    """Kill every member and remove the groups; True when all are gone.

    A launcher that is between its start and its join (it writes its pid to
    ``cgroup.procs`` before it enters the sandbox) makes ``rmdir`` fail with EBUSY; then
    we kill again. Once a group is removed, a late joiner's write fails and it exits
    before entering the sandbox.
    """
    deadline = time.monotonic() + timeout
    left = list(dirs)
    while left:
        kill_all(left, timeout=max(0.1, deadline - time.monotonic()))
        still = []
        for d in left:
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                still.append(d)
        left = still
        if left:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
    return True


def remove(dirs: Iterable[str], *, timeout: float = 5.0) -> None:
    """Remove the groups (waits briefly for dying members to leave)."""
    deadline = time.monotonic() + timeout
    for d in dirs:
        while True:
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    break
                time.sleep(0.005)


# ------------------------------------------------------------------ cgroup v2 kill groups
#
# A sandbox without v1 groups (the local provider) gets one cgroup v2 directory that only
# holds its processes: no controller, no limit. Membership is inherited across fork and
# survives setsid and double forks, so destroy finds every process by reading the group,
# not by scanning the host, and ``cgroup.kill`` (Linux 5.14) SIGKILLs them all at once,
# forks in flight included. The group is created on the sandbox's first launch (create
# stays a few mkdirs) and removed by destroy; a group with nothing in it is removed by one
# rmdir, which is destroy's common case.

_V2_PARENT = "corral"
_v2_parent: str | None | bool = False  # False: not probed yet


def _cgroup2_mount() -> str | None:
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                left, _, right = line.partition(" - ")
                if right.split(" ", 1)[0] == "cgroup2":
                    return left.split(" ")[4]
    except OSError:
        pass
    return None


def v2_parent() -> str | None:
    """The directory holding corral's v2 kill groups, or None where there is none we may
    use (no cgroup2 mount, no ``cgroup.kill``, or not allowed to create groups there).
    Probed once per process."""
    global _v2_parent
    if _v2_parent is False:
        found: str | None = None
        mount = _cgroup2_mount()
        if mount is not None:
            parent = os.path.join(mount, _V2_PARENT)
            with contextlib.suppress(OSError):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(parent)
                if os.path.exists(os.path.join(parent, "cgroup.kill")) and os.access(
                    os.path.join(parent, "cgroup.procs"), os.W_OK
                ):
                    found = parent
        _v2_parent = found
    return _v2_parent if isinstance(_v2_parent, str) else None


def kill_group_for(name: str) -> str:
    """The group's directory for a sandbox (``""`` where v2 kill groups are unavailable)."""
    parent = v2_parent()
    return f"{parent}/{name}" if parent is not None else ""


def ensure_kill_group(group: str) -> bool:
    """Create ``group`` if it is missing; False when it cannot be made."""
    try:
        os.mkdir(group)
    except FileExistsError:
        pass
    except OSError:
        return False
    return True


class GroupGone(Exception):
    """The kill group was removed: its sandbox is being destroyed."""


def join_kill_group(group: str, pid: int) -> bool:
    """Move ``pid`` and the descendants it already has into ``group``; True when that
    certainly caught every process it started.

    The local provider's fallback where it cannot start a child inside the group
    (``_cgspawn``): the child runs for a moment outside it. Everything
    it forks after the move is a member. What it forked before is moved by walking its
    children (zombies stay listed until reaped), except the children of a process that
    already exited: so the answer is False when a process of the tree had exited
    (ESRCH) or had reaped a child (its ``cminflt`` counts the faults of reaped children,
    and every exec'd child has some), and the caller must keep another way to find them.
    Raises :class:`GroupGone` when ``group`` is gone, OSError when ``pid`` could not be
    moved for another reason.
    """
    try:
        fd = os.open(os.path.join(group, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise GroupGone(group) from None
    certain = True
    try:
        todo = [pid]
        while todo:
            p = todo.pop()
            try:
                os.write(fd, b"%d" % p)
            except ProcessLookupError:
                certain = False  # exited (or exiting) before the move
                continue
            except OSError as exc:
                if exc.errno == errno.ENODEV:  # removed while we held it open
                    raise GroupGone(group) from None
                if p == pid:
                    raise
                certain = False
                continue
            if _reaped_a_child(p):
                certain = False
            todo.extend(_children(p))
    finally:
        os.close(fd)
    return certain


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                out.extend(int(c) for c in fh.read().split())
    return out


def _reaped_a_child(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return True
    fields = raw[raw.rfind(b")") + 2 :].split()
    return len(fields) < 10 or fields[8] != b"0"  # cminflt, field 11 of stat


def remove_kill_group_if_empty(group: str) -> bool:
    """One rmdir: True when ``group`` is gone (it was empty or never made)."""
    try:
        os.rmdir(group)
    except FileNotFoundError:
        return True
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            return False
        raise
    return True


def kill_group(group: str, *, timeout: float = 10.0) -> bool:
    """SIGKILL every member of ``group`` and remove it; True when it is gone."""
    deadline = time.monotonic() + timeout
    while not remove_kill_group_if_empty(group):
        with contextlib.suppress(FileNotFoundError):
            _write(Path(group, "cgroup.kill"), 1)
        # Killed members leave the group as they exit (a zombie is no longer a member).
        while _populated(group) and time.monotonic() < deadline:
            time.sleep(0.001)
        if time.monotonic() > deadline:
            return remove_kill_group_if_empty(group)
    return True


def _populated(group: str) -> bool:
    try:
        with open(os.path.join(group, "cgroup.events"), "rb") as fh:
            for line in fh.read().splitlines():
                if line.startswith(b"populated "):
                    return line.endswith(b" 1")
    except FileNotFoundError:
        return False
    return False
