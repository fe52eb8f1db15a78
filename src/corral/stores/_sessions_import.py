"""The one-time move of saved CLI sessions from ``$CORRAL_HOME/sessions`` into a store.

corral used to keep each thread's saved CLI session on the host that ran its last turn, as
``$CORRAL_HOME/sessions/<thread>/<harness>/`` (``files/`` and ``session.json``). Sessions
now live in the store (:class:`~corral.abc.SessionStore`), where any host finds them.
:func:`import_home_sessions` copies what such a directory holds into a store (only where
the store has no session for that thread and harness: a newer one wins), then renames the
directory to ``sessions.migrated-<time>`` so that it happens once. The files were redacted
when they were saved. Entries that cannot be read back as a session (a thread directory
named by a digest, whose thread id is lost; a corrupt ``session.json``; a hostile path; a
session over the store's limits) are skipped with a warning, never a traceback.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import stat
import time
from pathlib import Path

import anyio.to_thread

from corral.stores._protocols import SessionStore, StoredSession, StoreError, check_session_path

__all__ = ["LEGACY_DIR", "import_home_sessions"]

log = logging.getLogger("corral.stores._sessions_import")

LEGACY_DIR = "sessions"
_DIGEST = re.compile(r"^h-[0-9a-f]{32}$")


def _read_files(top: Path, max_files: int, max_bytes: int) -> dict[str, bytes]:
    """The regular files under ``top`` (symlinks and others skipped), by relative path."""
    files: dict[str, bytes] = {}
    total = 0
    for dirpath, dirnames, names in os.walk(top, followlinks=False):
        dirnames.sort()
        for name in sorted(names):
            path = Path(dirpath) / name
            rel = path.relative_to(top).as_posix()
            check_session_path(rel)
            if not stat.S_ISREG(os.lstat(path).st_mode):
                continue  # a symlink (or other) is no session file: never followed
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    continue  # it became a symlink since
                raise
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    continue
                with os.fdopen(fd, "rb", closefd=False) as f:
                    data = f.read(max_bytes - total + 1)
            finally:
                os.close(fd)
            total += len(data)
            files[rel] = data
            if len(files) > max_files or total > max_bytes:
                raise StoreError(f"it is over the store's limits ({max_files} files, "
                                 f"{max_bytes} bytes)")
    return files


def _read_entry(base: Path, thread_id: str, harness: str, max_files: int, max_bytes: int
                ) -> StoredSession:
    meta = json.loads((base / "session.json").read_text())
    if not isinstance(meta, dict) or meta.get("harness") != harness:
        raise ValueError("session.json does not describe this harness")
    session_id = meta.get("session_id")
    saved_at = meta.get("saved_at")
    if not isinstance(session_id, str) or not isinstance(saved_at, int | float):
        raise ValueError("session.json has no session id or time")
    files_dir = base / "files"
    files = (_read_files(files_dir, max_files, max_bytes)
             if files_dir.is_dir() and not files_dir.is_symlink() else {})
    return StoredSession(thread_id, harness, session_id, files, float(saved_at))


def _entries(root: Path) -> list[tuple[str, str, Path]]:
    found: list[tuple[str, str, Path]] = []
    for thread_dir in sorted(root.iterdir()):
        if thread_dir.is_symlink() or not thread_dir.is_dir():
            continue
        if _DIGEST.match(thread_dir.name):
            log.warning("saved sessions %s: not moved to the store: the directory is named "
                        "by a digest of its thread id, which cannot be recovered", thread_dir)
            continue
        for harness_dir in sorted(thread_dir.iterdir()):
            if harness_dir.is_dir() and not harness_dir.is_symlink():
                found.append((thread_dir.name, harness_dir.name, harness_dir))
    return found


async def import_home_sessions(store: SessionStore, home: Path) -> int | None:
    """Move ``home/sessions`` into ``store`` (see the module docstring); returns how many
    sessions were imported, ``None`` when there was no such directory."""
    root = home / LEGACY_DIR
    if not root.is_dir() or root.is_symlink():
        return None
    limits = store.session_limits
    try:
        entries = await anyio.to_thread.run_sync(_entries, root)
    except OSError as exc:
        log.warning("saved sessions in %s: cannot list them (%s); left where they are",
                    root, exc)
        return 0
    imported = 0
    for thread_id, harness, base in entries:
        try:
            saved = await anyio.to_thread.run_sync(
                _read_entry, base, thread_id, harness, limits.max_files, limits.max_bytes)
            if await store.get_session(thread_id, harness) is not None:
                continue  # the store's is newer: it was saved since
            await store.put_session(saved)
            imported += 1
        except (OSError, ValueError, StoreError) as exc:  # (JSON errors are ValueErrors)
            log.warning("saved session %s: not moved to the store: %s", base,
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    done = root.with_name(f"{LEGACY_DIR}.migrated-{int(time.time())}")
    try:
        root.rename(done)
    except FileNotFoundError:
        pass  # another process moved them at the same time: done once all the same
    except OSError as exc:
        log.warning("saved sessions in %s were copied to the store but the directory cannot "
                    "be renamed (%s); remove it by hand", root, exc)
        return imported
    log.info("moved %d saved session(s) from %s into the store; the old copies are in %s "
             "(remove them when you like)", imported, root, done)
    return imported
