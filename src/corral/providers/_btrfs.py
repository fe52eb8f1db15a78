"""The few btrfs ioctls the disk quota needs, without spawning ``btrfs`` per sandbox.

Spawning the CLI costs ~4 ms per call here; each ioctl below costs tens of microseconds,
so a sandbox's subvolume with its quota is made and removed in well under a millisecond.
Layouts follow ``include/uapi/linux/btrfs.h``.

Also the seccomp filter that keeps sandboxed commands from creating subvolumes (see
:func:`no_subvolumes_filter`): a subvolume made inside a sandbox would get its own,
unlimited quota group, so the sandbox's limit could be escaped with one ioctl.
"""

from __future__ import annotations

import fcntl
import os
import platform
import struct
import sys
import uuid
from pathlib import Path

__all__ = [
    "FIRST_FREE_OBJECTID",
    "Usage",
    "create_subvolume",
    "delete_subvolume",
    "enable_quota",
    "fsid",
    "is_subvolume",
    "no_subvolumes_filter",
    "set_limit",
    "subvolume_id",
    "usage",
]

FIRST_FREE_OBJECTID = 256
"""The inode number of every subvolume's root directory."""

_MAGIC = 0x94
_PPC = platform.machine().startswith(("ppc", "powerpc"))
# ioctl direction bits and where they go: asm-generic, except on powerpc.
_WRITE, _READ = (4, 2) if _PPC else (1, 2)
_DIR_SHIFT = 29 if _PPC else 30


def _ioc(direction: int, nr: int, size: int) -> int:
    return (direction << _DIR_SHIFT) | (size << 16) | (_MAGIC << 8) | nr


_VOL_ARGS = 4096  # struct btrfs_ioctl_vol_args / _v2 / ino_lookup_args
_SNAP_CREATE = _ioc(_WRITE, 1, _VOL_ARGS)
_SUBVOL_CREATE = _ioc(_WRITE, 14, _VOL_ARGS)
_SNAP_DESTROY = _ioc(_WRITE, 15, _VOL_ARGS)
_INO_LOOKUP = _ioc(_READ | _WRITE, 18, _VOL_ARGS)
_SNAP_CREATE_V2 = _ioc(_WRITE, 23, _VOL_ARGS)
_SUBVOL_CREATE_V2 = _ioc(_WRITE, 24, _VOL_ARGS)
_FS_INFO = _ioc(_READ, 31, 1024)
_QUOTA_CTL = _ioc(_READ | _WRITE, 40, 16)
_QGROUP_LIMIT = _ioc(_READ, 43, 48)
_QUOTA_CTL_ENABLE = 1
_QGROUP_LIMIT_MAX_RFER = 1
_NAME_MAX = 255


def _vol_args(name: str) -> bytearray:
    raw = os.fsencode(name)
    if not raw or b"/" in raw or len(raw) > _NAME_MAX:
        raise ValueError(f"invalid subvolume name {name!r}")
    buf = bytearray(_VOL_ARGS)
    buf[8 : 8 + len(raw)] = raw  # after the __s64 fd
    return buf


def create_subvolume(parent_fd: int, name: str) -> None:
    """Create the empty subvolume ``name`` in the directory ``parent_fd``."""
    fcntl.ioctl(parent_fd, _SUBVOL_CREATE, _vol_args(name))


def delete_subvolume(parent_fd: int, name: str) -> None:
    """Delete the subvolume ``name`` (with everything in it) from ``parent_fd``.

    It disappears at once; the kernel frees its space in the background."""
    fcntl.ioctl(parent_fd, _SNAP_DESTROY, _vol_args(name))


def subvolume_id(fd: int) -> int:
    """The id of the subvolume holding the open file ``fd``."""
    buf = bytearray(_VOL_ARGS)
    struct.pack_into("=QQ", buf, 0, 0, FIRST_FREE_OBJECTID)  # treeid 0: "the fd's tree"
    fcntl.ioctl(fd, _INO_LOOKUP, buf)
    return int(struct.unpack_from("=Q", buf, 0)[0])


def set_limit(subvol_fd: int, max_bytes: int) -> None:
    """Limit the space the subvolume of ``subvol_fd`` references (its level-0 qgroup)."""
    # struct btrfs_ioctl_qgroup_limit_args: qgroupid (0: the fd's subvolume), then
    # struct btrfs_qgroup_limit: flags, max_rfer, max_excl, rsv_rfer, rsv_excl.
    args = bytearray(struct.pack("=6Q", 0, _QGROUP_LIMIT_MAX_RFER, max_bytes, 0, 0, 0))
    fcntl.ioctl(subvol_fd, _QGROUP_LIMIT, args)


def enable_quota(fd: int) -> None:
    """Turn on quota groups for the filesystem of ``fd`` (a no-op when they are on)."""
    fcntl.ioctl(fd, _QUOTA_CTL, bytearray(struct.pack("=QQ", _QUOTA_CTL_ENABLE, 0)))


def fsid(fd: int) -> str:
    """The filesystem's UUID: its directory name under ``/sys/fs/btrfs``."""
    buf = bytearray(1024)
    fcntl.ioctl(fd, _FS_INFO, buf)
    return str(uuid.UUID(bytes=bytes(buf[16:32])))  # after max_id, num_devices


def is_subvolume(path: Path) -> bool:
    """Whether ``path`` is the root directory of a btrfs subvolume (never follows links)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return st.st_ino == FIRST_FREE_OBJECTID and os.path.isdir(path) and not os.path.islink(path)


class Usage:
    """Space use of one subvolume's quota group, from sysfs (kernel 5.9+)."""

    __slots__ = ("limit", "used")

    def __init__(self, used: int, limit: int | None) -> None:
        self.used = used
        """Bytes referenced plus bytes reserved by writes not yet committed."""
        self.limit = limit


def usage(fs_uuid: str, subvol: int) -> Usage | None:
    """The quota group ``0/subvol``'s use, or None when sysfs does not show it."""
    base = f"/sys/fs/btrfs/{fs_uuid}/qgroups/0_{subvol}/"
    try:
        used = 0
        # Writes in flight hold reservations before they are accounted at commit time:
        # counting them is what makes "the limit was reached" visible right away.
        for name in ("referenced", "rsv_data", "rsv_meta_pertrans", "rsv_meta_prealloc"):
            with open(base + name, "rb") as fh:
                used += int(fh.read())
        with open(base + "max_referenced", "rb") as fh:
            raw = int(fh.read())
    except (OSError, ValueError):
        return None
    return Usage(used, raw if raw and raw != 2**64 - 1 else None)


# ----------------------------------------------------------------- seccomp filter
# AUDIT_ARCH_* and the ioctl syscall number, per machine: the native ABI first, then the
# compat ABIs a process of that machine may also use (a 32-bit binary has other numbers).
_ARCHES: dict[str, list[tuple[int, int]]] = {
    "x86_64": [(0xC000003E, 16), (0xC000003E, 0x40000000 | 514), (0x40000003, 54)],  # x32: 514
    "aarch64": [(0xC00000B7, 29), (0x40000028, 54)],
    "riscv64": [(0xC00000F3, 29)],
    "ppc64le": [(0xC0000015, 54)],
    "s390x": [(0x80000016, 54), (0x16, 54)],
}
_LD_W_ABS, _JEQ_K, _RET_K = 0x20, 0x15, 0x06
_SECCOMP_RET_ALLOW = 0x7FFF0000
_SECCOMP_RET_ERRNO = 0x00050000
_EPERM = 1


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def no_subvolumes_filter() -> bytes | None:
    """A classic-BPF seccomp program (``struct sock_filter[]``) that fails the ioctls
    creating btrfs subvolumes or snapshots with EPERM and allows everything else; None on
    a machine this module has no syscall numbers for.

    Why: a subvolume is accounted in its own quota group, not its parent's, so one made
    inside a sandbox would hold any amount of data. (Quota-group ioctls need
    CAP_SYS_ADMIN in the initial namespace, which a sandbox never has.) Syscalls of an
    ABI not listed for this machine fail with EPERM rather than pass unchecked.
    """
    arches = _ARCHES.get(platform.machine())
    if arches is None:
        return None
    blocked = (_SNAP_CREATE, _SUBVOL_CREATE, _SNAP_CREATE_V2, _SUBVOL_CREATE_V2)
    # The ioctl command is an unsigned int: the kernel reads the low 32 bits of args[1].
    cmd_offset = 16 + 8 + (0 if sys.byteorder == "little" else 4)
    prog: list[bytes] = []
    check = [_insn(_LD_W_ABS, cmd_offset)]
    check += [_insn(_JEQ_K, c, jt=len(blocked) - i, jf=0) for i, c in enumerate(blocked)]
    check += [_insn(_RET_K, _SECCOMP_RET_ALLOW), _insn(_RET_K, _SECCOMP_RET_ERRNO | _EPERM)]
    for arch in sorted({a for a, _ in arches}):
        nrs = [nr for a, nr in arches if a == arch]
        # arch matches: test nr; else skip this block (jump over it).
        block: list[bytes] = [_insn(_LD_W_ABS, 0)]
        for i, nr in enumerate(nrs):
            block.append(_insn(_JEQ_K, nr, jt=len(nrs) - i, jf=0))
        block.append(_insn(_RET_K, _SECCOMP_RET_ALLOW))
        block += check
        prog.append(_insn(_LD_W_ABS, 4))
        prog.append(_insn(_JEQ_K, arch, jt=0, jf=len(block)))
        prog += block
    prog.append(_insn(_RET_K, _SECCOMP_RET_ERRNO | _EPERM))
    return b"".join(prog)
