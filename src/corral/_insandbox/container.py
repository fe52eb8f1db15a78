"""In-container helper of the Docker provider: confined file operations.

Run inside the container as ``python3 -I -S -c <this file's source> fs`` (stdlib only, no
corral import; keep it Python 3.8 compatible). The operation comes on stdin as a header (8
ASCII digits giving the length of a JSON object, then the object), then a write's bytes.

``{"op", "path", ...}``: one file operation confined to the writable areas (``/workspace``,
``/tmp``, ``/home/agent``): every path is opened by the kernel (``O_PATH``, symlinks
followed) and the opened descriptor's real path must lie in an area; names are then created,
removed or renamed relative to that descriptor without following the final component.
Errors: exit status 3, ``{"errno", "msg", "escape"}`` on stderr. (``chown``, run as root at
set-up, gives the agent its areas.)

``serve``: the same operations, many in one process (one per docker handle, started through
the sandbox's agent, :mod:`corral.providers._docker_fs_server`). It first makes itself
non-dumpable, so the agent's other processes (same uid, no capabilities) can no longer open
its ``/proc/<pid>/fd`` pipes, read its memory or attach to it; then it answers ``r`` (ready)
and serves requests in turn: each is the same header; a ``write``'s bytes follow as chunks
(8 ASCII digits of length, then the bytes; a zero length ends them). Each answer is frames
of ``<kind: 1 byte><length: 4 bytes big-endian><payload>``: ``d`` data (a read's bytes),
then one ``o`` (done: the JSON answer, ``{"size": n}`` for a read) or ``e`` (the error's
JSON, as above). It ends at the end of its stdin.

This runs with the agent's uid, so nothing it does exceeds what the agent could do itself.
(Commands run under :mod:`corral._insandbox.container_exec`.)
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import shutil
import stat as st
import sys
from collections.abc import Callable, Iterator
from typing import Any


AREAS = ("/workspace", "/tmp", "/home/agent")
CHUNK = 1 << 20


class Escape(Exception):
    pass


def _read_exact(n: int) -> bytes:
    out = b""
    while len(out) < n:
        got = os.read(0, n - len(out))
        if not got:
            raise SystemExit("corral: truncated header")
        out += got
    return out


def _header() -> dict[str, Any]:
    size = int(_read_exact(8))
    out: dict[str, Any] = json.loads(_read_exact(size))
    return out


def _inside(real: str) -> bool:
    return any(real == a or real.startswith(a + "/") for a in AREAS)


def _resolve(path: str) -> int:
    """An O_PATH descriptor of ``path`` (symlinks followed) whose real path is in an area."""
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    real = os.readlink(f"/proc/self/fd/{fd}")
    if not _inside(real):
        os.close(fd)
        raise Escape(path)
    return fd


def _parent(path: str) -> tuple[int, str]:
    d, name = posixpath.split(path)
    if path in AREAS or not name:
        raise Escape(path)
    return _resolve(d), name


def _open(fd: int, flags: int) -> int:
    return os.open(f"/proc/self/fd/{fd}", flags | os.O_CLOEXEC | os.O_NONBLOCK)


def _regular(fd: int, path: str) -> int:
    if not st.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EISDIR, "not a regular file", path)
    os.set_blocking(fd, True)
    return fd


def _info(path: str, s: os.stat_result) -> dict[str, Any]:
    mode = s.st_mode
    kind = ("file" if st.S_ISREG(mode) else "dir" if st.S_ISDIR(mode)
            else "symlink" if st.S_ISLNK(mode) else "other")
    return {"path": path, "name": posixpath.basename(path) or path, "type": kind,
            "size": s.st_size, "mtime": s.st_mtime, "mode": st.S_IMODE(mode)}


def _lstat(path: str) -> os.stat_result:
    if path in AREAS:
        fd = _resolve(path)
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)
    pfd, name = _parent(path)
    try:
        return os.stat(name, dir_fd=pfd, follow_symlinks=False)
    finally:
        os.close(pfd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _raw_out(data: bytes) -> None:
    _write_all(1, data)


def _copy_out(fd: int, emit: Callable[[bytes], None]) -> int:
    total = 0
    while True:
        data = os.read(fd, CHUNK)
        if not data:
            return total
        total += len(data)
        emit(data)


def _stdin_chunks() -> Iterator[bytes]:
    while True:
        data = os.read(0, CHUNK)
        if not data:
            return
        yield data


def _framed_chunks() -> Iterator[bytes]:
    """A ``serve`` write's bytes: length-prefixed chunks, a zero length ends them."""
    while True:
        n = int(_read_exact(8))
        if not n:
            return
        while n:
            data = _read_exact(min(n, CHUNK))
            n -= len(data)
            yield data


def _write(h: dict[str, Any], chunks: Iterator[bytes]) -> None:
    path = h["path"]
    try:
        pfd = _resolve(path)
    except FileNotFoundError:
        pfd = None
    if pfd is not None:
        try:
            fd = _regular(_open(pfd, os.O_WRONLY | os.O_TRUNC), path)
        finally:
            os.close(pfd)
    else:
        try:
            dfd, name = _parent(path)
        except FileNotFoundError:  # write makes the parent directories
            _mkdir({"path": posixpath.dirname(path), "parents": True})
            dfd, name = _parent(path)
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o644, dir_fd=dfd)
        except FileExistsError:
            # a dangling symlink: its target is absent in the sandbox's own view
            raise OSError(errno.ENOENT, "dangling symbolic link", path) from None
        finally:
            os.close(dfd)
    try:
        for data in chunks:
            _write_all(fd, data)
        if h.get("mode") is not None:
            os.fchmod(fd, h["mode"])
    finally:
        os.close(fd)


def _mkdir(h: dict[str, Any]) -> None:
    path = h["path"]
    if not h.get("parents"):
        dfd, name = _parent(path)
        try:
            os.mkdir(name, 0o755, dir_fd=dfd)
        finally:
            os.close(dfd)
        return
    area = next(a for a in AREAS if path == a or path.startswith(a + "/"))
    fd = _resolve(area)
    try:
        for part in path[len(area):].split("/"):
            if not part:
                continue
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            nxt = os.open(part, os.O_PATH | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
            real = os.readlink(f"/proc/self/fd/{fd}")
            if not _inside(real):
                raise Escape(path)
            if not st.S_ISDIR(os.fstat(fd).st_mode):
                raise OSError(errno.ENOTDIR, "not a directory", path)
    finally:
        os.close(fd)


def _remove(h: dict[str, Any]) -> None:
    path = h["path"]
    dfd, name = _parent(path)
    try:
        s = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        if st.S_ISDIR(s.st_mode):
            if h.get("recursive"):
                shutil.rmtree(name, dir_fd=dfd)
            else:
                os.rmdir(name, dir_fd=dfd)
        else:
            os.unlink(name, dir_fd=dfd)
    finally:
        os.close(dfd)


def _rename(h: dict[str, Any]) -> None:
    sfd, sname = _parent(h["path"])
    try:
        dfd, dname = _parent(h["dst"])
        try:
            os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


def _list(h: dict[str, Any]) -> list[dict[str, Any]]:
    path = h["path"]
    pfd = _resolve(path)
    try:
        dfd = _open(pfd, os.O_RDONLY | os.O_DIRECTORY)
    finally:
        os.close(pfd)
    try:
        out = []
        for name in sorted(os.listdir(dfd)):
            try:
                s = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            out.append(_info(posixpath.join(path, name), s))
    finally:
        os.close(dfd)
    return out


def _do(h: dict[str, Any], emit: Callable[[bytes], None], chunks: Iterator[bytes]) -> Any:
    """One operation; its JSON answer (a read's bytes go to ``emit``). Raises Escape or
    OSError. A write's ``chunks`` are consumed whatever happens (``serve`` stays in step)."""
    op, path = h["op"], h["path"]
    if op == "write":
        try:
            _write(h, chunks)
        finally:
            for _ in chunks:  # what a failed write did not take
                pass
        return None
    if op == "read":
        pfd = _resolve(path)
        try:
            fd = _regular(_open(pfd, os.O_RDONLY), path)
        finally:
            os.close(pfd)
        try:
            return {"size": _copy_out(fd, emit)}
        finally:
            os.close(fd)
    if op == "stat":
        return _info(path, _lstat(path))
    if op == "exists":
        try:
            _lstat(path)
            return True
        except FileNotFoundError:
            return False
    if op == "list":
        return _list(h)
    if op == "mkdir":
        _mkdir(h)
    elif op == "remove":
        _remove(h)
    elif op == "rename":
        _rename(h)
    elif op == "chown":
        # setup (as root): the writable areas belong to the agent
        for p in h["paths"]:
            os.makedirs(p, exist_ok=True)
            os.chown(p, h["uid"], h["gid"])
    else:
        raise OSError(errno.EINVAL, "unknown operation " + str(op))
    return None


def _error(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, Escape):
        return {"errno": 0, "msg": "outside", "escape": True}
    assert isinstance(exc, OSError)
    return {"errno": exc.errno or errno.EIO, "msg": exc.strerror or str(exc), "escape": False}


def fs() -> None:
    h = _header()
    try:
        answer = _do(h, _raw_out, _stdin_chunks())
    except (Escape, OSError) as exc:
        sys.stderr.write(json.dumps(_error(exc)))
        sys.exit(3)
    if h["op"] not in ("read", "write", "mkdir", "remove", "rename", "chown"):
        print(json.dumps(answer))


def _frame(kind: bytes, payload: bytes) -> None:
    _write_all(1, kind + len(payload).to_bytes(4, "big") + payload)


def _undumpable() -> None:
    """Make this process non-dumpable (``PR_SET_DUMPABLE`` 0), and check it took: the
    ``/proc`` entries of a non-dumpable process belong to root, so the agent's processes
    can neither open its pipes nor attach to it. Fails (exit 4) when it cannot."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    except (ImportError, OSError, AttributeError):
        pass
    if os.stat("/proc/self/fd").st_uid != 0:
        sys.stderr.write("corral: the file server cannot make itself non-dumpable\n")
        sys.exit(4)


def serve() -> None:
    _undumpable()
    _frame(b"r", b"")
    while True:
        first = os.read(0, 8)
        if not first:
            return  # the host hung up
        size = int(first + _read_exact(8 - len(first)))
        h = json.loads(_read_exact(size))
        chunks = _framed_chunks() if h.get("op") == "write" else iter(())
        try:
            answer = _do(h, lambda data: _frame(b"d", data), chunks)
        except (Escape, OSError) as exc:
            _frame(b"e", json.dumps(_error(exc)).encode())
        else:
            _frame(b"o", json.dumps(answer).encode())


if __name__ == "__main__":
    MODES = {"fs": fs, "serve": serve}
    MODES[sys.argv[1]]()
