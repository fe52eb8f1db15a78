"""CLI sessions kept per thread, so a later prompt resumes even in a fresh sandbox.

After a run, the CLI's session files (the harness's ``session_dirs`` under the sandbox
home) are copied through the sandbox's confined filesystem API to
``$CORRAL_HOME/sessions/<thread>/<harness>/files/`` and the CLI's session id to
``session.json`` next to them (written last, atomically). Before the next run on that
thread, :func:`restore_session` copies back every file the sandbox does not have, and the
harness resumes the saved session id.

Sandbox contents are hostile: only regular files are copied (symlinks are skipped), paths
are checked, and a copy larger than ``max_bytes`` or ``max_files`` is refused with
:class:`SessionSaveError` rather than truncated.

A transcript holds whatever the agent saw, so a command that printed a secret leaves its
value there. Saved files go through the run's redactor (``redactor=``), line by line: a
line that is JSON (the CLIs' transcripts are JSON lines) is decoded, its strings redacted
to ``[REDACTED:NAME]`` and encoded again, so every line stays valid JSON and the CLI still
resumes it; any other line is redacted as bytes. The restored session then carries the
redacted text back into the next sandbox, never the value.

A session kept in SQLite (opencode) is redacted first inside the sandbox, through SQL
(:mod:`corral._insandbox.sqlite_redact`, run with the sandbox's Python): byte replacement of
another length would break the database's write-ahead log, and a value split across pages
would not be found. The byte pass still follows.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from corral._errors import CorralError
from corral._log import library_logger
from corral._paths import corral_home
from corral.harness._cli_base import SANDBOX_PYTHON
from corral.sandbox._contracts import Handle
from corral.sandbox._redact import Redactor

__all__ = [
    "SANDBOX_HOME",
    "SavedSession",
    "SessionSaveError",
    "load_session",
    "redact_line",
    "restore_session",
    "save_session",
    "thread_dir",
]

SANDBOX_HOME = "/home/agent"
DATABASE_REDACT_TIMEOUT = 60.0
log = library_logger("corral.agents._sessions")
MAX_BYTES = 256 << 20
MAX_FILES = 20000
_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class SessionSaveError(CorralError):
    """A CLI session could not be saved (too big, unreadable); the message says which."""


@dataclass(frozen=True, slots=True)
class SavedSession:
    """A CLI session saved for a thread."""

    harness: str
    session_id: str
    saved_at: float
    files: int
    bytes: int


def thread_dir(thread_id: str, root: Path | None = None) -> Path:
    """``$CORRAL_HOME/sessions/<thread>`` (a digest when the id is not a safe name)."""
    if not isinstance(thread_id, str) or not thread_id:
        raise CorralError("a thread id must be a non-empty string")
    name = thread_id if _SAFE.match(thread_id) and ".." not in thread_id else (
        "h-" + hashlib.sha256(thread_id.encode()).hexdigest()[:32])
    return (root or corral_home() / "sessions") / name


def _harness_dir(thread_id: str, harness: str, root: Path | None) -> Path:
    return thread_dir(thread_id, root) / harness


def load_session(thread_id: str, harness: str, *, root: Path | None = None
                 ) -> SavedSession | None:
    """The session saved for ``thread_id`` and ``harness``, if any."""
    path = _harness_dir(thread_id, harness, root) / "session.json"
    try:
        data = json.loads(path.read_text())
        return SavedSession(str(data["harness"]), str(data["session_id"]),
                            float(data["saved_at"]), int(data["files"]), int(data["bytes"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def redact_line(line: bytes, redactor: Redactor) -> bytes:
    """``line`` (with its newline, if any) with every secret of ``redactor`` replaced.

    A JSON line is redacted inside its decoded strings and re-encoded (a byte-level
    replacement could cut a JSON escape in half and make the line unreadable to the CLI);
    other lines, and what re-encoding shows, are redacted as bytes."""
    redacted = redactor.redact_bytes(line)
    if redacted == line:
        return line  # the common case: untouched, byte for byte
    body, newline = (line[:-1], b"\n") if line.endswith(b"\n") else (line, b"")
    try:
        obj = json.loads(body)
    except ValueError:
        return redacted
    text = json.dumps(redactor.redact_obj(obj), ensure_ascii=False, separators=(",", ":"))
    return redactor.redact_bytes(text.encode("utf-8")) + newline


class _Writer:
    """Writes a file's chunks to ``fd``, through ``redactor`` a whole line at a time."""

    def __init__(self, fd: int, redactor: Redactor | None) -> None:
        self.fd = fd
        self.redactor = redactor if redactor else None  # an empty redactor: plain copy
        # A value with a newline in it (a PEM key) can span lines of a raw file: then the
        # whole file is held and redacted once more as a whole (bounded by max_bytes).
        self.whole = self.redactor is not None and any(
            "\n" in value for _name, value in self.redactor.items())
        self.pending = bytearray()
        self.written = 0

    def _out(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]
        self.written += len(data)

    def _redacted(self, data: bytes) -> bytes:
        assert self.redactor is not None
        lines = data.split(b"\n")
        done = [redact_line(line + b"\n", self.redactor) for line in lines[:-1]]
        if lines[-1]:
            done.append(redact_line(lines[-1], self.redactor))
        return b"".join(done)

    def write(self, chunk: bytes) -> None:
        if self.redactor is None:
            self._out(chunk)
            return
        self.pending += chunk
        if self.whole:
            return
        cut = self.pending.rfind(b"\n") + 1  # a partial line waits for the rest of it
        if cut:
            self._out(self._redacted(bytes(self.pending[:cut])))
            del self.pending[:cut]

    def close(self) -> None:
        if self.redactor is not None and self.pending:
            data = self._redacted(bytes(self.pending))
            self._out(self.redactor.redact_bytes(data) if self.whole else data)
        self.pending.clear()


async def _walk(handle: Handle, top: str, out: list[tuple[str, int]], limit: int) -> None:
    for info in await handle.fs.list(top):
        if len(out) > limit:
            return
        if info.type == "dir":
            await _walk(handle, info.path, out, limit)
        elif info.type == "file":
            out.append((info.path, info.size))


async def _redact_databases(handle: Handle, tops: list[str], redactor: Redactor) -> None:
    """Redact the SQLite databases under ``tops`` in the sandbox (see the module
    docstring); problems are logged, never raised: the byte pass comes next anyway."""
    from corral._insandbox import sqlite_redact

    source = Path(sqlite_redact.__file__).read_text()
    request = json.dumps({"dirs": tops, "table": redactor.table()}).encode()
    try:
        result = await handle.process.exec([SANDBOX_PYTHON, "-I", "-S", "-c", source],
                                           stdin=request, timeout=DATABASE_REDACT_TIMEOUT)
    except (OSError, CorralError) as exc:
        log.warning("cannot redact the session's databases in the sandbox: %s", exc)
        return
    if result.exit_code != 0:
        log.warning("redacting the session's databases failed (exit %s): %s",
                    result.exit_code, result.stderr[-500:].decode("utf-8", "replace"))
    for line in result.stdout.decode("utf-8", "replace").splitlines():
        if '"error"' in line:  # the sandbox's words: logged, redacted, never trusted
            log.warning("a session database was not redacted in the sandbox: %s",
                        redactor.redact(line[:500]))


async def save_session(
    handle: Handle,
    harness: str,
    dirs: tuple[str, ...],
    thread_id: str,
    session_id: str,
    *,
    root: Path | None = None,
    max_bytes: int = MAX_BYTES,
    max_files: int = MAX_FILES,
    redactor: Redactor | None = None,
) -> SavedSession:
    """Copy ``dirs`` (relative to the sandbox home) out of the sandbox for ``thread_id``,
    every file through ``redactor`` (the run's secrets; see the module docstring)."""
    if redactor:
        tops = [posixpath.join(SANDBOX_HOME, d) for d in dirs]
        present = [t for t in tops if await handle.fs.exists(t)]
        if present:
            await _redact_databases(handle, present, redactor)
    files: list[tuple[str, int]] = []
    for d in dirs:
        top = posixpath.join(SANDBOX_HOME, d)
        if await handle.fs.exists(top):
            await _walk(handle, top, files, max_files)
    total = sum(size for _, size in files)
    if len(files) > max_files or total > max_bytes:
        raise SessionSaveError(
            f"the {harness} session of thread {thread_id!r} is too large to save "
            f"({len(files)} files, {total} bytes; limits {max_files} files, {max_bytes} bytes)"
        )
    base = _harness_dir(thread_id, harness, root)
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = base / f".files-{os.getpid()}-{time.monotonic_ns()}"
    tmp.mkdir(mode=0o700)
    copied = 0
    written = 0
    try:
        for path, _size in files:
            rel = posixpath.relpath(path, SANDBOX_HOME)
            if rel.startswith(("..", "/")):
                continue
            dest = tmp / rel
            dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            out = _Writer(fd, redactor)
            try:
                async for chunk in handle.fs.read_stream(path):
                    copied += len(chunk)
                    if copied > max_bytes:
                        raise SessionSaveError(
                            f"the {harness} session of thread {thread_id!r} grew past "
                            f"{max_bytes} bytes while being saved"
                        )
                    out.write(chunk)
                out.close()
            finally:
                os.close(fd)
            written += out.written
        old = base / "files"
        trash = base / f".old-{os.getpid()}-{time.monotonic_ns()}"
        if old.exists():
            os.rename(old, trash)
        os.rename(tmp, old)
        shutil.rmtree(trash, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    saved = SavedSession(harness, session_id, time.time(), len(files), written)
    meta = base / "session.json"
    meta_tmp = base / "session.json.tmp"
    meta_tmp.write_text(json.dumps(asdict(saved)))
    os.replace(meta_tmp, meta)
    return saved


async def restore_session(handle: Handle, thread_id: str, harness: str, *,
                          root: Path | None = None) -> SavedSession | None:
    """Copy a saved session's files into the sandbox home (files it already has are kept).
    Returns the saved session, or ``None`` when the thread has none for ``harness``."""
    saved = load_session(thread_id, harness, root=root)
    if saved is None:
        return None
    files = _harness_dir(thread_id, harness, root) / "files"
    if not files.is_dir():
        return saved
    for dirpath, _dirnames, filenames in os.walk(files):
        for name in filenames:
            host = Path(dirpath) / name
            if host.is_symlink() or not host.is_file():
                continue
            rel = host.relative_to(files).as_posix()
            target = posixpath.join(SANDBOX_HOME, rel)
            if await handle.fs.exists(target):
                continue
            with contextlib.suppress(IsADirectoryError):
                await handle.fs.write(target, host.read_bytes())
    return saved
