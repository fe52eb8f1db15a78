"""File events in a run's event log: ``CUSTOM sandbox.file`` (and ``sandbox.file.diff``).

A run whose sandbox definition sets ``file_events`` (``True``, or ``"diff"`` for patches
too) gets, in its log, one ``CUSTOM`` event ``sandbox.file`` with ``{type: create | change |
delete, path, timestamp}`` per change the agent makes to the workspace, and with ``"diff"``
a ``sandbox.file.diff`` ``{path, diff}`` after it (a unified patch against the workspace as
it was when the run started; empty for deletes and git-ignored files).

They are observations of the workspace, not lines of the journal, so the driving process
makes them: an inotify watch on the workspace (host-directory providers) while it holds
the claim, appended under its epoch at the last logged journal offset (a successor resumes
the journal after that offset, so file events are never repeated by a takeover). What no
driver saw -- the moments between the start and the first drive, or while a run was
detached or its driver dead -- is caught up when the next driver begins: the run's
*manifest* (``path -> (mtime_ns, size)`` of every file when the run started, kept next to
its journal on the host) plus the file events already logged say what the log believes;
a walk of the workspace says what is; the difference is logged as events first. Several
changes to one file while nobody watched become one event. Before the run's terminal
event the driver drains every pending change, so the log is complete when it closes.

The watch is bounded (:data:`~corral.sandbox._watch.DEFAULT_MAX_WATCHES` directories: each
costs the host user one of its inotify watches). When the agent makes more directories
than that, or the kernel's event queue overflows, the watch misses changes; the driver
then walks the workspace once more before the terminal event, so those changes are
logged late (as catch-up events), never lost.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.to_thread

from corral.journal._layout import JournalPaths
from corral.sandbox._contracts import Handle, HostPaths, UnsupportedCapability
from corral.sandbox._redact import Redactor, get_logger
from corral.sandbox._watch import (
    DEFAULT_IGNORE,
    DEFAULT_MAX_WATCHES,
    GitBaseline,
    WatchKind,
    WorkspaceWatcher,
    resolves_inside,
)

__all__ = [
    "FILE_DIFF_EVENT",
    "FILE_EVENT",
    "FileFeed",
    "Manifest",
    "catch_up",
    "file_baseline",
    "logged_file_state",
    "scan_manifest",
]

log = get_logger("corral.runs._file_feed")

FILE_EVENT = "sandbox.file"
FILE_DIFF_EVENT = "sandbox.file.diff"

MAX_PATCHES = 200
"""Patches made per batch of changes; the rest get ``omitted`` (their events still come)."""
MAX_PATCH_SOURCE = 1 << 20
"""Files larger than this (bytes) get no patch."""
MAX_PATCH = 256 * 1024
"""Patches are cut at this many characters."""

Kind = Literal["create", "change", "delete"]
Manifest = dict[str, tuple[int, int]]
"""Relative path -> (mtime in ns, size) of every regular file or symlink."""


def scan_manifest(root: str | os.PathLike[str], ignore: Iterable[str] = DEFAULT_IGNORE
                  ) -> Manifest:
    """Every file under ``root`` (ignored directories pruned, symlinks not followed)."""
    skip = frozenset(ignore)
    out: Manifest = {}
    base = Path(root)
    real_root = os.path.realpath(base)
    for dirpath, dirnames, filenames in os.walk(base):
        if not resolves_inside(real_root, dirpath):
            dirnames[:] = []  # swapped for a symlink out of the workspace meanwhile
            continue
        dirnames[:] = [d for d in dirnames if d not in skip]
        rel = os.path.relpath(dirpath, base)
        for name in filenames:
            path = name if rel == "." else f"{rel}/{name}"
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue  # gone meanwhile
            out[path] = (st.st_mtime_ns, st.st_size)
    return out


def save_manifest(path: Path, manifest: Manifest) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({p: list(v) for p, v in manifest.items()}))
    os.replace(tmp, path)


def load_manifest(path: Path) -> Manifest | None:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict):
        return None
    return {str(p): (int(v[0]), int(v[1])) for p, v in raw.items()
            if isinstance(v, list) and len(v) == 2}


@dataclass(frozen=True, slots=True)
class Logged:
    """What the log last said of one path."""

    exists: bool
    at: float


def logged_file_state(events: Iterable[Mapping[str, Any]]) -> dict[str, Logged]:
    """The last ``sandbox.file`` event of each path in a run's log."""
    out: dict[str, Logged] = {}
    for e in events:
        if e.get("type") != "CUSTOM" or e.get("name") != FILE_EVENT:
            continue
        value = e.get("value")
        if not isinstance(value, Mapping) or not isinstance(value.get("path"), str):
            continue
        path = value["path"]
        if isinstance(value.get("pathBytes"), str):  # not UTF-8: back to the walk's form
            try:
                path = base64.b64decode(value["pathBytes"]).decode("utf-8", "surrogateescape")
            except ValueError:
                continue
        ts = value.get("timestamp")
        out[path] = Logged(value.get("type") != "delete",
                           float(ts) if isinstance(ts, (int, float)) else 0.0)
    return out


def catch_up(baseline: Manifest, logged: Mapping[str, Logged], now: Manifest
             ) -> list[tuple[Kind, str]]:
    """The events that bring the log's view (``baseline`` plus ``logged``) to ``now``.

    A file the log thinks absent but present is a create; present in both but modified
    after the log's last word on it (or, never mentioned, differing from the baseline) a
    change; believed present but gone a delete."""
    out: list[tuple[Kind, str]] = []
    for path in sorted(set(baseline) | set(logged) | set(now)):
        said = logged.get(path)
        believed = said.exists if said is not None else path in baseline
        if path not in now:
            if believed:
                out.append(("delete", path))
            continue
        if not believed:
            out.append(("create", path))
        elif said is not None:
            if now[path][0] > said.at * 1e9:
                out.append(("change", path))
        elif now[path] != baseline[path]:
            out.append(("change", path))
    return out


Emit = Callable[[Sequence[dict[str, Any]]], Awaitable[None]]
LoggedNow = Callable[[], Awaitable[Iterable[Mapping[str, Any]]]]


def _text(s: str) -> str:
    """``s`` as valid UTF-8 text (a patch names its file: bytes of a non-UTF-8 name become
    ``\\xNN``)."""
    return s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _path_fields(path: str) -> dict[str, str]:
    """A path as event fields. File names are bytes, and the agent picks them: one that is
    not UTF-8 is shown with ``\\xNN`` escapes in ``path``, its exact bytes base64 in
    ``pathBytes``."""
    raw = path.encode("utf-8", "surrogateescape")
    try:
        return {"path": raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {"path": raw.decode("utf-8", "backslashreplace"),
                "pathBytes": base64.b64encode(raw).decode()}


_GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}


class HostTreeBaseline(GitBaseline):
    """The baseline of a workspace that is no git repository: a tree written at the run's
    start into a git directory of the host's own (next to the journal, out of the
    sandbox's reach), diffed against the workspace's host directory. The workspace's
    files are data here: no configuration of theirs is read, no filter or hook runs."""

    def __init__(self, handle: Handle, git_dir: str, root: str, tree: str) -> None:
        super().__init__(handle, tree)
        self._git_dir = git_dir
        self._root = root

    @classmethod
    async def create(cls, handle: Handle, git_dir: Path, root: str) -> HostTreeBaseline | None:
        """Snapshot ``root`` (``.gitignore`` honoured) into ``git_dir``; ``None`` if git
        cannot."""
        init = await anyio.run_process(["git", f"--git-dir={git_dir}", "init", "-q"],
                                       env={**os.environ, **_GIT_ENV}, check=False)
        if init.returncode != 0:
            log.warning("no baseline for diffs: git init failed: %s", init.stderr[-300:])
            return None
        await _host_git(str(git_dir), root, "add", "-A", "--ignore-errors")
        code, tree = await _host_git(str(git_dir), root, "write-tree")
        if code != 0:
            log.warning("no baseline for diffs: git write-tree failed")
            return None
        return cls(handle, str(git_dir), root, tree.decode().strip())

    async def _git(self, *args: str) -> tuple[int, bytes]:
        return await _host_git(self._git_dir, self._root, *args)

    # Reading a new file for its add patch stays with the handle's confined filesystem
    # (a directory swapped for a symlink must not make corral read a host file).


async def _host_git(git_dir: str, root: str, *args: str) -> tuple[int, bytes]:
    res = await anyio.run_process(
        ["git", "-c", "safe.directory=*", "-c", "core.hooksPath=/dev/null",
         f"--git-dir={git_dir}", f"--work-tree={root}", *args],
        cwd=root, env={**os.environ, **_GIT_ENV}, check=False)
    return res.returncode, res.stdout


class FileFeed:
    """The file events of one run while this process drives it (see the module doc).

    ``emit`` appends events to the run's log (the driver's epoch); ``redactor`` masks
    secrets in paths and diffs; ``diff`` adds ``sandbox.file.diff`` events.
    ``max_watches`` bounds the directories watched; ``logged`` gives the run's log as it
    is now, for the walk :meth:`flush` makes when the watch missed changes (without it,
    the next driver's catch-up logs them)."""

    def __init__(self, handle: Handle, root: str, *, emit: Emit, diff: bool,
                 baseline: str | None, manifest: Manifest | None,
                 redactor: Redactor | None = None, tree: tuple[str, str] | None = None,
                 max_watches: int = DEFAULT_MAX_WATCHES, logged: LoggedNow | None = None
                 ) -> None:
        self._handle = handle
        self._root = root
        self._emit = emit
        self._max_watches = max_watches
        self._logged = logged
        self._diff: GitBaseline | None = None
        if diff:
            self._diff = (HostTreeBaseline(handle, tree[0], root, tree[1]) if tree is not None
                          else GitBaseline(handle, baseline))
        self._manifest = manifest
        self._redactor = redactor
        self._lock = anyio.Lock()
        self._watcher: WorkspaceWatcher | None = None
        # paths the catch-up reported: (present per the log, when the walk ended)
        self._caught: dict[str, tuple[bool, int]] = {}

    async def start(self, logged: Iterable[Mapping[str, Any]]) -> None:
        """Watch, then log what happened while nobody watched (watch first, so nothing
        falls between the walk and the watch; a change made just then may be logged by
        both: :meth:`_fresh` drops the watch's copy)."""
        self._watcher = WorkspaceWatcher(self._root, fresh_writes=self._diff is not None,
                                         max_watches=self._max_watches)
        await self.catch_up(logged)

    async def catch_up(self, logged: Iterable[Mapping[str, Any]]) -> None:
        """Log what the log lacks (``logged``: its events so far) against the start
        manifest; without a watch, this is all a driver that never follows the run does
        (the reaper, once the agent has exited)."""
        if self._manifest is None:
            return
        now = await anyio.to_thread.run_sync(scan_manifest, self._root)
        walked_at = time.time_ns()  # every file the walk saw is older than this
        missed = catch_up(self._manifest, logged_file_state(logged), now)
        if missed:
            # The watch may have queued some of these too (made between watch and walk);
            # kept from an earlier walk too, for the events queued since then.
            self._caught.update({path: (kind != "delete", walked_at) for kind, path in missed})
            try:
                async with self._lock:
                    await self._log(missed)
            except Exception as exc:  # noqa: BLE001 - file events never stop a run
                log.warning("file events: the catch-up could not be logged: %s", exc)

    async def run(self) -> None:
        """Log events as the watcher sees them, until cancelled. A failure stops the feed
        (logged), never the run: the next driver's catch-up covers what it missed."""
        assert self._watcher is not None, "start() first"
        fd = self._watcher.fileno()
        try:
            while True:
                await anyio.wait_readable(fd)
                await self._drain()
        except Exception as exc:  # noqa: BLE001 - see the docstring
            log.warning("file events stopped: %s", exc)
            self.close()

    async def flush(self) -> None:
        """Log every change already made (the agent has exited): called before the run's
        terminal event. When the watch missed changes (directories past its cap, a queue
        overflow), a walk against the log finds them."""
        if self._watcher is None:
            return
        try:
            await self._drain()
            if self._watcher is not None and self._watcher.missed and self._logged is not None:
                await self.catch_up(await self._logged())
        except Exception as exc:  # noqa: BLE001 - the run's end matters more
            log.warning("file events: the last changes could not be logged: %s", exc)

    async def _drain(self) -> None:
        """Log what the watch has queued."""
        async with self._lock:
            if self._watcher is not None:
                items = self._fresh(self._watcher.read_now())
                if items:
                    await self._log(items)

    def _fresh(self, items: list[tuple[WatchKind, str]]) -> list[tuple[WatchKind, str]]:
        """Drop what the catch-up logged already. For a path it reported: an event about
        a change the walk saw (the file is no newer than the walk) goes, a delete of a
        file the log already has as gone goes; a later create of a file the log has as
        present is a change."""
        if not self._caught:
            return items
        out: list[tuple[WatchKind, str]] = []
        for kind, path in items:
            caught = self._caught.get(path)
            if caught is None:
                out.append((kind, path))
                continue
            exists, walked_at = caught
            if kind == "delete":
                if exists:
                    out.append((kind, path))
                    self._caught[path] = (False, walked_at)
                continue
            try:
                mtime = os.lstat(os.path.join(self._root, path)).st_mtime_ns
            except OSError:
                mtime = walked_at + 1  # gone again: its delete follows
            if mtime <= walked_at:
                continue
            out.append(("change" if exists and kind == "create" else kind, path))
            self._caught[path] = (True, walked_at)
        return out

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None

    async def _log(self, items: Sequence[tuple[WatchKind, str]]) -> None:
        now = time.time()
        events: list[dict[str, Any]] = [
            {"type": "CUSTOM", "name": FILE_EVENT,
             "value": {"type": kind, **_path_fields(path), "timestamp": now}}
            for kind, path in items if kind != "written"]
        if self._diff is not None:
            # One patch per path, taken now: a file created and written in this batch gets
            # its content; one whose first write lands later gets a second patch then.
            last: dict[str, WatchKind] = {}
            for kind, path in items:
                last[path] = kind
            for n, (path, kind) in enumerate(last.items()):
                value: dict[str, Any] = _path_fields(path)
                if kind == "delete":
                    value["diff"] = ""
                elif n >= MAX_PATCHES:
                    # thousands of files at once (an install, a build): the events say
                    # what changed; patches for all would hold the run's end for minutes
                    value.update(diff="", omitted="too many changes at once")
                else:
                    value.update(await self._patch(path))
                events.append({"type": "CUSTOM", "name": FILE_DIFF_EVENT, "value": value})
        if not events:
            return
        if self._redactor is not None:
            events = [self._redactor.redact_obj(e) for e in events]
        await self._emit(events)

    async def _patch(self, path: str) -> dict[str, Any]:
        """``{"diff": ...}`` for ``path``, with ``omitted`` saying why when there is none:
        patches are bounded (a file of any size may be written)."""
        assert self._diff is not None
        try:
            size = os.lstat(os.path.join(self._root, path)).st_size
        except OSError:
            size = 0
        if size > MAX_PATCH_SOURCE:
            return {"diff": "", "omitted": f"file of {size} bytes, over {MAX_PATCH_SOURCE}"}
        try:
            patch = _text(await self._diff.diff(path))
        except Exception as exc:  # noqa: BLE001 - a diff is extra; the event stands
            log.warning("no diff for %s: %s", path, exc)
            return {"diff": "", "omitted": "the patch could not be made"}
        if len(patch) > MAX_PATCH:
            return {"diff": patch[:MAX_PATCH], "omitted": f"patch cut at {MAX_PATCH} characters"}
        return {"diff": patch}


async def file_baseline(handle: Handle, paths: JournalPaths, *, diff: bool) -> dict[str, Any]:
    """Record the workspace as the agent finds it (before it starts): a manifest next to
    the journal (for the catch-up of unwatched changes) and, for diffs, a git baseline
    commit. What the run's start records as its spec's ``files``."""
    if not isinstance(handle, HostPaths):
        raise UnsupportedCapability(handle.ref.provider, "file events",
                                    "file_events needs a host-directory provider")
    root = handle.host_path(handle.workdir)
    manifest = await anyio.to_thread.run_sync(scan_manifest, root)
    await anyio.to_thread.run_sync(save_manifest, paths.files, manifest)
    base = (await GitBaseline.capture(handle)).base if diff else None
    out: dict[str, Any] = {"diff": diff, "baseline": base}
    if diff and base is None:
        # no git repository in the workspace: a baseline tree of the host's own
        tree = await HostTreeBaseline.create(handle, paths.baseline_git, root)
        if tree is not None:
            out["tree"] = [str(paths.baseline_git), tree.base]
    return out
