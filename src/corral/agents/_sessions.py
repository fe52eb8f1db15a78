"""CLI sessions kept per thread in the store, so a later prompt resumes on any host, in any
sandbox.

After a run, the CLI's session files (the harness's ``session_dirs`` under the sandbox
home) are read through the sandbox's confined filesystem API, redacted, and put in the
run's store (:class:`corral.abc.SessionStore`) with the CLI's session id, replacing
the thread's previous session for that harness whole. Before the next run on that
thread, :func:`restore_session` writes every file the sandbox does not have back into it,
and the harness resumes the saved session id. Nothing is written under
``$CORRAL_HOME/sessions`` any more: what an older corral left there moves into the store
the first time this process uses it (:mod:`corral.stores._sessions_import`).

Sandbox contents are hostile: only regular files are copied (symlinks are skipped), paths
are checked (the store refuses any that could climb out of the sandbox home), and a
session larger than the store's limits (``session_limits``, 256 MiB and 20000 files by
default) is refused with :class:`SessionSaveError` rather than truncated.

A transcript holds whatever the agent saw, so a command that printed a secret leaves its
value there. Saved files go through the run's redactor (``redactor=``) before anything
reaches the store, line by line: a line that is JSON (the CLIs' transcripts are JSON
lines) is decoded, its strings redacted to ``[REDACTED:NAME]`` and encoded again, so
every line stays valid JSON and the CLI still resumes it; any other line is redacted as
bytes. The restored session then carries the redacted text back into the next sandbox,
never the value.

A session kept in SQLite (opencode) is redacted first inside the sandbox, through SQL
(:mod:`corral._insandbox.sqlite_redact`, run with the sandbox's Python): byte replacement of
another length would break the database's write-ahead log, and a value split across pages
would not be found. The byte pass still follows.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from corral._errors import CorralError
from corral._insandbox import sqlite_redact
from corral._log import library_logger
from corral._paths import home_path
from corral.harness._cli_base import SANDBOX_PYTHON
from corral.sandbox._contracts import Handle
from corral.sandbox._redact import Redactor
from corral.stores._protocols import (
    InvalidSession,
    SessionInfo,
    SessionStore,
    SessionTooLarge,
    StoredSession,
    StoreError,
    check_session_path,
)
from corral.stores._sessions_import import import_home_sessions

__all__ = [
    "SANDBOX_HOME",
    "SavedSession",
    "SessionCheck",
    "SessionSaveError",
    "SessionUnusable",
    "load_session",
    "redact_line",
    "restore_session",
    "save_session",
]

SANDBOX_HOME = "/home/agent"
DATABASE_REDACT_TIMEOUT = 60.0
log = library_logger("corral.agents._sessions")

SavedSession = SessionInfo
"""A CLI session saved for a thread, as the store lists it (no bytes)."""


class SessionSaveError(CorralError):
    """A CLI session could not be saved (too big, unreadable); the message says which."""


class SessionUnusable(CorralError):
    """The thread's saved session is one its CLI cannot resume (:data:`SessionCheck`);
    nothing of it was written into the sandbox."""

    def __init__(self, session_id: str, problem: str) -> None:
        super().__init__(problem)
        self.session_id = session_id
        self.problem = problem


SessionCheck = Callable[[Mapping[str, bytes], str], "str | None"]
"""Why saved files (home-relative path → bytes) cannot resume a session id, or ``None``
(:meth:`corral.harness._cli_base.CliHarness.session_problem`)."""


_imported: set[tuple[str, str]] = set()
"""(home, store URL) pairs whose ``$CORRAL_HOME/sessions`` this process moved already."""


async def import_old_sessions(store: SessionStore) -> None:
    """Once per process, home and store: move what an older corral saved under
    ``$CORRAL_HOME/sessions`` into ``store`` (:func:`import_home_sessions`). Never into a
    ``memory://`` store (they would be gone with the process). Never raises."""
    url = str(getattr(store, "url", ""))
    home = home_path()
    key = (str(home), url)
    if key in _imported or not url or url.startswith("memory:"):
        return
    _imported.add(key)
    try:
        await import_home_sessions(store, home)
    except (OSError, StoreError) as exc:
        log.warning("saved sessions in %s could not be moved into the store: %s",
                    home / "sessions", exc)


async def load_session(store: SessionStore, thread_id: str, harness: str
                       ) -> SavedSession | None:
    """The session saved for ``thread_id`` and ``harness`` in ``store``, if any."""
    await import_old_sessions(store)
    for info in await store.list_sessions(thread_id):
        if info.harness == harness:
            return info
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
    """Collects a file's chunks, through ``redactor`` a whole line at a time."""

    def __init__(self, redactor: Redactor | None) -> None:
        self.out = bytearray()
        self.redactor = redactor if redactor else None  # an empty redactor: plain copy
        # A value with a newline in it (a PEM key) can span lines of a raw file: then the
        # whole file is held and redacted once more as a whole (bounded by max_bytes).
        self.whole = self.redactor is not None and any(
            "\n" in value for _name, value in self.redactor.items())
        self.pending = bytearray()

    def _redacted(self, data: bytes) -> bytes:
        assert self.redactor is not None
        lines = data.split(b"\n")
        done = [redact_line(line + b"\n", self.redactor) for line in lines[:-1]]
        if lines[-1]:
            done.append(redact_line(lines[-1], self.redactor))
        return b"".join(done)

    def write(self, chunk: bytes) -> None:
        if self.redactor is None:
            self.out += chunk
            return
        self.pending += chunk
        if self.whole:
            return
        cut = self.pending.rfind(b"\n") + 1  # a partial line waits for the rest of it
        if cut:
            self.out += self._redacted(bytes(self.pending[:cut]))
            del self.pending[:cut]

    def close(self) -> bytes:
        if self.redactor is not None and self.pending:
            data = self._redacted(bytes(self.pending))
            self.out += self.redactor.redact_bytes(data) if self.whole else data
        self.pending.clear()
        return bytes(self.out)


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
    store: SessionStore,
    run_id: str | None = None,
    redactor: Redactor | None = None,
) -> SavedSession:
    """Copy ``dirs`` (relative to the sandbox home) out of the sandbox into ``store`` as
    ``thread_id``'s ``harness`` session, every file through ``redactor`` (the run's
    secrets; see the module docstring). :class:`SessionSaveError` when the session is
    over the store's limits or cannot be stored (then the store's copy is unchanged)."""
    await import_old_sessions(store)
    limits = store.session_limits
    if redactor:
        tops = [posixpath.join(SANDBOX_HOME, d) for d in dirs]
        present = [t for t in tops if await handle.fs.exists(t)]
        if present:
            await _redact_databases(handle, present, redactor)
    found: list[tuple[str, int]] = []
    for d in dirs:
        top = posixpath.join(SANDBOX_HOME, d)
        if await handle.fs.exists(top):
            await _walk(handle, top, found, limits.max_files)
    total = sum(size for _, size in found)

    def too_large(what: str) -> SessionSaveError:
        return SessionSaveError(
            f"the {harness} session of thread {thread_id!r} is too large to save ({what}; "
            f"limits {limits.max_files} files, {limits.max_bytes} bytes)")

    if len(found) > limits.max_files or total > limits.max_bytes:
        raise too_large(f"{len(found)} files, {total} bytes")
    files: dict[str, bytes] = {}
    copied = 0
    for path, _size in found:
        rel = posixpath.relpath(path, SANDBOX_HOME)
        try:
            check_session_path(rel)
        except InvalidSession:
            continue  # outside the home, or a name no session keeps: never copied
        out = _Writer(redactor)
        async for chunk in handle.fs.read_stream(path):
            copied += len(chunk)
            if copied > limits.max_bytes:  # it grows while being read
                raise too_large(f"more than {limits.max_bytes} bytes")
            out.write(chunk)
        files[rel] = out.close()
    try:
        return await store.put_session(StoredSession(
            thread_id, harness, session_id, files, time.time(), run_id))
    except SessionTooLarge as exc:  # redaction made it larger than the limit
        raise SessionSaveError(str(exc)) from None
    except InvalidSession as exc:
        raise SessionSaveError(f"the {harness} session of thread {thread_id!r} cannot be "
                               f"saved: {exc}") from None


async def restore_session(handle: Handle, thread_id: str, harness: str, *,
                          store: SessionStore, check: SessionCheck | None = None
                          ) -> SavedSession | None:
    """Write a saved session's files from ``store`` into the sandbox home (files it
    already has are kept). Returns the saved session, or ``None`` when the thread has none
    for ``harness``. ``check``: raise :class:`SessionUnusable` (writing nothing) when it
    finds the saved session unusable, unless the sandbox (a thread's kept one) has
    files of it already: the CLI then resumes from those and decides."""
    await import_old_sessions(store)
    saved = await store.get_session(thread_id, harness)
    if saved is None:
        return None
    if check is not None and saved.session_id:
        problem = check(saved.files, saved.session_id)
        if problem is not None:
            # a thread's kept sandbox may hold a whole copy where the store's is damaged
            for rel in saved.files:
                if await handle.fs.exists(posixpath.join(SANDBOX_HOME, rel)):
                    return saved.info()
            raise SessionUnusable(saved.session_id, problem)
    for rel, data in saved.files.items():
        check_session_path(rel)  # the store checks too; a sandbox path is built from it
        target = posixpath.join(SANDBOX_HOME, rel)
        if await handle.fs.exists(target):
            continue
        with contextlib.suppress(IsADirectoryError, NotADirectoryError):
            await handle.fs.write(target, data)
    return saved.info()
