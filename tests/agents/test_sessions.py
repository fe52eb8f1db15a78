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


def _redact_in_place(top: Path, table: dict[str, str]) -> list[dict[str, Any]]:
    """Run the in-sandbox SQLite redaction as the sandbox does (its own Python, -I -S,
    the request on stdin)."""
    import json
    import subprocess
    import sys

    from corral._insandbox import sqlite_redact

    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", Path(sqlite_redact.__file__).read_text()],
        input=json.dumps({"dirs": [str(top)], "table": table}).encode(),
        capture_output=True, timeout=60, check=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_a_secret_in_a_sqlite_session_is_redacted_through_sql(tmp_path: Path) -> None:
    """Values split across pages, in a WAL not yet checkpointed, in text and blob columns:
    none survives in any file, everything around them does, and the file stays sound."""
    import sqlite3

    secret = "tok-" + "7f3a" * 8
    top = tmp_path / "share"
    top.mkdir()
    db = top / "opencode.db"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")  # the values stay in the WAL
    conn.execute("CREATE TABLE part (id INTEGER PRIMARY KEY, data TEXT, raw BLOB)")
    rows = []
    for i in range(40):  # overflow pages: some of the values straddle a page boundary
        pad = "x" * (4096 * (i % 3) + 37 * i)
        rows.append((i, f"{pad}{secret} after-{i}", f"b{secret}{i}".encode()))
    conn.executemany("INSERT INTO part VALUES (?, ?, ?)", rows)
    conn.commit()
    conn.close()  # the last close checkpoints: what follows stays in the WAL
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("UPDATE part SET data = data || ? WHERE id = 3", (secret,))
    conn.commit()
    # a full-text index over the text (external content: an UPDATE of the text does not
    # reach it), holding the secret's tokens
    conn.execute("CREATE VIRTUAL TABLE notes USING fts5(data, content='part', "
                 "content_rowid='id')")
    conn.execute("INSERT INTO notes(notes) VALUES ('rebuild')")
    conn.commit()
    (top / "not-a-db").write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
    report = _redact_in_place(top, {secret: "TOKEN"})
    conn.close()
    assert {r["path"]: "ok" in r for r in report} == {str(db): True, str(top / "not-a-db"): False}
    for path in top.iterdir():
        assert secret.encode() not in path.read_bytes(), path
    check = sqlite3.connect(db)
    assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    got = check.execute("SELECT id, data, raw FROM part ORDER BY id").fetchall()
    assert len(got) == 40
    for i, data, raw in got:
        assert data.endswith(f"[REDACTED:TOKEN] after-{i}" + ("[REDACTED:TOKEN]" if i == 3
                                                                else ""))
        assert raw == f"b[REDACTED:TOKEN]{i}".encode()
    token = secret.split("-")[1]  # how the index splits the value
    assert check.execute("SELECT count(*) FROM notes WHERE notes MATCH ?",
                         (f'"{token}"',)).fetchone() == (0,)
    assert check.execute("SELECT count(*) FROM notes WHERE notes MATCH 'REDACTED'"
                         ).fetchone() == (40,)
    for path in top.iterdir():
        assert token.encode() not in path.read_bytes(), path
