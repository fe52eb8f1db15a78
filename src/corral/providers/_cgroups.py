"""cgroup v1 groups for sandboxes: limits, membership, "who hit which limit", kill-all.

A sandbox gets one directory per controller (``memory``, ``pids``, ``cpu``, ``freezer``)
named ``corral/<id>.<token>``. Processes join by writing their own pid to each
``cgroup.procs`` before they enter the sandbox; the file is chowned to the sandbox's host
uid so that the (unprivileged) launcher can do that itself. Everything forked later is a
member, so ``kill_all`` reaches every process of the sandbox, however it daemonized.

Only cgroup v1 with writable hierarchies is supported (this is what the development
machine has, and we run as root). Elsewhere the bubblewrap provider falls back to
rlimits and says so in ``corral doctor``.
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
    "available",
    "create",
    "destroy",
    "kill_all",
    "limit_counters",
    "members",
    "procs_files",
    "remove",
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
