"""Confined filesystem access to a sandbox whose files live in a host directory.

Both the local and the bubblewrap providers keep a sandbox's writable areas in one host
directory that mirrors the sandbox's view: ``<root>/workspace`` is ``/workspace``,
``<root>/tmp`` is ``/tmp``, ``<root>/home/agent`` is ``/home/agent``. The sandbox's
contents are hostile: it may have planted symlinks anywhere, and may change them while we
work. So every path is resolved by the kernel relative to a directory fd:

* ``openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`` resolves the path as if ``<root>``
  were ``/`` (``..`` cannot climb out, absolute symlinks resolve inside, ``/proc`` magic
  links are refused), then the fd's real path is checked against the writable areas (a
  symlink to ``/etc/passwd`` resolves to ``<root>/etc/passwd``, which is in no area, so it
  is refused). The check is on the opened fd, so a swap after the check changes nothing.
* Operations on a name (create, unlink, rename, lstat) run on the resolved parent fd with
  the final component not followed (``O_NOFOLLOW``, ``follow_symlinks=False``).
* Without ``openat2`` (old kernels, seccomp) the walk is done component by component with
  ``O_NOFOLLOW``: every symlink in a path is refused.
"""

from __future__ import annotations

import ctypes
import errno
import os
import posixpath
import shutil
import stat as st
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import anyio.to_thread

from corral.sandbox._contracts import FileInfo, PathEscapeError, SandboxGoneError

__all__ = ["DEFAULT_AREAS", "HostFS"]

DEFAULT_AREAS: tuple[str, ...] = ("/workspace", "/tmp", "/home/agent")

_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08
_RESOLVE_IN_ROOT = 0x10
_SYS_OPENAT2 = 437  # the same number on every architecture (added after syscall unification)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_openat2_works: bool | None = None


def _regular(fd: int, path: str) -> int:
    """``fd`` if it is a regular file (then back in blocking mode), else closed and refused."""
    if not st.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IsADirectoryError(errno.EISDIR, "not a regular file", path)
    os.set_blocking(fd, True)
    return fd


def _openat2(dirfd: int, path: str, flags: int, mode: int, resolve: int = _RESOLVE_BENEATH) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve | _RESOLVE_NO_MAGICLINKS)
    raw = os.fsencode(path)
    for _ in range(64):  # EAGAIN: a concurrent rename raced the lookup; retry
        fd = int(_libc.syscall(_SYS_OPENAT2, dirfd, raw, ctypes.byref(how), ctypes.sizeof(how)))
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err != errno.EAGAIN:
            raise OSError(err, os.strerror(err), path)
    raise OSError(errno.EAGAIN, "path kept changing during lookup", path)


def _have_openat2() -> bool:
    global _openat2_works
    if _openat2_works is None:
        try:
            root = os.open("/", os.O_PATH)
            try:
                os.close(_openat2(root, ".", os.O_PATH, 0))
            finally:
                os.close(root)
            _openat2_works = True
        except OSError:
            _openat2_works = False
    return _openat2_works


class HostFS:
    """The :class:`~corral.sandbox._contracts.FileSystem` of a sandbox kept in ``root``.

    ``areas`` are the sandbox paths that map to ``root/<area>``; nothing outside them is
    reachable. Relative paths are relative to ``workdir``. ``owner`` (uid, gid) is applied
    to everything this class creates, so that the sandbox's unprivileged user can modify
    it. ``check_alive`` raises :class:`SandboxGoneError` when the sandbox was destroyed.
    """

    def __init__(
        self,
        root: Path,
        *,
        areas: Sequence[str] = DEFAULT_AREAS,
        workdir: str = "/workspace",
        owner: tuple[int, int] | None = None,
    ) -> None:
        self._root = Path(root)
        self._real_root: str | None = None
        self._areas = tuple(a.strip("/") for a in areas)
        self._workdir = workdir
        self._owner = owner

    # -- path handling -------------------------------------------------------------------

    def to_relative(self, path: str) -> str:
        """Map a sandbox path to a path relative to ``root`` inside an area, or raise."""
        if not isinstance(path, str) or not path or "\x00" in path:
            raise PathEscapeError(f"invalid sandbox path {path!r}")
        full = path if path.startswith("/") else posixpath.join(self._workdir, path)
        rel = posixpath.normpath(full).lstrip("/")
        if not self._area_of(rel):
            raise PathEscapeError(
                f"path {path!r} is outside the sandbox's writable areas "
                f"({', '.join('/' + a for a in self._areas)})"
            )
        return rel

    def _area_of(self, rel: str) -> str | None:
        for area in self._areas:
            if rel == area or rel.startswith(area + "/"):
                return area
        return None

    @contextmanager
    def _rootfd(self) -> Iterator[int]:
        try:
            fd = os.open(self._root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SandboxGoneError(f"the sandbox's files are gone ({self._root})") from None
        try:
            yield fd
        finally:
            os.close(fd)

    def _check_inside(self, fd: int, path: str) -> None:
        real = os.readlink(f"/proc/self/fd/{fd}")
        # Resolved once: ``root`` and the directories above it are corral's (the sandbox
        # controls what is under root, never root itself), so where it resolves does not
        # change while this object lives; resolving it per operation was most of a small
        # operation's syscalls.
        root = self._real_root
        if root is None:
            root = self._real_root = os.path.realpath(self._root)
        if not real.startswith(root + "/") or not self._area_of(real[len(root) + 1 :]):
            os.close(fd)
            raise PathEscapeError(f"path {path!r} resolves outside the sandbox (via a symlink)")

    def _open(self, rootfd: int, rel: str, flags: int, path: str) -> int:
        """Open ``rel`` (following symlinks the way the sandbox would) and confine it."""
        if _have_openat2():
            try:
                fd = _openat2(rootfd, rel, flags, 0, _RESOLVE_BENEATH)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise _translate(exc, path) from None
                # An absolute symlink (or one climbing out): resolve it the way the
                # sandbox sees it; it must land in a writable area and exist.
                try:
                    fd = _openat2(rootfd, rel, flags, 0, _RESOLVE_IN_ROOT)
                except OSError as exc2:
                    if exc2.errno in (errno.ENOENT, errno.ENOTDIR):
                        raise PathEscapeError(
                            f"path {path!r} goes through a symlink that points outside the "
                            "sandbox's writable areas"
                        ) from None
                    raise _translate(exc2, path) from None
            self._check_inside(fd, path)
            return fd
        return self._walk(rootfd, rel, flags, path)

    def _walk(self, rootfd: int, rel: str, flags: int, path: str) -> int:
        parts = rel.split("/")
        cur = os.dup(rootfd)
        try:
            for i, part in enumerate(parts):
                last = i == len(parts) - 1
                fl = (flags if last else os.O_PATH | os.O_DIRECTORY) | os.O_NOFOLLOW | os.O_CLOEXEC
                try:
                    nxt = os.open(part, fl, dir_fd=cur)
                except OSError as exc:
                    if exc.errno == errno.ELOOP or (
                        exc.errno == errno.ENOTDIR and _is_link(cur, part)
                    ):
                        raise PathEscapeError(
                            f"path {path!r} goes through a symlink (not followed here)"
                        ) from None
                    raise _translate(exc, path) from None
                if (flags & os.O_PATH) and last and _is_link(cur, part):
                    os.close(nxt)
                    raise PathEscapeError(f"path {path!r} is a symlink (not followed here)")
                os.close(cur)
                cur = nxt
            return cur
        except BaseException:
            os.close(cur)
            raise

    @contextmanager
    def _dir(self, rel: str, path: str) -> Iterator[int]:
        with self._rootfd() as rootfd:
            fd = self._open(rootfd, rel, os.O_RDONLY | os.O_DIRECTORY, path)
        try:
            yield fd
        finally:
            os.close(fd)

    @contextmanager
    def _parent(self, rel: str, path: str) -> Iterator[tuple[int, str]]:
        """The resolved parent directory fd of ``rel`` and the final name (not followed)."""
        if rel in self._areas:
            raise PathEscapeError(f"{path!r} is the root of a sandbox area; it cannot be changed")
        parent, name = posixpath.split(rel)
        with self._rootfd() as rootfd:
            fd = self._open(rootfd, parent, os.O_PATH | os.O_DIRECTORY, path)
        try:
            yield fd, name
        finally:
            os.close(fd)

    def _chown(self, fd: int) -> None:
        if self._owner is not None:
            os.fchown(fd, *self._owner)

    # -- synchronous operations (run in a worker thread) ---------------------------------

    def _read_fd(self, path: str) -> int:
        rel = self.to_relative(path)
        with self._rootfd() as rootfd:
            # O_NONBLOCK: opening a named pipe the sandbox planted must not block the host
            fd = self._open(rootfd, rel, os.O_RDONLY | os.O_NONBLOCK, path)
        return _regular(fd, path)

    def _write_fd(self, path: str, mode: int | None) -> int:
        rel = self.to_relative(path)
        parent_rel = posixpath.dirname(rel)
        if parent_rel and not self._area_of(parent_rel):
            raise PathEscapeError(f"{path!r} is the root of a sandbox area; it cannot be written")
        try:
            return self._create(rel, path, mode)
        except FileNotFoundError:
            self._mkdir("/" + parent_rel, parents=True)
            return self._create(rel, path, mode)

    def _create(self, rel: str, path: str, mode: int | None) -> int:
        with self._parent(rel, path) as (pfd, name):
            flags = (os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
                     | os.O_NONBLOCK)  # a named pipe planted there must not block the host
            try:
                fd = os.open(name, flags, 0o644 if mode is None else mode, dir_fd=pfd)
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise _translate(exc, path) from None
                # The final component is a symlink: write through it only if its target
                # exists inside the sandbox (a dangling link could create files elsewhere).
                with self._rootfd() as rootfd:
                    fd = self._open(rootfd, rel, os.O_WRONLY | os.O_TRUNC | os.O_NONBLOCK,
                                    path)
        fd = _regular(fd, path)
        self._chown(fd)
        if mode is not None:
            os.fchmod(fd, mode)
        return fd

    def _read(self, path: str) -> bytes:
        fd = self._read_fd(path)
        try:
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def _write(self, path: str, data: bytes, mode: int | None) -> None:
        fd = self._write_fd(path, mode)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    def _info(self, dirfd: int, name: str, shown: str) -> FileInfo:
        s = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        return _fileinfo(s, shown)

    def _list(self, path: str) -> list[FileInfo]:
        rel = self.to_relative(path)
        shown = "/" + rel
        with self._dir(rel, path) as fd:
            out = []
            for name in sorted(os.listdir(fd)):
                try:
                    out.append(self._info(fd, name, posixpath.join(shown, name)))
                except FileNotFoundError:  # removed while listing
                    continue
            return out

    def _stat(self, path: str) -> FileInfo:
        rel = self.to_relative(path)
        if rel in self._areas:
            with self._dir(rel, path) as fd:
                return _fileinfo(os.fstat(fd), "/" + rel)
        with self._parent(rel, path) as (pfd, name):
            try:
                return self._info(pfd, name, "/" + rel)
            except OSError as exc:
                raise _translate(exc, path) from None

    def _exists(self, path: str) -> bool:
        try:
            self._stat(path)
        except FileNotFoundError:
            return False
        except NotADirectoryError:
            return False
        return True

    def _mkdir(self, path: str, parents: bool) -> None:
        rel = self.to_relative(path)
        area = self._area_of(rel)
        assert area is not None
        parts = rel[len(area) :].strip("/").split("/") if rel != area else []
        todo = parts if parents else parts[-1:]
        start = len(parts) - len(todo)
        for i in range(start, len(parts)):
            sub = "/".join([area, *parts[: i + 1]])
            with self._parent(sub, path) as (pfd, name):
                try:
                    os.mkdir(name, 0o755, dir_fd=pfd)
                except FileExistsError:
                    if i == len(parts) - 1 and not parents:
                        raise
                    s = os.stat(name, dir_fd=pfd, follow_symlinks=True)
                    if not st.S_ISDIR(s.st_mode):
                        raise NotADirectoryError(errno.ENOTDIR, "exists and is not a directory", path) from None
                    continue
                except OSError as exc:
                    raise _translate(exc, path) from None
                if self._owner is not None:
                    os.chown(name, *self._owner, dir_fd=pfd, follow_symlinks=False)

    def _remove(self, path: str, recursive: bool) -> None:
        rel = self.to_relative(path)
        with self._parent(rel, path) as (pfd, name):
            try:
                s = os.stat(name, dir_fd=pfd, follow_symlinks=False)
                if st.S_ISDIR(s.st_mode):
                    if recursive:
                        shutil.rmtree(name, dir_fd=pfd)  # symlink-attack safe with dir_fd
                    else:
                        os.rmdir(name, dir_fd=pfd)
                else:
                    os.unlink(name, dir_fd=pfd)
            except OSError as exc:
                raise _translate(exc, path) from None

    def _rename(self, src: str, dst: str) -> None:
        srel, drel = self.to_relative(src), self.to_relative(dst)
        with self._parent(srel, src) as (sfd, sname), self._parent(drel, dst) as (dfd, dname):
            try:
                os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
            except OSError as exc:
                raise _translate(exc, f"{src} -> {dst}") from None

    # -- the async FileSystem API --------------------------------------------------------

    async def read(self, path: str) -> bytes:
        """Read a whole file (use :meth:`read_stream` for large files)."""
        return await anyio.to_thread.run_sync(self._read, path)

    async def write(self, path: str, data: bytes, *, mode: int | None = None) -> None:
        """Create or replace a file; missing parent directories are created."""
        if len(data) <= _INLINE_BYTES:
            # A few syscalls that cannot block (the open is O_NONBLOCK): cheaper here than
            # a hop to a worker thread, which costs milliseconds on a loaded host.
            self._write(path, bytes(data), mode)
            return
        await anyio.to_thread.run_sync(self._write, path, bytes(data), mode)

    async def read_stream(self, path: str, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        """Yield a file's bytes in chunks of at most ``chunk_size``."""
        fd = await anyio.to_thread.run_sync(self._read_fd, path)
        try:
            while chunk := await anyio.to_thread.run_sync(os.read, fd, chunk_size):
                yield chunk
        finally:
            os.close(fd)

    async def write_stream(self, path: str, chunks: AsyncIterator[bytes]) -> int:
        """Write a file from chunks without holding it whole; return the byte count."""
        fd = await anyio.to_thread.run_sync(self._write_fd, path, None)
        total = 0
        try:
            async for chunk in chunks:
                total += len(chunk)
                await anyio.to_thread.run_sync(_write_all, fd, chunk)
        finally:
            os.close(fd)
        return total

    async def list(self, path: str = ".") -> list[FileInfo]:
        """List a directory (entries are not followed: a symlink is ``type="symlink"``)."""
        return await anyio.to_thread.run_sync(self._list, path)

    # stat, exists and mkdir are a few metadata syscalls (O_PATH opens never block on a
    # planted pipe): run here, not in a worker thread.

    async def stat(self, path: str) -> FileInfo:
        """Describe a path without following a final symlink (like ``lstat``)."""
        return self._stat(path)

    async def exists(self, path: str) -> bool:
        return self._exists(path)

    async def mkdir(self, path: str, *, parents: bool = True) -> None:
        self._mkdir(path, parents)

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file, symlink (not its target) or directory (``recursive`` for trees)."""
        await anyio.to_thread.run_sync(self._remove, path, recursive)

    async def rename(self, src: str, dst: str) -> None:
        await anyio.to_thread.run_sync(self._rename, src, dst)


_INLINE_BYTES = 64 * 1024
"""Writes up to this size run in the caller's thread (a page-cache copy)."""


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _is_link(dirfd: int, name: str) -> bool:
    try:
        return st.S_ISLNK(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _translate(exc: OSError, path: str) -> OSError:
    """Re-raise OS errors naming the sandbox path instead of a host path."""
    if exc.errno == errno.EXDEV:
        return PathEscapeError(f"path {path!r} resolves outside the sandbox")
    if exc.errno == errno.ELOOP:
        return PathEscapeError(f"path {path!r} goes through a symlink loop or a refused link")
    cls: type[OSError] = OSError
    mapped: dict[int, type[OSError]] = {
        errno.ENOENT: FileNotFoundError,
        errno.EEXIST: FileExistsError,
        errno.ENOTDIR: NotADirectoryError,
        errno.EISDIR: IsADirectoryError,
        errno.ENOTEMPTY: OSError,
        errno.EACCES: PermissionError,
        errno.EPERM: PermissionError,
    }
    if exc.errno is not None:
        cls = mapped.get(exc.errno, OSError)
    return cls(exc.errno, exc.strerror, path)


def _fileinfo(s: os.stat_result, shown: str) -> FileInfo:
    kind: Literal["file", "dir", "symlink", "other"]
    if st.S_ISLNK(s.st_mode):
        kind = "symlink"
    elif st.S_ISDIR(s.st_mode):
        kind = "dir"
    elif st.S_ISREG(s.st_mode):
        kind = "file"
    else:
        kind = "other"
    return FileInfo(
        path=shown,
        name=posixpath.basename(shown) or "/",
        type=kind,
        size=s.st_size,
        mtime=s.st_mtime,
        mode=st.S_IMODE(s.st_mode),
    )

