"""Per-sandbox disk quota for the bubblewrap provider: a btrfs pool with one quota-limited
subvolume per sandbox.

When corral runs as root, the sandboxes' files live under ``FILES_ROOT``
(``/var/lib/corral/bubblewrap``). In it, corral keeps its own btrfs filesystem in a sparse
image file, ``btrfs.img`` (sized, once, to the smaller of 256 GiB and the host's free
space, or ``$CORRAL_BWRAP_POOL_SIZE``; sparse, so it costs what is written), mounted at
``btrfs/`` with quota groups on. Every sandbox's files dir is a subvolume there whose
quota group is limited to the sandbox's ``disk_bytes``: a write past it fails inside the
sandbox with EDQUOT ("Disk quota exceeded"). Deleting a subvolume is one ioctl (the kernel
frees the space in the background, and ``discard`` gives it back to the host's disk).

The pool is made and mounted on first use, under a file lock so that concurrent processes
cooperate; a mount already there (``/proc/self/mountinfo``) is reused, never mounted
twice; after a reboot the next use mounts the image again.

The pool lives *inside* FILES_ROOT, not over it: files dirs of sandboxes made before
(plain directories under ``FILES_ROOT/<hash>/``) stay where their state says they are.

Where the pool cannot be had (not root, no btrfs in the kernel, no ``mkfs.btrfs``, no
loop devices) sandboxes get plain directories without a disk quota: :func:`pool` says why.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from corral._errors import ConfigError
from corral._log import library_logger
from corral.providers import _btrfs as btrfs
from corral.providers._state import remove_tree
from corral._validate import size

__all__ = [
    "FIX",
    "POOL_DIR",
    "Pool",
    "PoolUnavailable",
    "format_size",
    "make_subvolume",
    "pool",
    "reached",
    "release",
    "remove_files",
    "slack",
    "unenforceable",
    "warn_unenforced",
]

log = library_logger("corral.providers._bubblewrap")

POOL_DIR = "btrfs"
"""The pool's mount point, in FILES_ROOT (its image is ``btrfs.img`` next to it)."""
IMAGE = "btrfs.img"
LOCK = "btrfs.lock"
MAX_POOL = 256 << 30
MIN_POOL = 1 << 30
FIX = "run corral as root with btrfs in the kernel and `apt-get install btrfs-progs`"
_MOUNT_OPTS = "loop,discard,noatime,nodev,nosuid,commit=5"


class PoolUnavailable(Exception):
    """The btrfs pool cannot be used here; ``str()`` says why."""


@dataclass(frozen=True, slots=True)
class Pool:
    """A mounted pool: where it is, its filesystem UUID, and the mount's device."""

    root: Path
    fsid: str
    dev: int


_pools: dict[Path, Pool] = {}
_failed: dict[Path, str] = {}
_warned: set[str] = set()


def format_size(n: int) -> str:
    """``n`` bytes for people: ``64 MiB``, ``10 GiB``."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _mounted_fstype(mountpoint: Path) -> str | None:
    """The filesystem type mounted at ``mountpoint`` (the last mount there), if any."""
    found: str | None = None
    target = os.path.realpath(mountpoint)  # mountinfo shows the path without symlinks
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as fh:
        for line in fh:
            head, sep, tail = line.partition(" - ")
            fields = head.split()
            if sep and len(fields) >= 5 and _unescape(fields[4]) == target:
                found = tail.split()[0] if tail.split() else ""
    return found


def _kernel_has_btrfs() -> bool:
    with contextlib.suppress(OSError), open("/proc/filesystems") as fh:
        if any(line.split()[-1:] == ["btrfs"] for line in fh):
            return True
    # Not loaded yet: mount loads the module when there is one.
    release = os.uname().release
    return any(
        Path(p).exists()
        for p in (f"/lib/modules/{release}/kernel/fs/btrfs", "/sys/module/btrfs")
    )


def _pool_size(files_root: Path) -> int:
    raw = os.environ.get("CORRAL_BWRAP_POOL_SIZE", "").strip()
    if raw:

        return size(raw, "CORRAL_BWRAP_POOL_SIZE")
    st = os.statvfs(files_root)
    return min(MAX_POOL, st.f_bavail * st.f_frsize)


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise PoolUnavailable(f"{' '.join(argv[:2])} failed: {detail[-1] if detail else proc.returncode}")


def _make_image(files_root: Path) -> None:
    mkfs = shutil.which("mkfs.btrfs")
    if mkfs is None:
        raise PoolUnavailable("mkfs.btrfs is not installed (`apt-get install btrfs-progs`)")
    size = _pool_size(files_root)
    if size < MIN_POOL:
        raise PoolUnavailable(
            f"only {format_size(size)} free under {files_root} (the pool needs {format_size(MIN_POOL)})"
        )
    # Made under a temporary name and renamed when complete: a crash halfway leaves no
    # half-made image that would be mounted later.
    tmp = files_root / f".{IMAGE}.{secrets.token_hex(4)}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, size)  # sparse: costs nothing until written
        finally:
            os.close(fd)
        # Single copies of metadata: the image is a file on the host's disk, a second
        # copy on the same disk protects nothing.
        _run([mkfs, "-q", "-L", "corral-sandboxes", "-m", "single", "-d", "single", str(tmp)])
        os.rename(tmp, files_root / IMAGE)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _mount(files_root: Path, mnt: Path) -> None:
    mnt.mkdir(mode=0o711, exist_ok=True)
    fstype = _mounted_fstype(mnt)
    if fstype == "btrfs":
        return  # mounted by another process meanwhile (or before us)
    if fstype is not None:
        raise PoolUnavailable(f"{mnt} has a {fstype} filesystem mounted on it, not corral's pool")
    image = files_root / IMAGE
    if not image.exists():
        _make_image(files_root)
    if not os.path.exists("/dev/loop-control"):
        raise PoolUnavailable("no loop devices (/dev/loop-control is missing)")
    mount = shutil.which("mount") or "/bin/mount"
    _run([mount, "-t", "btrfs", "-o", _MOUNT_OPTS, str(image), str(mnt)])


def _open_pool(files_root: Path, mnt: Path) -> Pool:
    fd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        btrfs.enable_quota(fd)  # a no-op when on; needed once after mkfs
        os.fchmod(fd, 0o711)  # the sandboxes' host uid traverses it, nothing more
        return Pool(root=mnt, fsid=btrfs.fsid(fd), dev=os.fstat(fd).st_dev)
    finally:
        os.close(fd)


def pool(files_root: Path, *, create: bool = True) -> Pool:
    """The mounted pool under ``files_root``: made and mounted when needed (``create``
    False: only mounted when its image exists). Raises :class:`PoolUnavailable` with the
    reason; a failure is remembered for the life of this process (no retry per sandbox).
    """
    mnt = files_root / POOL_DIR
    known = _pools.get(files_root)
    if known is not None:
        with contextlib.suppress(OSError):
            if os.stat(mnt).st_dev == known.dev:  # still mounted: one stat, no lock
                return known
        del _pools[files_root]
    if files_root in _failed:
        raise PoolUnavailable(_failed[files_root])
    if os.geteuid() != 0:
        raise PoolUnavailable("corral is not running as root")
    if not _kernel_has_btrfs():
        raise PoolUnavailable("the kernel has no btrfs")
    if not create and not (files_root / IMAGE).exists() and _mounted_fstype(mnt) != "btrfs":
        raise PoolUnavailable("there is no pool yet")
    try:
        lock = os.open(files_root / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            _mount(files_root, mnt)
            found = _open_pool(files_root, mnt)
        finally:
            os.close(lock)  # releases the flock
    except PoolUnavailable as exc:
        _failed[files_root] = str(exc)
        raise
    except OSError as exc:
        _failed[files_root] = f"cannot set up the btrfs pool in {files_root}: {exc}"
        raise PoolUnavailable(_failed[files_root]) from exc
    _pools[files_root] = found
    return found


def release(files_root: Path) -> None:
    """Unmount the pool under ``files_root``, if mounted (its loop device goes with it):
    for a files root that is going away, such as a private one a test made. Lazy, so a
    process still inside it does not keep the rest of the machine waiting."""
    _pools.pop(files_root, None)
    _failed.pop(files_root, None)
    mnt = files_root / POOL_DIR
    if _mounted_fstype(mnt) == "btrfs":
        umount = shutil.which("umount") or "/bin/umount"
        subprocess.run([umount, "-l", str(mnt)], check=False, capture_output=True, timeout=60)


def warn_unenforced(reason: str) -> None:
    """Log, once per process and reason, that sandboxes get no disk quota."""
    if reason in _warned:
        return
    _warned.add(reason)
    log.warning(
        "bubblewrap sandboxes get no disk quota (%s): a sandbox can fill the host's disk; "
        "to enforce it, %s (see `corral doctor`)", reason, FIX,
    )


def unenforceable(limit: int, reason: str) -> ConfigError:
    """The error for a sandbox that asks for a disk limit this machine cannot enforce."""
    return ConfigError(
        f"a disk limit of {format_size(limit)} was asked for, but it cannot be enforced "
        f"here: {reason}; see `corral doctor`, or leave the disk limit unset"
    )


def make_subvolume(p: Pool, files: Path, limit: int | None) -> int:
    """Create ``files`` (in the pool) as a subvolume limited to ``limit`` bytes; return
    its id. The parent directory is created as needed."""
    parent = files.parent
    for attempt in range(3):
        parent.mkdir(mode=0o711, exist_ok=True)
        try:
            pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            break
        except FileNotFoundError:
            # A destroy in the same $CORRAL_HOME removed the (empty) parent meanwhile.
            if attempt == 2:
                raise
    try:
        btrfs.create_subvolume(pfd, files.name)
        try:
            sfd = os.open(files.name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=pfd)
            try:
                if limit is not None:
                    btrfs.set_limit(sfd, limit)
                os.fchmod(sfd, 0o711)
                return btrfs.subvolume_id(sfd)
            finally:
                os.close(sfd)
        except BaseException:
            with contextlib.suppress(OSError):
                btrfs.delete_subvolume(pfd, files.name)
            raise
    finally:
        os.close(pfd)


def remove_files(path: Path) -> None:
    """Remove a sandbox's files dir: one ioctl for a subvolume, else a recursive delete."""
    if btrfs.is_subvolume(path):
        try:
            pfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            btrfs.delete_subvolume(pfd, path.name)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            # ENOTTY/EINVAL: not btrfs after all (inode 256 by chance); ENOTEMPTY: it
            # holds another subvolume. The plain delete below handles both.
            if exc.errno not in (errno.ENOTTY, errno.EINVAL, errno.ENOTEMPTY, errno.EPERM):
                raise
        finally:
            os.close(pfd)
    remove_tree(path)


def slack(limit: int) -> int:
    """How close to its limit a sandbox counts as full: a write that fails may leave
    up to one allocation (and metadata reservations) short of it."""
    return max(4 << 20, limit // 64)


def reached(fs_uuid: str, subvol: int, limit: int) -> bool:
    """Whether the sandbox's quota group is at its limit (read from sysfs)."""
    u = btrfs.usage(fs_uuid, subvol)
    if u is None:
        return False
    limit = u.limit or limit
    return u.used >= limit - slack(limit)
