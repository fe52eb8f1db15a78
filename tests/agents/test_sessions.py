"""Saving and restoring CLI session files per thread (hostile sandbox contents)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.agents._sessions import (
    SessionSaveError,
    load_session,
    restore_session,
    save_session,
    thread_dir,
)
from corral.providers._local import LocalProvider


@pytest.fixture
def local(corral_home: Path) -> LocalProvider:
    return LocalProvider()


def test_save_then_restore_into_a_fresh_sandbox(local: LocalProvider, tmp_path: Path) -> None:
    async def go() -> Any:
        a = await local.create()
        await a.fs.write("/home/agent/.claude/projects/-workspace/s1.jsonl", b"turn 1\n")
        await a.fs.write("/home/agent/.claude/projects/-workspace/memory/m.md", b"mem")
        await a.fs.write("/home/agent/.claude/other.json", b"not saved")
        # a symlink planted by the agent pointing at a host file is not followed
        link = Path(a.host_path("/home/agent/.claude/projects/leak"))
        os.symlink("/etc/hostname", link)
        saved = await save_session(a, "claude-code", (".claude/projects",), "thread/1", "s1")
        await local.destroy(a.ref)
        b = await local.create()
        await b.fs.write("/home/agent/.claude/projects/-workspace/memory/m.md", b"newer")
        restored = await restore_session(b, "thread/1", "claude-code")
        files = {
            p: await b.fs.read(p) for p in (
                "/home/agent/.claude/projects/-workspace/s1.jsonl",
                "/home/agent/.claude/projects/-workspace/memory/m.md")
        }
        return saved, restored, files, await b.fs.exists(
            "/home/agent/.claude/other.json"), await b.fs.exists(
            "/home/agent/.claude/projects/leak")

    saved, restored, files, other, leak = anyio.run(go)
    assert saved.files == 2 and saved.bytes == len(b"turn 1\n") + 3
    assert restored == saved == load_session("thread/1", "claude-code")
    assert files["/home/agent/.claude/projects/-workspace/s1.jsonl"] == b"turn 1\n"
    assert files["/home/agent/.claude/projects/-workspace/memory/m.md"] == b"newer"  # kept
    assert not other and not leak
    assert load_session("thread/1", "codex") is None


def test_too_large_sessions_are_refused_not_truncated(local: LocalProvider) -> None:
    async def go() -> None:
        a = await local.create()
        await a.fs.write("/home/agent/.codex/sessions/big.jsonl", b"x" * 5000)
        with pytest.raises(SessionSaveError, match="too large"):
            await save_session(a, "codex", (".codex/sessions",), "t2", "sid",
                               max_bytes=1000)
        await local.destroy(a.ref)

    anyio.run(go)
    assert load_session("t2", "codex") is None


def test_thread_dir_names(corral_home: Path) -> None:
    assert thread_dir("t-1.ok").name == "t-1.ok"
    odd = thread_dir("../../etc")
    assert odd.parent == corral_home / "sessions" and odd.name.startswith("h-")
    assert thread_dir("a/b") != thread_dir("a_b")
