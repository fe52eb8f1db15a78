"""Stream a tree out of the sandbox for a checkpoint, or back in for a restore (#27).

Run in the sandbox with its Python (``python3 -I -S -c SOURCE``, stdlib only), as the
sandbox's user, in one process per checkpoint or restore: a 100 MiB workspace of 2000
files is one exec, not thousands of file-system calls.

Frames (both directions): one type byte, a 4-byte big-endian length, the payload.

``save``: stdin is one request of NUL-separated fields (no JSON to parse: the ``json``
module's import alone is a good part of a small checkpoint's time): ``S``, the chunk size,
the number of roots, then per root the ROOT, the number of known files and, for each, its
path and ``size:mtime_ns:stamp``; a ROOT is ``.`` (the working
directory the command was started in) or a path (``~`` expanded). Output: an ``H`` frame
(JSON: per root its entries ``[path, kind, mode, size, mtime_ns, stamp, target, need]``,
parents before children, or ``{"missing": true}``), then for each entry with ``need``, in
order, its content as ``D`` frames of at most ``chunk`` bytes and an ``E`` frame (or an
``X`` frame with the reason it could not be read), then ``Z``. A file whose size, mtime and
stamp (device, inode, change time) equal its ``known`` values is not read.

``restore``: stdin is an ``H`` frame (JSON ``{"op": "restore", "roots": [{"root": ROOT,
"entries": [[path, kind, mode, size, mtime_ns, target, content], ...]}]}``), then for each
entry with ``content``, in order, its ``D`` frames and an ``E`` frame. Each root is
emptied first (nothing followed), then rebuilt: every step opens the next component
relative to its parent's descriptor with ``O_NOFOLLOW``, every path must stay under the
root (no ``..``, ``.``, empty or absolute) and every parent must be a directory of the
request, and symlinks are made last, so no write ever goes through a symlink. Output: one
JSON line ``{"ok": true}`` or ``{"error": "..."}`` (exit status 1).
"""

from __future__ import annotations

import os
import stat
import sys

# what a checkpoint costs is mostly this process's start: ``typing``, ``json`` (and its
# ``re``) and ``struct`` are not imported on the save path (tens of ms on a loaded host)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, BinaryIO
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(Exception):
    """The request breaks a rule; nothing more is written."""


def _frame(out: BinaryIO, kind: bytes, payload: bytes = b"") -> None:
    out.write(kind + len(payload).to_bytes(4, "big"))
    if payload:
        out.write(payload)


def _read_exact(inp: BinaryIO, n: int) -> bytes:
    data = inp.read(n)
    if data is None or len(data) != n:
        raise Refused("the input ended early")
    return data


def _read_frame(inp: BinaryIO, limit: int) -> tuple[bytes, bytes]:
    head = _read_exact(inp, 5)
    kind, length = head[:1], int.from_bytes(head[1:], "big")
    if length > limit:
        raise Refused(f"a frame of {length} bytes is over the limit")
    return kind, _read_exact(inp, length) if length else b""


def _root_path(root: str) -> str:
    return "." if root == "." else os.path.expanduser(root)


# --------------------------------------------------------------------------- save


def _json_string() -> Any:
    """A str's JSON text (ASCII, lone surrogates escaped as json.dumps does)."""
    try:
        from _json import encode_basestring_ascii

        return encode_basestring_ascii
    except ImportError:  # not CPython: the json module's own
        from json import dumps

        return dumps


def _walk(top: str, known: dict[str, str], entries: list[str], need: list[str]) -> None:
    """Every entry under ``top`` as JSON text ``[path, kind, mode, size, mtime_ns, stamp,
    target, need]``, parents before children; the files to send, in order, into ``need``."""
    enc = _json_string()
    append = entries.append
    is_dir, is_reg, is_lnk, imode = stat.S_ISDIR, stat.S_ISREG, stat.S_ISLNK, stat.S_IMODE

    def visit(directory: str, prefix: str) -> None:
        try:
            with os.scandir(directory) as it:
                found = {entry.name: entry for entry in it}
        except OSError:
            return
        for name in sorted(found):
            entry = found[name]
            rel = prefix + name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
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
                visit(entry.path, rel + "/")
            elif is_lnk(st_mode):
                try:
                    target = os.readlink(entry.path)
                except OSError:
                    continue
                append(f'[{enc(rel)},"symlink",{imode(st_mode)},0,{st.st_mtime_ns},"",'
                       f'{enc(target)},0]')
            # sockets, fifos and devices are not workspace content

    visit(top, "")


def _grow_pipe(stream: BinaryIO) -> None:
    """A 1 MiB pipe (the largest an unprivileged process may ask for): the writer runs a
    whole chunk ahead of the reader instead of waking it every 64 KiB."""
    try:
        import fcntl

        fcntl.fcntl(stream.fileno(), fcntl.F_SETPIPE_SZ, 1 << 20)
    except (ImportError, OSError, AttributeError, ValueError):
        pass  # not a pipe, or a lower limit: the default size works, only slower


def _send_file(out: BinaryIO, path: str, chunk: int) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        _frame(out, b"X", str(exc.strerror or exc).encode())
        return
    send_open(out, fd, chunk)


def send_open(out: BinaryIO, fd: int, chunk: int) -> None:
    """The content of the file open as ``fd`` (then closed) as ``D`` frames of ``chunk``
    bytes and an ``E`` frame, or an ``X`` frame when it is no regular file or unreadable."""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            _frame(out, b"X", b"not a regular file any more")
            return
        while True:
            try:
                data = os.read(fd, chunk)
            except OSError as exc:
                _frame(out, b"X", str(exc.strerror or exc).encode())
                return
            if not data:
                break
            while len(data) < chunk:  # fill whole chunks: equal content, equal chunks
                more = os.read(fd, chunk - len(data))
                if not more:
                    break
                data += more
            _frame(out, b"D", data)
        _frame(out, b"E")
    finally:
        os.close(fd)


def parse_save(data: bytes) -> tuple[int, list[tuple[str, dict[str, str]]]]:
    """The save request: NUL-separated ``S``, chunk, root count, then per root: root,
    known count, and that many ``path, size:mtime_ns:stamp`` pairs."""
    tokens = data.split(b"\0")
    if tokens[0] != b"S":
        raise ValueError("not a save request")
    chunk, count, at = int(tokens[1]), int(tokens[2]), 3
    roots: list[tuple[str, dict[str, str]]] = []
    for _ in range(count):
        root, n = os.fsdecode(tokens[at]), int(tokens[at + 1])
        at += 2
        end = at + 2 * n
        known = dict(zip(map(os.fsdecode, tokens[at:end:2]),
                         map(bytes.decode, tokens[at + 1:end:2]), strict=True))
        at = end
        roots.append((root, known))
    return chunk, roots


def save(data: bytes, out: BinaryIO) -> None:
    chunk, roots = parse_save(data)
    _grow_pipe(out)
    docs: list[str] = []
    sends: list[tuple[str, list[str]]] = []
    for root, known in roots:
        top = _root_path(root)
        if not os.path.isdir(top):
            docs.append('{"missing":true}')
            continue
        entries: list[str] = []
        need: list[str] = []
        _walk(top, known, entries, need)
        docs.append('{"entries":[' + ",".join(entries) + "]}")
        sends.append((top, need))
    _frame(out, b"H", ('{"roots":[' + ",".join(docs) + "]}").encode("ascii"))
    for top, need in sends:
        for rel in need:
            _send_file(out, os.path.join(top, rel), chunk)
    _frame(out, b"Z")


# --------------------------------------------------------------------------- restore


def _check_path(path: Any, dirs: set[str]) -> list[str]:
    if not isinstance(path, str) or not path or path.startswith("/") or "\0" in path:
        raise Refused(f"path {path!r} is not relative")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise Refused(f"path {path!r} leaves its root")
    parent = "/".join(parts[:-1])
    if parent and parent not in dirs:
        raise Refused(f"path {path!r}: its parent is not a directory of the checkpoint")
    return parts


def _clear(dir_fd: int) -> None:
    """Remove everything in the directory ``dir_fd``, following no symlink."""
    for entry in list(os.scandir(dir_fd)):
        if entry.is_dir(follow_symlinks=False):
            child = os.open(entry.name, _DIR_FLAGS, dir_fd=dir_fd)
            try:
                os.fchmod(child, 0o700)  # a read-only directory of the agent's
                _clear(child)
            finally:
                os.close(child)
            os.rmdir(entry.name, dir_fd=dir_fd)
        else:
            os.unlink(entry.name, dir_fd=dir_fd)


class _Opener:
    """Parent directory descriptors, opened component by component with ``O_NOFOLLOW``
    (the last one kept: entries come parents first, siblings together)."""

    def __init__(self, root_fd: int) -> None:
        self.root_fd = root_fd
        self.cached: tuple[str, int] | None = None

    def parent(self, parts: list[str]) -> int:
        key = "/".join(parts[:-1])
        if not key:
            return self.root_fd
        if self.cached is not None and self.cached[0] == key:
            return self.cached[1]
        self.close()
        fd = os.dup(self.root_fd)
        try:
            for name in parts[:-1]:
                nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        self.cached = (key, fd)
        return fd

    def close(self) -> None:
        if self.cached is not None:
            os.close(self.cached[1])
            self.cached = None


def _restore_root(inp: BinaryIO, spec: dict[str, Any], chunk: int) -> None:
    top = _root_path(spec["root"])
    if top != ".":
        os.makedirs(top, mode=0o700, exist_ok=True)
    root_fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    opener = _Opener(root_fd)
    try:
        _clear(root_fd)
        dirs: set[str] = set()
        later: list[tuple[list[str], list[Any]]] = []
        for e in spec["entries"]:
            path, kind, mode, _size, mtime_ns, target, content = e
            parts = _check_path(path, dirs)
            mode = int(mode) & 0o1777  # never set-id
            if kind == "dir":
                os.mkdir(parts[-1], 0o700, dir_fd=opener.parent(parts))
                dirs.add(path)
                later.append((parts, e))
            elif kind == "file":
                pfd = opener.parent(parts)
                fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o600, dir_fd=pfd)
                try:
                    while content:
                        kind_b, data = _read_frame(inp, chunk)
                        if kind_b == b"E":
                            break
                        if kind_b != b"D":
                            raise Refused(f"unexpected frame {kind_b!r}")
                        view = memoryview(data)
                        while view:
                            view = view[os.write(fd, view):]
                    os.fchmod(fd, mode)
                    os.utime(fd, ns=(int(mtime_ns), int(mtime_ns)))
                finally:
                    os.close(fd)
            elif kind == "symlink":
                if not isinstance(target, str) or not target or "\0" in target:
                    raise Refused(f"symlink {path!r} has no target")
                later.append((parts, e))
            else:
                raise Refused(f"unknown kind {kind!r}")
        # symlinks last (nothing is written through them), then the directories' modes
        # and times, deepest first (writing into a directory changes its time)
        for parts, e in later:
            if e[1] == "symlink":
                pfd = opener.parent(parts)
                os.symlink(e[5], parts[-1], dir_fd=pfd)
                os.utime(parts[-1], ns=(int(e[4]), int(e[4])), dir_fd=pfd,
                         follow_symlinks=False)
        for parts, e in sorted((x for x in later if x[1][1] == "dir"),
                               key=lambda x: -len(x[0])):
            pfd = opener.parent(parts)
            fd = os.open(parts[-1], _DIR_FLAGS, dir_fd=pfd)
            try:
                os.utime(fd, ns=(int(e[4]), int(e[4])))
                os.fchmod(fd, int(e[2]) & 0o1777)
            finally:
                os.close(fd)
    finally:
        opener.close()
        os.close(root_fd)


def restore(inp: BinaryIO, out: BinaryIO) -> None:
    import json

    _grow_pipe(inp)
    try:
        kind, head = _read_frame(inp, 1 << 30)
        if kind != b"H":
            raise Refused("the request does not start with a header")
        request = json.loads(head)
        chunk = int(request["chunk"])
        for spec in request["roots"]:
            _restore_root(inp, spec, chunk)
    except (Refused, OSError, ValueError, KeyError, TypeError) as exc:
        out.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode() + b"\n")
        out.flush()
        sys.exit(1)
    out.write(b'{"ok": true}\n')


def main() -> None:
    inp = sys.stdin.buffer
    out = sys.stdout.buffer
    first = inp.peek(1)[:1] if hasattr(inp, "peek") else b""
    if first == b"H":
        restore(inp, out)
    else:
        save(inp.read(), out)
    out.flush()


if __name__ == "__main__":
    main()
