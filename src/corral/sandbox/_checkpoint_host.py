"""A checkpoint's read of a workspace from the host side (#27), where the provider keeps the
workspace in a host directory (:class:`~corral.sandbox._contracts.HostPaths`: bubblewrap,
local): no command is started in the sandbox, so an incremental checkpoint does not pay a
sandbox's start (for bubblewrap: the launcher, ``bwrap``, its init and the cgroup writes,
~30 ms of a ~70 ms checkpoint).

It produces exactly the frames the in-sandbox script (:mod:`corral._insandbox.checkpoint`)
writes, for the same request, so everything downstream (the secret scan, the size cap, the
chunking, the store) is the same code. The workspace's contents are hostile and may change
while they are read (the agent's processes may outlive its run), so nothing is ever reached
through a symlink: the root is opened with ``O_NOFOLLOW``, and every directory and file
under it is opened relative to the root's descriptor with ``openat2(RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`` (the kernel refuses any symlink on the way
and any escape from the root; without ``openat2``: component by component with
``O_NOFOLLOW``). A file is read only when ``fstat`` of the opened descriptor says it is a
regular file (opened non-blocking, so a FIFO never blocks). One descriptor is open at a
time besides the root's, so a deep tree cannot exhaust the process's descriptors. Symlinks
are recorded (``readlink`` relative to their directory's descriptor), never followed.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Callable
from typing import Any, Final

from corral._insandbox import checkpoint as script

__all__ = ["host_save"]

_RESOLVE_NO_MAGICLINKS: Final = 0x02
_RESOLVE_NO_SYMLINKS: Final = 0x04
_RESOLVE_BENEATH: Final = 0x08
_RESOLVE: Final = _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS
_SYS_OPENAT2: Final = 437  # the same number on every architecture
_DIR: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_openat2_works: list[bool] = []


def _openat2(dirfd: int, path: str, flags: int) -> int:
    how = _OpenHow(flags, 0, _RESOLVE)
    fd = int(_libc.syscall(_SYS_OPENAT2, dirfd, os.fsencode(path), ctypes.byref(how),
                           ctypes.sizeof(how)))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return fd


def _by_components(dirfd: int, path: str, flags: int) -> int:
    """``path`` under ``dirfd``, every component opened with ``O_NOFOLLOW``."""
    parts = path.split("/")
    fd = os.dup(dirfd)
    try:
        for name in parts[:-1]:
            nxt = os.open(name, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return os.open(parts[-1], flags | os.O_NOFOLLOW, dir_fd=fd)
    finally:
        os.close(fd)


def _open_beneath(dirfd: int, path: str, flags: int) -> int:
    """Open ``path`` (relative, no ``.``/``..``/empty component: the walk made it) beneath
    ``dirfd``, refusing any symlink on the way (``ELOOP``)."""
    if not _openat2_works:
        try:
            os.close(_openat2(dirfd, ".", _DIR))
            _openat2_works.append(True)
        except OSError as exc:  # ENOSYS: an old kernel; EPERM: a seccomp filter
            if exc.errno not in (errno.ENOSYS, errno.EPERM):
                raise
            _openat2_works.append(False)
    if _openat2_works[0]:
        return _openat2(dirfd, path, flags)
    return _by_components(dirfd, path, flags)


Scanned = list[tuple[str, os.stat_result, str | None]]


def _scan(root_fd: int, rel: str) -> Scanned:
    """The entries of directory ``rel`` (``""``: the root), sorted by name: name, lstat,
    a symlink's target. Unreadable entries are left out, as the in-sandbox walk does."""
    fd = os.dup(root_fd) if not rel else _open_beneath(root_fd, rel, _DIR)
    try:
        with os.scandir(fd) as it:
            found = {entry.name: entry for entry in it}
        out: Scanned = []
        for name in sorted(found):
            try:
                st = found[name].stat(follow_symlinks=False)
                target = os.readlink(name, dir_fd=fd) if stat.S_ISLNK(st.st_mode) else None
            except OSError:
                continue
            out.append((name, st, target))
        return out
    finally:
        os.close(fd)


def _walk(root_fd: int, known: dict[str, str], entries: list[str], need: list[str]) -> None:
    """What :func:`corral._insandbox.checkpoint._walk` lists, in the same order and form
    (parents before children, siblings sorted), without a recursion per level."""
    enc = script._json_string()
    append = entries.append
    is_dir, is_reg, is_lnk, imode = stat.S_ISDIR, stat.S_ISREG, stat.S_ISLNK, stat.S_IMODE
    stack: list[tuple[str, Scanned, list[int]]] = []
    try:
        stack.append(("", _scan(root_fd, ""), [0]))
    except OSError:
        return
    while stack:
        prefix, kids, at = stack[-1]
        if at[0] == len(kids):
            stack.pop()
            continue
        name, st, target = kids[at[0]]
        at[0] += 1
        rel = prefix + name
        st_mode = st.st_mode
        if is_reg(st_mode):
            stamp = f"{st.st_dev}:{st.st_ino}:{st.st_ctime_ns}"
            same = known.get(rel) == f"{st.st_size}:{st.st_mtime_ns}:{stamp}"
            if not same:
                need.append(rel)
            append(f'[{enc(rel)},"file",{imode(st_mode)},{st.st_size},{st.st_mtime_ns},'
                   f'"{stamp}",null,{0 if same else 1}]')
        elif is_dir(st_mode):
            append(f'[{enc(rel)},"dir",{imode(st_mode)},0,{st.st_mtime_ns},"",null,0]')
            try:
                sub = _scan(root_fd, rel)
            except OSError:  # replaced by a symlink or removed meanwhile: as unreadable
                sub = []
            stack.append((rel + "/", sub, [0]))
        elif is_lnk(st_mode) and target is not None:
            append(f'[{enc(rel)},"symlink",{imode(st_mode)},0,{st.st_mtime_ns},"",'
                   f'{enc(target)},0]')
        # sockets, fifos and devices are not workspace content


class Buffered:
    """A write-only stream of frames that hands ``flush`` at least ``size`` bytes at a
    time (and the rest at :meth:`close`)."""

    def __init__(self, flush: Callable[[bytes], None], size: int) -> None:
        self._flush = flush
        self._size = size
        self._parts: list[bytes] = []
        self._held = 0

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        self._held += len(data)
        if self._held >= self._size:
            self._send()
        return len(data)

    def _send(self) -> None:
        data, self._parts, self._held = b"".join(self._parts), [], 0
        if data:
            self._flush(data)

    def close(self) -> None:
        self._send()


def host_save(request: bytes, out: Any, root: str) -> None:
    """Answer a save ``request`` (one root, ``"."``) for the workspace at host path
    ``root``, writing the frames the in-sandbox script writes into ``out``."""
    chunk, roots = script.parse_save(request)
    if len(roots) != 1 or roots[0][0] != ".":
        raise ValueError("a host-side checkpoint reads the workspace only")
    known = roots[0][1]
    try:
        root_fd = os.open(root, _DIR)
    except OSError:
        script._frame(out, b"H", b'{"roots":[{"missing":true}]}')
        script._frame(out, b"Z")
        return
    try:
        entries: list[str] = []
        need: list[str] = []
        _walk(root_fd, known, entries, need)
        script._frame(out, b"H", ('{"roots":[{"entries":[' + ",".join(entries) + "]}]}"
                                  ).encode("ascii"))
        for rel in need:
            try:
                fd = _open_beneath(root_fd, rel, _FILE)
            except OSError as exc:
                script._frame(out, b"X", str(exc.strerror or exc).encode())
                continue
            script.send_open(out, fd, chunk)
        script._frame(out, b"Z")
    finally:
        os.close(root_fd)
