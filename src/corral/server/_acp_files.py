"""``corral acp``: the files a prompt's run changed, brought into the editor's directory.

A session's runs work on a copy of the editor's directory in the thread's sandbox, so their
edits would never reach the editor. At the end of each prompt turn, :class:`FileRelay`
takes the run's file events (``CUSTOM sandbox.file``: the paths it created, changed or
deleted, last event per path), reads each file from the sandbox (through the provider's
confined file API), and writes it into the editor's directory: through the editor
(``fs/write_text_file``) when the client advertises ``fs.writeTextFile`` and the file is
UTF-8 text, else directly. Deletions are applied directly (ACP has no delete).

What comes from the sandbox is hostile:

- a path must be relative, normalized, without ``..``, and outside the directories corral
  never copies or watches (``.git``, ``node_modules``, ``.corral``, ...): nothing is written
  into the editor's ``.git`` (its hooks would run on the host);
- the editor's tree is walked one component at a time with ``O_NOFOLLOW`` from a
  descriptor of its root: a symlink anywhere on the way (an intermediate directory or the
  file itself) refuses the path, so nothing is written outside the editor's root or through
  a link; a file is written to a temporary name in its directory and renamed over the old
  one (keeping its mode), so a reader never sees half of it;
- symlinks, directories and special files in the sandbox are not relayed, nor files over
  :data:`MAX_RELAY` bytes.

Files the editor changed meanwhile are not overwritten: the session keeps, per path, the
editor file's ``(mtime_ns, size)`` as it was when the editor and the sandbox last agreed
(the directory's state when the session's first prompt copied it, then each file this
relay wrote), under ``$CORRAL_HOME/acp/<session>.json`` so a reopened session
(``session/load`` in another ``corral acp``) keeps it. A path whose editor file differs from
that (and from what the agent wrote) is left alone and named to the user, whose edit wins;
the agent's version stays in the thread's sandbox.
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import stat as st
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

__all__ = [
    "MAX_RELAY",
    "Change",
    "EditorTree",
    "Refused",
    "SyncState",
    "changed_files",
    "safe_relative",
]

MAX_RELAY: Final = 16 << 20
"""Bytes of one file brought into the editor at most; larger ones are named, not written."""
NEVER: Final = frozenset({".git", "node_modules", ".corral", "__pycache__", ".venv"})
"""Directories never written into (corral neither copies nor watches them)."""
MAX_PATH: Final = 4096

Kind = Literal["create", "change", "delete"]
Stat = tuple[int, int]


class Refused(Exception):
    """A path the relay will not write (the message says why, for the user)."""


@dataclass(frozen=True, slots=True)
class Change:
    """The last file event of one path in a run's log."""

    kind: Kind
    path: str


def safe_relative(path: object) -> str:
    """``path`` as a safe relative path in the editor's directory, else :class:`Refused`."""
    if not isinstance(path, str) or not path or "\x00" in path or len(path) > MAX_PATH:
        raise Refused("not a valid path")
    if path.startswith("/workspace/"):
        path = path[len("/workspace/"):]
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise Refused("not a plain relative path")
    if any(p in NEVER for p in parts):
        raise Refused("inside a directory corral never writes into")
    if posixpath.normpath(path) != path:
        raise Refused("not a normalized path")
    return path


def changed_files(events: Iterable[Mapping[str, Any]]) -> tuple[list[Change], list[str]]:
    """The last ``sandbox.file`` event of each path, in log order of that event; and the
    paths that cannot be relayed (not UTF-8: named by the event's path as shown)."""
    last: dict[str, Kind] = {}
    odd: list[str] = []
    for event in events:
        if event.get("type") != "CUSTOM" or event.get("name") != "sandbox.file":
            continue
        value = event.get("value")
        if not isinstance(value, Mapping) or not isinstance(value.get("path"), str):
            continue
        if value.get("pathBytes") is not None:
            odd.append(str(value["path"])[:200])
            continue
        kind = value.get("type")
        if kind not in ("create", "change", "delete"):
            continue
        path = str(value["path"])
        last.pop(path, None)  # (re-inserted last: the order of the last events)
        last[path] = kind
    return [Change(kind, path) for path, kind in last.items()], odd


@dataclass
class SyncState:
    """Per path, the editor file's ``(mtime_ns, size)`` when the editor and the sandbox
    last agreed on it (absent: the file did not exist then)."""

    files: dict[str, Stat] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> SyncState | None:
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        files = raw.get("files") if isinstance(raw, dict) else None
        if not isinstance(files, dict):
            return None
        return cls({str(k): (int(v[0]), int(v[1])) for k, v in files.items()
                    if isinstance(v, list) and len(v) == 2
                    and all(isinstance(x, int) for x in v)})

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".sync-")
        with os.fdopen(fd, "w") as fh:
            json.dump({"files": {k: list(v) for k, v in self.files.items()}}, fh)
        os.replace(tmp, path)


class EditorTree:
    """Confined writes into the editor's directory ``root`` (see the module docstring)."""

    def __init__(self, root: str) -> None:
        self.root = root

    def _parent(self, rel: str, *, create: bool) -> tuple[int, str]:
        """A descriptor of ``rel``'s directory (walked without following any symlink,
        missing directories made when ``create``) and its last component."""
        parts = rel.split("/")
        cur = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for i, part in enumerate(parts[:-1]):
                try:
                    nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                                  | os.O_CLOEXEC, dir_fd=cur)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(part, 0o777, dir_fd=cur)  # the umask applies, as for the editor
                    nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                                  | os.O_CLOEXEC, dir_fd=cur)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise Refused(f"{'/'.join(parts[:i + 1])} is not a directory in "
                                      "your files (a symlink is never followed)") from None
                    raise
                os.close(cur)
                cur = nxt
            return cur, parts[-1]
        except BaseException:
            os.close(cur)
            raise

    def state(self, rel: str) -> Stat | None:
        """The regular file's ``(mtime_ns, size)``, ``None`` when it is absent; anything
        else there (a symlink, a directory) is :class:`Refused`."""
        try:
            fd, name = self._parent(rel, create=False)
        except FileNotFoundError:
            return None
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        finally:
            os.close(fd)
        if not st.S_ISREG(info.st_mode):
            raise Refused(f"{rel} is not a regular file in your files (a symlink is never "
                          "followed)")
        return info.st_mtime_ns, info.st_size

    def make_parent(self, rel: str) -> None:
        """Make ``rel``'s missing directories (none through a symlink)."""
        fd, _name = self._parent(rel, create=True)
        os.close(fd)

    def read(self, rel: str, limit: int = MAX_RELAY) -> bytes | None:
        """The regular file's bytes (``None``: absent, not a regular file, or larger than
        ``limit``)."""
        try:
            fd, name = self._parent(rel, create=False)
        except (FileNotFoundError, Refused):
            return None
        try:
            try:
                ffd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                              dir_fd=fd)
            except OSError:
                return None
        finally:
            os.close(fd)
        with os.fdopen(ffd, "rb") as fh:
            if not st.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return None
            data = fh.read(limit + 1)
        return data if len(data) <= limit else None

    def write(self, rel: str, data: bytes, mode: int | None = None) -> Stat:
        """Create or replace the regular file ``rel`` with ``data`` (a temporary file
        renamed over it; an existing file keeps its mode, else ``mode`` or 0644). Refuses
        when what is there is not a regular file. Returns the new ``(mtime_ns, size)``."""
        fd, name = self._parent(rel, create=True)
        try:
            try:
                old = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                old = None
            if old is not None and not st.S_ISREG(old.st_mode):
                raise Refused(f"{rel} is not a regular file in your files")
            perms = st.S_IMODE(old.st_mode) if old is not None else (mode or 0o644) & 0o777
            tmp = f".{name[:200]}.corral-{os.urandom(6).hex()}"
            tfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                          | os.O_CLOEXEC, 0o600, dir_fd=fd)
            try:
                with os.fdopen(tfd, "wb") as fh:
                    fh.write(data)
                    os.fchmod(fh.fileno(), perms)
                os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=fd)
                except OSError:
                    pass
                raise
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            return info.st_mtime_ns, info.st_size
        finally:
            os.close(fd)

    def delete(self, rel: str) -> None:
        """Remove the regular file ``rel`` (absent: nothing to do; anything else refused)."""
        try:
            fd, name = self._parent(rel, create=False)
        except FileNotFoundError:
            return
        try:
            try:
                old = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return
            if not st.S_ISREG(old.st_mode):
                raise Refused(f"{rel} is not a regular file in your files")
            os.unlink(name, dir_fd=fd)
        finally:
            os.close(fd)
