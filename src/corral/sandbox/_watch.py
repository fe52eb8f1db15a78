"""File events from a sandbox's workspace: create / change / delete, with diffs.

On host-directory providers (local, bubblewrap) the workspace is a host directory, so a
recursive inotify watch (ctypes, no extra dependency; the same mechanism the journal
follower uses) sees every change at once, with no polling and no tree walks. Ignored
directories (``.git``, ``node_modules``, ``.corral`` by default) are pruned: never watched,
never walked.

Each watch is charged to the host user running corral (root, usually) against the host's
``fs.inotify.max_user_watches``, shared with every other process of that user. A watcher
therefore takes at most ``max_watches`` (default :data:`DEFAULT_MAX_WATCHES`), and all the
watchers of this process together at most 1/:data:`HOST_SHARE` of the host's limit: an
agent that makes 200,000 directories must not leave the host's root without watches.
Directories past the cap go unwatched and :attr:`WorkspaceWatcher.missed` becomes true;
their changes are found by a walk of the workspace (the file feed's catch-up), later.

:func:`watch_workspace` runs the watcher for the duration of a ``async with`` block and
hands each event to the definition's hooks. :class:`GitBaseline` gives each event a
``diff()`` against the workspace state when watching began (``git stash create``, else
``HEAD``); a file absent at the baseline gets a synthesized add patch, a git-ignored file
an empty diff.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
import threading
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

import anyio

from corral._errors import ConfigError
from corral.sandbox._contracts import Handle, HostPaths, UnsupportedCapability
from corral.sandbox._hooks import FileEvent, FileEventKind, Hooks
from corral.sandbox._redact import get_logger

__all__ = ["DEFAULT_IGNORE", "DEFAULT_MAX_WATCHES", "HOST_SHARE", "GitBaseline", "WatchKind",
           "WorkspaceWatcher", "check_max_watches", "host_watch_limit", "resolves_inside", "watch_workspace"]

log = get_logger("corral.sandbox._watch")

DEFAULT_IGNORE = (".git", "node_modules", ".corral", "__pycache__", ".venv")

IN_MODIFY = 0x002
IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_IGNORED = 0x8000
IN_ISDIR = 0x40000000
IN_Q_OVERFLOW = 0x4000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_MASK = IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF
_HEADER = struct.Struct("iIII")
_ENOSPC = 28

DEFAULT_MAX_WATCHES = 8192
"""Directories one watcher watches at most (one inotify watch each)."""
HOST_SHARE = 8
"""The watchers of one process together take at most 1/HOST_SHARE of the host's
``fs.inotify.max_user_watches``: the rest stays for every other process of the same user."""
_MAX_USER_WATCHES = Path("/proc/sys/fs/inotify/max_user_watches")


def check_max_watches(value: object) -> int:
    """``value`` as a watch cap: a positive integer, else :class:`ConfigError`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"max_watches must be a positive integer, not {value!r}")
    return value


def host_watch_limit() -> int | None:
    """The host's ``fs.inotify.max_user_watches`` (``None`` if it cannot be read)."""
    try:
        return int(_MAX_USER_WATCHES.read_text())
    except (OSError, ValueError):
        return None


class _ProcessWatches:
    """The inotify watches every watcher of this process holds, against one budget (a
    ``corral serve`` drives many runs: per-watcher caps alone would add up)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # watchers may live on several threads' event loops
        self.held = 0
        self._budget: int | None = None
        self._read = False

    def budget(self) -> int | None:
        if not self._read:
            limit = host_watch_limit()
            self._budget = max(1, limit // HOST_SHARE) if limit is not None else None
            self._read = True
        return self._budget


_PROCESS = _ProcessWatches()


WatchKind = Literal["create", "change", "delete", "written"]
"""A file event kind, or ``written``: a created file's first write closed (reported only
with ``fresh_writes=True``; its ``create`` came before its content)."""


class WorkspaceWatcher:
    """A recursive inotify watch on a host directory, yielding ``(kind, relpath)``.

    At most ``max_watches`` directories are watched (and never more than this process's
    share of the host's limit, see the module docstring); past that, :attr:`missed` says
    that changes went unseen and a walk must catch them up.
    """

    def __init__(self, root: str | Path, ignore: Iterable[str] = DEFAULT_IGNORE, *,
                 fresh_writes: bool = False, max_watches: int = DEFAULT_MAX_WATCHES) -> None:
        self.max_watches = check_max_watches(max_watches)
        self.root = Path(root)
        self.fresh_writes = fresh_writes
        self.missed = False
        """Some change may have gone unseen: a directory past the watch cap, or the
        kernel's event queue overflowed. A walk of the workspace finds what it was."""
        self.ignore = frozenset(ignore)
        libc_name = ctypes.util.find_library("c")
        self._libc = ctypes.CDLL(libc_name or None, use_errno=True)
        if not hasattr(self._libc, "inotify_init1"):
            raise UnsupportedCapability("host", "file events", "inotify is not available here")
        fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self._fd: int = fd
        self._real_root = os.path.realpath(self.root)
        self._dirs: dict[int, str] = {}  # watch descriptor -> relative dir ("" = root)
        self._known: set[str] = set()
        self._fresh: set[str] = set()  # created, first close-write is part of the create
        self._listed: set[str] = set()  # reported from a listing; its IN_CREATE may follow
        self._watched: set[str] = {""}  # directories watched (relative)
        self._add_tree("", initial=True)

    def close(self) -> None:
        """Stop watching (closing the descriptor drops every watch at once)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            with _PROCESS.lock:
                _PROCESS.held -= len(self._dirs)
            self._dirs.clear()

    @property
    def watch_count(self) -> int:
        """Directories watched now (inotify watches held)."""
        return len(self._dirs)

    def _full(self) -> bool:
        """No watch may be added: this watcher's cap, or this process's share of the
        host's limit, is reached."""
        budget = _PROCESS.budget()
        return len(self._dirs) >= self.max_watches or (
            budget is not None and _PROCESS.held >= budget)

    def _unwatched(self) -> None:
        """A directory goes unwatched: what happens in it is found by the catch-up walk
        instead. One warning per watcher (an agent can make directories by the
        hundred thousand)."""
        if not self.missed:
            log.warning(
                "file events: %d directories watched, the most allowed (max_watches=%d, "
                "this process's share of fs.inotify.max_user_watches: %s); changes in "
                "further directories are reported when the workspace is next scanned",
                len(self._dirs), self.max_watches, _PROCESS.budget() or "unknown")
        self.missed = True

    def _watch(self, dirpath: Path) -> int | None:
        """Add a watch on ``dirpath``; its descriptor, or ``None`` when it cannot (gone,
        or over a cap)."""
        with _PROCESS.lock:
            if not self._full():
                wd = int(self._libc.inotify_add_watch(
                    self._fd, os.fsencode(dirpath), _MASK | IN_ONLYDIR | IN_DONT_FOLLOW
                ))
                if wd >= 0:
                    if wd not in self._dirs:  # a moved directory keeps its watch
                        _PROCESS.held += 1
                    return wd
                if ctypes.get_errno() != _ENOSPC:
                    return None  # gone meanwhile, or not a directory any more
                # ENOSPC: the host's own limit, with other processes holding the rest
        self._unwatched()
        return None

    def _add_tree(self, rel_dir: str, *, initial: bool) -> list[str]:
        """Watch ``rel_dir`` and everything under it; return files found (for creates).

        Each directory is watched *before* it is listed: a file or directory created in
        between then shows up in the listing, as an inotify event, or both (deduplicated
        through ``_listed``), never in neither.
        """
        found: list[str] = []
        stack = [rel_dir]
        while stack:
            rel = stack.pop()
            if self._full():
                # cheap refusal before any system call: past the cap, an agent's
                # directories cost a set lookup each, not a walk
                self._watched.discard(rel)
                self._unwatched()
                continue
            dirpath = self.root / rel if rel else self.root
            if rel and not resolves_inside(self._real_root, dirpath):
                self._watched.discard(rel)
                continue  # swapped for a symlink out of the workspace meanwhile
            wd = self._watch(dirpath)
            if wd is None:
                # not watched: forget it, so that memory stays bounded by the cap too
                self._watched.discard(rel)
                continue
            self._dirs[wd] = rel
            try:
                entries = list(os.scandir(dirpath))
            except OSError:
                continue  # gone again: its IN_DELETE_SELF/IN_IGNORED follow
            for entry in entries:
                path = f"{rel}/{entry.name}" if rel else entry.name
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    continue
                if is_dir:
                    if entry.name not in self.ignore and path not in self._watched:
                        self._watched.add(path)
                        stack.append(path)
                    continue
                if path in self._known:
                    continue
                self._known.add(path)
                if not initial:
                    self._listed.add(path)
                    found.append(path)
        return found

    def fileno(self) -> int:
        """The inotify descriptor (readable when events are pending)."""
        return self._fd

    def read_now(self) -> list[tuple[WatchKind, str]]:
        """Every event already queued, without waiting."""
        out: list[tuple[WatchKind, str]] = []
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return out
            out += self._parse(data)

    async def events(self) -> AsyncIterator[tuple[FileEventKind, str]]:
        """Yield events until cancelled (``written`` ones are not file events)."""
        while True:
            await anyio.wait_readable(self._fd)
            for kind, path in self.read_now():
                if kind != "written":
                    yield kind, path

    def _parse(self, data: bytes) -> list[tuple[WatchKind, str]]:
        out: list[tuple[WatchKind, str]] = []
        i = 0
        while i + _HEADER.size <= len(data):
            wd, mask, _cookie, length = _HEADER.unpack_from(data, i)
            raw = data[i + _HEADER.size : i + _HEADER.size + length]
            i += _HEADER.size + length
            name = raw.rstrip(b"\0").decode("utf-8", "surrogateescape")
            if mask & IN_Q_OVERFLOW:
                if not self.missed:
                    log.warning("inotify queue overflowed; the lost file events are "
                                "reported when the workspace is next scanned")
                self.missed = True
                continue
            if mask & IN_IGNORED:
                if self._dirs.pop(wd, None) is not None:
                    with _PROCESS.lock:
                        _PROCESS.held -= 1
                continue
            base = self._dirs.get(wd)
            if base is None or not name:
                continue
            path = f"{base}/{name}" if base else name
            if mask & IN_ISDIR:
                if name in self.ignore:
                    continue
                if mask & (IN_CREATE | IN_MOVED_TO):
                    if path in self._watched:
                        continue  # already found by its parent's listing
                    self._watched.add(path)
                    # files may land before the watch does: report what is there
                    for f in self._add_tree(path, initial=False):
                        out.append(("create", f))
                elif mask & (IN_DELETE | IN_MOVED_FROM):
                    if path not in self._watched:
                        continue  # never watched (past the cap): nothing known below it
                    prefix = path + "/"
                    self._watched = {w for w in self._watched if w != path and not w.startswith(prefix)}
                    self._listed = {k for k in self._listed if not k.startswith(prefix)}
                    gone = [k for k in self._known if k.startswith(prefix)]
                    for k in sorted(gone):
                        self._known.discard(k)
                        out.append(("delete", k))
                continue
            if mask & (IN_CREATE | IN_MOVED_TO) and path in self._listed:
                # already reported as a create by a listing
                self._listed.discard(path)
                if mask & IN_CREATE:
                    self._fresh.add(path)
                continue
            if mask & IN_CREATE:
                self._fresh.add(path)
                kind: WatchKind = "change" if path in self._known else "create"
                self._known.add(path)
                out.append((kind, path))
            elif mask & IN_MOVED_TO:
                kind = "change" if path in self._known else "create"
                self._known.add(path)
                out.append((kind, path))
            elif mask & IN_CLOSE_WRITE:
                if path in self._fresh:
                    self._fresh.discard(path)
                    if self.fresh_writes:
                        out.append(("written", path))
                    continue
                self._known.add(path)
                out.append(("change", path))
            elif mask & (IN_DELETE | IN_MOVED_FROM):
                self._known.discard(path)
                self._fresh.discard(path)
                self._listed.discard(path)
                out.append(("delete", path))
        return out


def resolves_inside(real_root: str, path: str | Path) -> bool:
    """``path`` resolves inside ``real_root`` (the workspace's contents are hostile: a
    directory may be swapped for a symlink to a host directory at any moment)."""
    real = os.path.realpath(path)
    return real == real_root or real.startswith(real_root + os.sep)


class GitBaseline:
    """Diffs of workspace files against the state when the run began."""

    def __init__(self, handle: Handle, base: str | None) -> None:
        self._h = handle
        self.base = base

    @classmethod
    async def capture(cls, handle: Handle) -> GitBaseline:
        """``git stash create`` (working tree incl. uncommitted edits), else ``HEAD``;
        no baseline outside a git repository."""
        run = handle.process.exec
        stash = await run(["git", "stash", "create"], cwd=handle.workdir, timeout=60)
        sha = stash.stdout.decode().strip() if stash.ok else ""
        if not sha:
            head = await run(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=handle.workdir, timeout=60)
            sha = head.stdout.decode().strip() if head.ok else ""
        return cls(handle, sha or None)

    async def _git(self, *args: str) -> tuple[int, bytes]:
        """Run git on the workspace (inside the sandbox); ``(exit code, stdout)``."""
        res = await self._h.process.exec(["git", *args], cwd=self._h.workdir, timeout=60)
        return res.exit_code, res.stdout

    async def diff(self, path: str) -> str:
        if self.base:
            ignored, _ = await self._git("check-ignore", "-q", "--", path)
            if ignored == 0:
                return ""  # git-ignored: events fire, diffs are withheld
            code, out = await self._git("diff", "--no-color", self.base, "--", path)
            if code == 0 and out:
                return out.decode("utf-8", "replace")
            known, _ = await self._git("cat-file", "-e", f"{self.base}:{path}")
            if known == 0:
                return ""  # unchanged against the baseline (or deleted and handled above)
        if not await self._h.fs.exists(path):
            return ""
        return _add_patch(path, await self._h.fs.read(path))


def _add_patch(path: str, data: bytes) -> str:
    if b"\0" in data[:8000]:
        return f"diff --git a/{path} b/{path}\nnew file mode 100644\nBinary files /dev/null and b/{path} differ\n"
    text = data.decode("utf-8", "replace")
    head = f"diff --git a/{path} b/{path}\nnew file mode 100644\n"
    if not text:
        return head
    lines = text.split("\n")
    missing_newline = not text.endswith("\n")
    if not missing_newline:
        lines = lines[:-1]
    body = "".join(f"+{line}\n" for line in lines)
    if missing_newline:
        body += "\\ No newline at end of file\n"
    return f"{head}--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n{body}"


@asynccontextmanager
async def watch_workspace(
    handle: Handle, hooks: Hooks, *, ignore: Iterable[str] = DEFAULT_IGNORE
) -> AsyncIterator[WorkspaceWatcher | None]:
    """Dispatch the workspace's file events to ``hooks`` while the block runs.

    Yields ``None`` (and does nothing) when no file hook is set. Needs a provider whose
    workspace is a host directory (``host_path``); others raise UnsupportedCapability.
    """
    if not hooks.wants_files:
        yield None
        return
    if not isinstance(handle, HostPaths):
        raise UnsupportedCapability(
            handle.ref.provider, "file events", "file hooks need a host-directory provider"
        )
    baseline = await GitBaseline.capture(handle)
    watcher = WorkspaceWatcher(handle.host_path(handle.workdir), ignore)

    async def pump() -> None:
        async for kind, path in watcher.events():
            event = FileEvent(kind, path, time.time(), baseline.diff)
            await hooks.file_event(event)

    failure: BaseException | None = None  # re-raised bare, not in an ExceptionGroup
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(pump)
            try:
                yield watcher
            except BaseException as exc:
                failure = exc
            finally:
                tg.cancel_scope.cancel()
    finally:
        watcher.close()
    if failure is not None:
        raise failure
