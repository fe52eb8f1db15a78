"""Saving and restoring CLI session files per thread through the store (hostile sandbox
contents), and the one-time move of what older versions kept under
``$CORRAL_HOME/sessions``."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.agents import _sessions
from corral.agents._sessions import (
    SessionSaveError,
    load_session,
    restore_session,
    save_session,
)
from corral.providers._local import LocalProvider
from corral.stores import MemoryStore, SessionLimits, open_store
from corral.stores._protocols import StoredSession


@pytest.fixture
def local(corral_home: Path) -> LocalProvider:
    return LocalProvider()


@pytest.fixture(autouse=True)
def _fresh_import_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    # which (home, store) pairs this process imported is process state: each test starts
    # with none
    monkeypatch.setattr(_sessions, "_imported", set())


def test_save_then_restore_into_a_fresh_sandbox(local: LocalProvider, corral_home: Path
                                                ) -> None:
    async def go() -> Any:
        store = await open_store()
        a = await local.create()
        await a.fs.write("/home/agent/.claude/projects/-workspace/s1.jsonl", b"turn 1\n")
        await a.fs.write("/home/agent/.claude/projects/-workspace/memory/m.md", b"mem")
        await a.fs.write("/home/agent/.claude/other.json", b"not saved")
        # a symlink planted by the agent pointing at a host file is not followed
        link = Path(a.host_path("/home/agent/.claude/projects/leak"))
        os.symlink("/etc/hostname", link)
        saved = await save_session(a, "claude-code", (".claude/projects",), "thread/1", "s1",
                                   store=store, run_id="r1")
        await local.destroy(a.ref)
        b = await local.create()
        await b.fs.write("/home/agent/.claude/projects/-workspace/memory/m.md", b"newer")
        restored = await restore_session(b, "thread/1", "claude-code", store=store)
        files = {
            p: await b.fs.read(p) for p in (
                "/home/agent/.claude/projects/-workspace/s1.jsonl",
                "/home/agent/.claude/projects/-workspace/memory/m.md")
        }
        listed = await load_session(store, "thread/1", "claude-code")
        other_harness = await load_session(store, "thread/1", "codex")
        stored = await store.get_session("thread/1", "claude-code")
        await store.aclose()
        return (saved, restored, files, listed, other_harness, stored,
                await b.fs.exists("/home/agent/.claude/other.json"),
                await b.fs.exists("/home/agent/.claude/projects/leak"))

    saved, restored, files, listed, other_harness, stored, other, leak = anyio.run(go)
    assert saved.files == 2 and saved.size == len(b"turn 1\n") + 3 and saved.run_id == "r1"
    assert restored == saved == listed
    assert sorted(stored.files) == [".claude/projects/-workspace/memory/m.md",
                                    ".claude/projects/-workspace/s1.jsonl"]
    assert files["/home/agent/.claude/projects/-workspace/s1.jsonl"] == b"turn 1\n"
    assert files["/home/agent/.claude/projects/-workspace/memory/m.md"] == b"newer"  # kept
    assert not other and not leak
    assert other_harness is None
    # nothing of it on the host's disk outside the store
    assert not (corral_home / "sessions").exists()
    # (the sandbox that got it back excepted)
    held = {p.name for p in corral_home.rglob("*") if p.is_file() and b"turn 1" in
            p.read_bytes() and not p.is_relative_to(corral_home / "sandboxes")}
    assert held and held <= {"corral.db", "corral.db-wal"}, held


def test_too_large_sessions_are_refused_not_truncated(local: LocalProvider) -> None:
    async def go() -> Any:
        store = MemoryStore(session_limits=SessionLimits(max_bytes=1000))
        await store.put_session(StoredSession("t2", "codex", "old", {"a": b"1"}, 1.0))
        a = await local.create()
        await a.fs.write("/home/agent/.codex/sessions/big.jsonl", b"x" * 5000)
        with pytest.raises(SessionSaveError, match="too large"):
            await save_session(a, "codex", (".codex/sessions",), "t2", "sid", store=store)
        await local.destroy(a.ref)
        return await store.get_session("t2", "codex")

    kept = anyio.run(go)
    assert kept is not None and kept.session_id == "old" and dict(kept.files) == {"a": b"1"}


def test_a_hostile_stored_path_is_never_written_outside_the_home(
        local: LocalProvider, tmp_path: Path) -> None:
    """A session whose path was changed in the store behind its checks (an attacker with
    write access to the database) is refused on restore, not written at ../.."""

    class Tampered(MemoryStore):
        async def get_session(self, thread_id: str, harness: str) -> Any:
            got = StoredSession(thread_id, harness, "s", {"ok": b"x"}, 1.0)
            object.__setattr__(got, "files", {"../../../escape": b"owned"})
            return got

    async def go() -> None:
        box = await local.create()
        try:
            with pytest.raises(Exception, match="component"):
                await restore_session(box, "t", "claude-code", store=Tampered())
            home = Path(box.host_path("/home/agent"))
            assert not any(p.name == "escape" for p in home.parent.parent.rglob("escape"))
        finally:
            await local.destroy(box.ref)

    anyio.run(go)


# ---------------------------------------------------------------- the one-time move


def _legacy(root: Path, thread: str, harness: str, sid: str, files: dict[str, bytes],
            saved_at: float = 1000.0) -> Path:
    base = root / "sessions" / thread / harness
    for rel, data in files.items():
        (base / "files" / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / "files" / rel).write_bytes(data)
    base.mkdir(parents=True, exist_ok=True)
    (base / "session.json").write_text(json.dumps(
        {"harness": harness, "session_id": sid, "saved_at": saved_at, "files": len(files),
         "bytes": 0}))
    return base


def test_old_home_sessions_move_into_the_store_once(
        local: LocalProvider, corral_home: Path, caplog: pytest.LogCaptureFixture) -> None:
    good = {".claude/projects/-workspace/s1.jsonl": b'{"turn":1}\n',
            ".claude/projects/-workspace/memory/m.md": b"mem"}
    _legacy(corral_home, "t-good", "claude-code", "s1", good)
    _legacy(corral_home, "t-good", "codex", "c1", {".codex/sessions/r.jsonl": b"{}\n"})
    _legacy(corral_home, "t-newer", "claude-code", "old", {".claude/projects/x": b"old"})
    _legacy(corral_home, "h-" + "0" * 32, "claude-code", "lost", {".claude/projects/x": b"?"})
    corrupt = _legacy(corral_home, "t-corrupt", "codex", "c", {".codex/sessions/a": b"a"})
    (corrupt / "session.json").write_text("{not json")
    planted = _legacy(corral_home, "t-link", "claude-code", "l", {".claude/projects/a": b"a"})
    os.symlink("/etc/passwd", planted / "files" / ".claude" / "projects" / "passwd")
    big = _legacy(corral_home, "t-big", "codex", "b", {".codex/sessions/big": b"x" * 3000})
    assert big.is_dir()

    async def go() -> Any:
        store = await open_store()
        store.session_limits = SessionLimits(max_bytes=2000)
        await store.put_session(StoredSession("t-newer", "claude-code", "new",
                                              {".claude/projects/x": b"new"}, 5000.0))
        box = await local.create()
        try:
            restored = await restore_session(box, "t-good", "claude-code", store=store)
            back = await box.fs.read("/home/agent/.claude/projects/-workspace/s1.jsonl")
        finally:
            await local.destroy(box.ref)
        sessions = {(t, h): await store.get_session(t, h) for t, h in [
            ("t-good", "codex"), ("t-newer", "claude-code"), ("t-corrupt", "codex"),
            ("t-link", "claude-code"), ("t-big", "codex"), ("h-" + "0" * 32, "claude-code")]}
        await store.aclose()
        return restored, back, sessions

    with caplog.at_level(logging.WARNING):
        restored, back, sessions = anyio.run(go)
    assert restored is not None and restored.session_id == "s1" and back == b'{"turn":1}\n'
    assert sessions[("t-good", "codex")].session_id == "c1"
    assert sessions[("t-newer", "claude-code")].session_id == "new"  # the store's is kept
    assert sessions[("t-corrupt", "codex")] is None
    assert sessions[("t-big", "codex")] is None
    assert sessions[("h-" + "0" * 32, "claude-code")] is None
    linked = sessions[("t-link", "claude-code")]
    assert linked is not None and dict(linked.files) == {".claude/projects/a": b"a"}
    warned = "\n".join(r.getMessage() for r in caplog.records)
    assert "t-corrupt" in warned and "t-big" in warned and "digest" in warned, warned
    assert not any(r.exc_info for r in caplog.records)  # warnings, never a traceback
    assert not (corral_home / "sessions").exists()
    [moved] = [p for p in corral_home.iterdir() if p.name.startswith("sessions.migrated-")]
    assert (moved / "t-good" / "claude-code" / "session.json").is_file()

    # once: a later process (a fresh memo) finds nothing to move, and a new old-style
    # directory is not re-read because the memo says this process did it
    async def again() -> Any:
        _sessions._imported.clear()
        store = await open_store()
        try:
            await store.delete_sessions("t-good")
            return await load_session(store, "t-good", "claude-code")
        finally:
            await store.aclose()

    assert anyio.run(again) is None


def test_nothing_moves_into_a_memory_store(local: LocalProvider, corral_home: Path) -> None:
    _legacy(corral_home, "t", "claude-code", "s", {".claude/projects/a": b"a"})
    store = MemoryStore()
    assert anyio.run(load_session, store, "t", "claude-code") is None
    assert (corral_home / "sessions" / "t").is_dir()  # kept for a store that lasts
