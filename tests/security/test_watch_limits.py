"""File events cannot take the host's inotify watches.

Attack: the agent makes directories by the hundred thousand in /workspace. corral's file
events added one inotify watch per directory, each charged to the host user running corral
(root) against ``fs.inotify.max_user_watches``: every root process on the host got ENOSPC
from inotify while the run lived, and corral logged one warning per directory.

Defence: a watcher holds at most ``max_watches`` watches (and the process at most a share
of the host's limit); past that it stops adding watches, warns once, and the changes in
the directories it does not watch are logged by a walk of the workspace before the run's
end: late, never lost. The watches are counted by the kernel's own account of the
process's inotify descriptors (``/proc/self/fdinfo``), not by corral's bookkeeping.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from corral.providers._bubblewrap import BubblewrapProvider
from corral.runs._file_feed import FILE_EVENT, FileFeed, scan_manifest
from corral.runs._runner import Runner, RunRequest
from corral.stores._protocols import Store
from corral.sandbox._definition import Sandbox
from corral.sandbox._lifecycle import Lifecycle
from corral.sandbox._sources import LocalDir
from corral.sandbox._workspace import Workspace

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("need_bwrap_runs")]

CAP = 16
DIRS = 300  # well past the cap: each with a subdirectory and a file in it
MAKE_TREES = (f"for i in $(seq 1 {DIRS}); do mkdir -p d$i/e && echo x > d$i/e/f; done")
WANT = {f"d{i}/e/f" for i in range(1, DIRS + 1)}


def inotify_watches() -> int:
    """Watches held by this process's inotify descriptors, as the kernel counts them."""
    total = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != "anon_inode:inotify":
                continue
            lines = Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines()
        except OSError:
            continue  # closed meanwhile (listdir's own descriptor, for one)
        total += sum(line.startswith("inotify wd:") for line in lines)
    return total


def created(events: Sequence[dict[str, Any]]) -> list[str]:
    return [e["value"]["path"] for e in events
            if e["type"] == "CUSTOM" and e["name"] == FILE_EVENT and e["value"]["type"] == "create"]


def watch_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "corral.sandbox._watch" and r.levelno >= logging.WARNING]


async def test_directories_past_the_cap_take_no_watch_and_lose_no_change(
        corral_home: Path, caplog: pytest.LogCaptureFixture) -> None:
    provider = BubblewrapProvider()
    handle = await provider.create()
    logged: list[dict[str, Any]] = []

    async def emit(events: Sequence[dict[str, Any]]) -> None:
        logged.extend(events)

    async def log_now() -> list[dict[str, Any]]:
        return list(logged)

    before = inotify_watches()
    root = handle.host_path(handle.workdir)
    feed = FileFeed(handle, root, emit=emit, diff=False, baseline=None,
                    manifest=scan_manifest(root), max_watches=CAP, logged=log_now)
    try:
        with caplog.at_level(logging.WARNING, logger="corral.sandbox._watch"):
            await feed.start([])
            made = await handle.process.exec(["sh", "-c", MAKE_TREES], cwd=handle.workdir)
            assert made.ok, made.stderr
            await feed.flush()  # what the driver does before the run's terminal event
            assert inotify_watches() - before == CAP
    finally:
        feed.close()
        await provider.destroy(handle.ref)
    assert inotify_watches() == before  # all given back
    paths = created(logged)
    assert sorted(paths) == sorted(WANT)  # every file, each once, watched or walked
    assert len(watch_warnings(caplog)) == 1, watch_warnings(caplog)


async def test_a_run_whose_agent_makes_many_directories_logs_every_file_before_its_end(
        store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    runner = Runner(store, journals_dir=tmp_path / "journals", max_file_watches=CAP)
    sandbox = Sandbox(provider="bubblewrap", lifecycle=Lifecycle(reuse="none"),
                      workspace=Workspace(source=LocalDir(str(ws))), file_events=True)
    with caplog.at_level(logging.WARNING, logger="corral.sandbox._watch"):
        rec = await runner.start(RunRequest(command=["sh", "-c", MAKE_TREES], sandbox=sandbox))
        result = await runner.drive(rec.run_id)
    assert result.record.status.value == "completed"
    events = [dict(e.event) for e in await store.snapshot(rec.run_id)]
    assert events[-1]["type"] == "RUN_FINISHED"
    assert sorted(created(events)) == sorted(WANT)
    assert len(watch_warnings(caplog)) == 1, watch_warnings(caplog)


def test_the_cap_is_checked(corral_home: Path, tmp_path: Path) -> None:
    from corral._errors import ConfigError
    from corral.sandbox._watch import WorkspaceWatcher

    for bad in (0, -1, True, "8"):
        with pytest.raises(ConfigError, match="max_watches must be a positive integer"):
            WorkspaceWatcher(tmp_path, max_watches=bad)  # type: ignore[arg-type]


async def test_the_default_cap_holds_against_an_agent(
        corral_home: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Without any setting: the agent makes more directories than the default cap in one
    go; the watcher holds the cap (or this process's share of the host's limit, if that
    is smaller) and warns once."""
    from corral.sandbox._watch import WorkspaceWatcher

    # the promise, written out: 8192 directories, never more than an eighth of the host's
    limit = int(Path("/proc/sys/fs/inotify/max_user_watches").read_text())
    cap = min(8192, limit // 8)
    provider = BubblewrapProvider()
    handle = await provider.create()
    before = inotify_watches()
    watcher = WorkspaceWatcher(handle.host_path(handle.workdir))
    try:
        with caplog.at_level(logging.WARNING, logger="corral.sandbox._watch"):
            made = await handle.process.exec(
                ["sh", "-c", f"seq -f 'd%.0f' 1 {cap + 500} | xargs mkdir"], cwd=handle.workdir)
            assert made.ok, made.stderr
            watcher.read_now()  # every mkdir is queued by now: the watcher acts on each
            assert inotify_watches() - before == cap
            assert watcher.missed
    finally:
        watcher.close()
        await provider.destroy(handle.ref)
    assert len(watch_warnings(caplog)) == 1, watch_warnings(caplog)
