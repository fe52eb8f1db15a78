"""File events in the run log (``Sandbox(file_events=...)``): what the agent does to the
workspace shows up as ``CUSTOM sandbox.file`` events before the run's end, with patches in
diff mode, caught up when nobody watched, never with a secret in them."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.runs._file_feed import FILE_DIFF_EVENT, FILE_EVENT, Logged, catch_up
from corral.journal._layout import JournalPaths, read_status
from corral.runs._runner import Runner, RunRequest
from corral.stores._protocols import Store
from corral.sandbox._definition import Sandbox
from corral.sandbox._lifecycle import Lifecycle
from corral.sandbox._secrets import Secrets
from corral.sandbox._sources import LocalDir
from corral.sandbox._workspace import Workspace
from corral.testing import wait_until_async

pytestmark = pytest.mark.anyio

SECRET = "filesecret-6c1f0e9a77d2"

# Every kind of change, the last one right before the agent exits.
AGENT = ("echo a > a.txt; echo more >> keep.txt; mkdir -p d/e; echo x > d/e/f; "
         "rm gone.txt; mkdir -p node_modules/p; echo y > node_modules/p/i; "
         "echo last > last.txt")
WANT = [("create", "a.txt"), ("change", "keep.txt"), ("create", "d/e/f"),
        ("delete", "gone.txt"), ("create", "last.txt")]


def _workspace(tmp_path: Path, *, git: bool = False) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "keep.txt").write_text("keep\n")
    (ws / "gone.txt").write_text("old\n")
    if git:
        for args in (["init", "-q"], ["add", "."],
                     ["-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "base"]):
            subprocess.run(["git", *args], cwd=ws, check=True)
    return ws


def _request(ws: Path, provider: str, file_events: bool | str, command: str,
             **kw: Any) -> RunRequest:
    sandbox = Sandbox(provider=provider, lifecycle=Lifecycle(reuse="none"),
                      workspace=Workspace(source=LocalDir(str(ws)), **kw),
                      file_events=file_events)  # type: ignore[arg-type]
    return RunRequest(command=["sh", "-c", command], sandbox=sandbox)


def _file_events(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["value"]["type"], e["value"]["path"]) for e in events
            if e["type"] == "CUSTOM" and e["name"] == FILE_EVENT]


async def _events(store: Store, run_id: str) -> list[dict[str, Any]]:
    return [dict(e.event) for e in await store.snapshot(run_id)]


def _exited(paths: JournalPaths) -> bool:
    status = read_status(paths.status)
    return status is not None and status.state == "exited"


@pytest.mark.parametrize("provider", ["local", "bubblewrap"])
async def test_changes_are_logged_before_the_end(store: Store, tmp_path: Path, provider: str,
                                                 request: pytest.FixtureRequest) -> None:
    if provider == "bubblewrap":
        request.getfixturevalue("need_bwrap_runs")
    runner = Runner(store, journals_dir=tmp_path / "journals")
    rec = await runner.start(_request(_workspace(tmp_path), provider, True, AGENT))
    result = await runner.drive(rec.run_id)
    assert result.record.status.value == "completed"
    events = await _events(store, rec.run_id)
    assert events[-1]["type"] == "RUN_FINISHED"
    seen = _file_events(events)
    for want in WANT:
        assert want in seen, (want, seen)
    assert not any(p.startswith("node_modules") for _, p in seen)  # ignored, never walked
    assert len(seen) == len(set(seen)), seen  # nothing twice
    assert not any(e["name"] == FILE_DIFF_EVENT for e in events if e["type"] == "CUSTOM")


@pytest.mark.parametrize("git", [True, False], ids=["git-workspace", "plain-workspace"])
async def test_diff_mode_gives_patches_against_the_start(store: Store, tmp_path: Path,
                                                         git: bool) -> None:
    """A git workspace is diffed against ``git stash create`` of its start; any other
    against a tree corral wrote at the start into a git directory of its own, on the host
    next to the journal (nothing is added to the workspace)."""
    runner = Runner(store, journals_dir=tmp_path / "journals")
    rec = await runner.start(_request(_workspace(tmp_path, git=git), "local", "diff", AGENT))
    paths = JournalPaths.for_run(tmp_path / "journals", rec.run_id)
    assert paths.baseline_git.is_dir() is not git
    await runner.drive(rec.run_id)
    events = await _events(store, rec.run_id)
    patches: dict[str, str] = {}
    for e in events:  # the last patch of each path is its state at the end
        if e["type"] == "CUSTOM" and e["name"] == FILE_DIFF_EVENT:
            patches[e["value"]["path"]] = e["value"]["diff"]
    assert " keep\n+more\n" in patches["keep.txt"]
    assert "new file mode" in patches["a.txt"] and "+a\n" in patches["a.txt"]
    assert "+last\n" in patches["last.txt"]
    assert patches["gone.txt"] == ""
    last_file = max(i for i, e in enumerate(events) if e["type"] == "CUSTOM")
    assert last_file < len(events) - 1 and events[-1]["type"] == "RUN_FINISHED"


async def test_unwatched_changes_are_caught_up_by_the_next_driver(store: Store,
                                                                  tmp_path: Path) -> None:
    """Nobody drives while the agent works; the driver that comes later logs what it
    missed, once, from the start manifest and the log."""
    runner = Runner(store, journals_dir=tmp_path / "journals")
    rec = await runner.start(_request(_workspace(tmp_path), "local", True, AGENT))
    paths = JournalPaths.for_run(tmp_path / "journals", rec.run_id)
    # the agent is done before anyone drives
    await wait_until_async(lambda: _exited(paths), "the agent to exit", timeout=30)
    assert _file_events(await _events(store, rec.run_id)) == []  # nobody watched
    await runner.drive(rec.run_id)
    seen = _file_events(await _events(store, rec.run_id))
    assert sorted(seen) == sorted(WANT), seen


async def test_no_secret_in_file_events(store: Store, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    runner = Runner(store, journals_dir=tmp_path / "journals")
    rec = await runner.start(_request(
        ws, "local", "diff", 'echo "$TOKEN" > "leak-$TOKEN.txt"',
        secrets=Secrets(TOKEN=SECRET)))
    await runner.drive(rec.run_id)
    events = await _events(store, rec.run_id)
    text = json.dumps(events)
    assert SECRET not in text
    assert any(e["name"] == FILE_DIFF_EVENT for e in events if e["type"] == "CUSTOM")


def test_file_events_is_validated() -> None:
    from corral._errors import ConfigError

    with pytest.raises(ConfigError, match="file_events"):
        Sandbox(provider="local", file_events="yes")  # type: ignore[arg-type]
    assert Sandbox.from_dict({"file_events": "diff"}).file_events == "diff"
    assert Sandbox(provider="local", file_events=True).to_dict()["file_events"] is True
    assert "file_events" not in Sandbox(provider="local").to_dict()


# ------------------------------------------------------------------ catch-up property

_ops = st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d/e"]),
                          st.sampled_from(["write", "delete"]), st.integers(0, 9)),
                max_size=12)


@settings(max_examples=300)
@given(baseline_files=st.sets(st.sampled_from(["a", "b", "c", "d/e"])), ops=_ops,
       logged_upto=st.integers(0, 12))
def test_catch_up_brings_the_log_to_the_workspace(baseline_files: set[str],
                                                  ops: list[tuple[str, str, int]],
                                                  logged_upto: int) -> None:
    """Replaying a prefix of the changes into the log, then the catch-up: every path's
    existence is right afterwards, a path changed after its last logged word gets an event,
    and an untouched path none."""
    t = 1.0
    state = {p: (int(t * 1e9), 1) for p in baseline_files}
    baseline = dict(state)
    logged: dict[str, Logged] = {}
    touched_late: set[str] = set()
    for i, (path, op, size) in enumerate(ops):
        t += 1.0
        if op == "write":
            existed = path in state
            state[path] = (int(t * 1e9), size)
        elif path in state:
            existed = True
            del state[path]
        else:
            continue
        if i < logged_upto:
            logged[path] = Logged(op == "write", t + 0.5)  # seen a little after
        else:
            touched_late.add(path)
        del existed
    events = catch_up(baseline, logged, state)
    believed = {p for p in baseline if p not in logged} | {p for p, s in logged.items() if s.exists}
    for kind, path in events:
        if kind == "create":
            assert path not in believed
            believed.add(path)
        elif kind == "delete":
            assert path in believed
            believed.discard(path)
        else:
            assert path in believed and path in state
    assert believed == set(state)
    evented = {p for _, p in events}
    assert len(evented) == len(events)  # one event a path at most
    for path in set(state) & touched_late:
        assert path in evented, (path, events)
    for path in evented:
        assert path in touched_late


async def test_a_watch_that_cannot_start_does_not_stop_the_run(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Out of inotify instances (128 per user by default): the run goes on without file
    events from this driver."""
    import corral.runs._file_feed as ff

    def no_watch(*a: Any, **kw: Any) -> Any:
        raise OSError(24, "inotify_init1 failed")

    monkeypatch.setattr(ff, "WorkspaceWatcher", no_watch)
    runner = Runner(store, journals_dir=tmp_path / "journals")
    rec = await runner.start(_request(_workspace(tmp_path), "local", True, AGENT))
    result = await runner.drive(rec.run_id)
    assert result.record.status.value == "completed"
    assert _file_events(await _events(store, rec.run_id)) == []


async def test_a_patch_never_reads_outside_the_workspace(store: Store, tmp_path: Path) -> None:
    """The agent writes files in a directory and swaps the directory for a symlink to a
    host directory while corral computes their patches: no patch carries host bytes."""
    host_dir = tmp_path / "host-only"
    host_dir.mkdir()
    for i in range(40):
        (host_dir / f"f{i}").write_text("HOST-ONLY-BYTES\n")
    agent = ("mkdir d; for i in $(seq 0 39); do echo mine > d/f$i; done; "
             f"sleep 0.05; mv d gone; ln -s {host_dir} d")
    runner = Runner(store, journals_dir=tmp_path / "journals")
    rec = await runner.start(_request(_workspace(tmp_path), "local", "diff", agent))
    await runner.drive(rec.run_id)
    assert "HOST-ONLY-BYTES" not in json.dumps(await _events(store, rec.run_id))


@pytest.mark.parametrize("drive_late", [False, True], ids=["watched", "caught-up"])
async def test_hostile_file_names(store: Store, tmp_path: Path, drive_late: bool) -> None:
    """Names are bytes the agent picks: not UTF-8, or with a newline. They are logged (the
    exact bytes in ``pathBytes``), once, and never take the driver down."""
    agent = "touch \"$(printf 'bad\\377name')\" \"$(printf 'two\\nlines')\" plain"
    runner = Runner(store, journals_dir=tmp_path / "journals")
    rec = await runner.start(_request(_workspace(tmp_path), "local", "diff", agent))
    if drive_late:
        paths = JournalPaths.for_run(tmp_path / "journals", rec.run_id)
        await wait_until_async(lambda: _exited(paths), "the agent to exit", timeout=30)
    result = await runner.drive(rec.run_id)
    assert result.record.status.value == "completed"
    values = [e["value"] for e in await _events(store, rec.run_id)
              if e["type"] == "CUSTOM" and e["name"] == FILE_EVENT]
    names = sorted(base64.b64decode(v["pathBytes"]) if "pathBytes" in v else v["path"].encode()
                   for v in values)
    assert names == sorted([b"bad\xffname", b"two\nlines", b"plain"]), values
    assert [v["path"] for v in values if "pathBytes" in v] == ["bad\\xffname"]


def test_watch_events_the_catch_up_already_logged_are_dropped(tmp_path: Path) -> None:
    """Between the watch starting and the catch-up walk ending, a change can be both queued
    by the watch and found by the walk: logged once."""
    from corral.runs._file_feed import FileFeed

    async def noop(events: Any) -> None:
        pass

    walked = 2_000_000_000_000_000_000
    for name, mtime in (("seen", walked - 10), ("later", walked + 10)):
        (tmp_path / name).write_text(name)
        os.utime(tmp_path / name, ns=(mtime, mtime))
    feed = FileFeed(None, str(tmp_path), emit=noop, diff=False,  # type: ignore[arg-type]
                    baseline=None, manifest=None)
    feed._caught = {"seen": (True, walked), "later": (True, walked), "gone": (False, walked),
                    "removed": (True, walked)}
    got = feed._fresh([("create", "seen"), ("change", "seen"), ("create", "later"),
                       ("delete", "gone"), ("delete", "removed"), ("delete", "removed"),
                       ("create", "other")])
    assert got == [("change", "later"), ("delete", "removed"), ("create", "other")]


async def test_the_reaper_logs_the_changes_of_a_run_it_finalizes(store: Store,
                                                                 tmp_path: Path) -> None:
    """A detached run whose agent finished is finalized by the reaper, which never watched:
    the changes are still in the log, before the end."""
    runner = Runner(store, journals_dir=tmp_path / "journals")
    rec = await runner.start(_request(_workspace(tmp_path), "local", True, AGENT))
    await runner.detach(rec.run_id)
    paths = JournalPaths.for_run(tmp_path / "journals", rec.run_id)
    await wait_until_async(lambda: _exited(paths), "the agent to exit", timeout=30)
    result, _ = await runner.reap(ttl=3600)
    assert [e.outcome for e in result.runs] == ["finalized"]
    events = await _events(store, rec.run_id)
    assert sorted(_file_events(events)) == sorted(WANT)
    assert events[-1]["type"] == "RUN_FINISHED"


async def test_patches_are_bounded(store: Store, tmp_path: Path) -> None:
    """A huge file gets no patch, and a burst of files (an install) gets patches for the
    first MAX_PATCHES only: the events still name every file, and the run's end is not held
    up computing thousands of diffs."""
    from corral.runs._file_feed import MAX_PATCHES

    n = MAX_PATCHES + 50
    agent = (f"head -c 3000000 /dev/zero | tr '\\0' a > big.txt; mkdir many; "
             f"for i in $(seq 1 {n}); do echo $i > many/f$i; done")
    runner = Runner(store, journals_dir=tmp_path / "journals")
    rec = await runner.start(_request(_workspace(tmp_path), "local", "diff", agent))
    paths = JournalPaths.for_run(tmp_path / "journals", rec.run_id)
    # all of it caught up at once by the driver below
    await wait_until_async(lambda: _exited(paths), "the agent to exit", timeout=60)
    await runner.drive(rec.run_id)
    events = await _events(store, rec.run_id)
    assert len([p for _, p in _file_events(events) if p.startswith("many/")]) == n
    diffs = {e["value"]["path"]: e["value"] for e in events
             if e["type"] == "CUSTOM" and e["name"] == FILE_DIFF_EVENT}
    assert diffs["big.txt"]["diff"] == "" and "3000000 bytes" in diffs["big.txt"]["omitted"]
    many = [v for p, v in diffs.items() if p.startswith("many/")]
    assert len(many) == n
    assert len([v for v in many if v.get("omitted") == "too many changes at once"]) >= n - MAX_PATCHES
    patched = [v for v in many if "omitted" not in v]
    assert MAX_PATCHES - 2 <= len(patched) <= MAX_PATCHES  # big.txt may take a slot
    assert all("+" in v["diff"] for v in patched)
