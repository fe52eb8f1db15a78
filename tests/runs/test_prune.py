"""Journal pruning: what is deleted, what is kept and why; the token decoder's properties."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.journal._layout import JournalPaths, encode_run_id
from corral.journal._prune import decode_run_id
from corral.runs._reap_runner import prune_journals
from corral.stores._records import RunPatch, RunStatus
from corral.journal._sentinel import new_nonce
from corral.stores._protocols import NewRun, Store
from corral.journal._supervisor import (
    AgentSpec,
    kill_supervised,
    launch_supervised,
    supervisor_alive,
)
from corral.testing import wait_until_async

NOW = 1_800_000_000.0


@given(st.text(min_size=1, max_size=40))
def test_decode_inverts_encode(run_id: str) -> None:
    try:
        run_id.encode("utf-8")
    except UnicodeEncodeError:
        return  # lone surrogates: never decodable, so such files are only ever kept
    token = encode_run_id(run_id)
    assert decode_run_id(token) == (run_id if "~" not in token else None)


@given(st.text(alphabet="_0123456789abcdefABCDEF-xyz.~/", max_size=30))
def test_decode_accepts_only_canonical_tokens(token: str) -> None:
    run_id = decode_run_id(token)
    if run_id is not None:
        assert encode_run_id(run_id) == token


@pytest.mark.parametrize("token", ["", "_2F", "_41", "a_2", "a_zz", "a.b", "x~0123", "_ff"])
def test_decode_refuses_non_canonical_and_broken_tokens(token: str) -> None:
    assert decode_run_id(token) is None


def _files(d: Path, run_id: str, age: float = 0.0, *, names: tuple[str, ...] = (
        ".journal", ".err", ".supervisor.log")) -> list[Path]:
    token = encode_run_id(run_id)
    out = []
    for suffix in names:
        p = d / f"{token}{suffix}"
        p.write_bytes(b"x")
        os.utime(p, (NOW - age, NOW - age))
        out.append(p)
    return out


@pytest.mark.anyio
async def test_prune_sorts_runs_into_deleted_and_kept(store: Store, tmp_path: Path) -> None:
    d = tmp_path / "private"
    d.mkdir()
    for run_id, status in [("done", RunStatus.COMPLETED), ("crashed/1", RunStatus.FAILED),
                           ("live", RunStatus.RUNNING), ("paused", RunStatus.INTERRUPTED)]:
        await store.create(NewRun(run_id, "t"))
        if status is not RunStatus.RUNNING:
            await store.update(run_id, RunPatch(status=status))
        _files(d, run_id)
    old_orphan = _files(d, "orphan-old", age=3600.0)  # exactly at the gate: inclusive
    young_orphan = _files(d, "orphan-young", age=3599.0)
    (d / "notes.txt").write_text("not a journal")
    (d / "a~0123456789abcdef.journal").write_bytes(b"truncated token")
    (d / "_zz.err").write_bytes(b"bad escape")

    result = await prune_journals(store, d, now=NOW, orphan_ttl=3600.0)

    assert sorted(result.deleted) == ["crashed/1", "done", "orphan-old"]
    kept = {(k.run_id, k.reason) for k in result.kept}
    assert kept == {("live", "non-terminal"), ("paused", "non-terminal"),
                    ("orphan-young", "orphan-too-recent"), (None, "undecodable-name")}
    assert sum(1 for k in result.kept if k.run_id is None) == 2
    assert result.failures == []
    left = sorted(p.name for p in d.iterdir())
    assert "notes.txt" in left and "a~0123456789abcdef.journal" in left and "_zz.err" in left
    assert not any(p.exists() for p in old_orphan)
    assert all(p.exists() for p in young_orphan)
    assert not any(n.startswith(encode_run_id("done")) for n in left)
    assert sum(n.startswith("live.") for n in left) == 3


@pytest.mark.anyio
async def test_prune_caps_deletes_per_sweep(store: Store, tmp_path: Path) -> None:
    d = tmp_path / "private"
    d.mkdir()
    for i in range(5):
        await store.create(NewRun(f"r{i}", "t"))
        await store.update(f"r{i}", RunPatch(status=RunStatus.COMPLETED))
        _files(d, f"r{i}")
    first = await prune_journals(store, d, now=NOW, max_deletes=2)
    assert first.deleted == ["r0", "r1"]
    assert [k.reason for k in first.kept] == ["max-deletes"] * 3
    second = await prune_journals(store, d, now=NOW, max_deletes=2)
    assert second.deleted == ["r2", "r3"]
    third = await prune_journals(store, d, now=NOW, max_deletes=2)
    assert third.deleted == ["r4"] and list(d.iterdir()) == []


@pytest.mark.anyio
async def test_prune_keeps_a_live_supervisors_files_and_reports_failures(
    store: Store, tmp_path: Path
) -> None:
    d = tmp_path / "private"
    d.mkdir(mode=0o700)
    await store.create(NewRun("running-agent", "t"))
    await store.update("running-agent", RunPatch(status=RunStatus.ABORTED))
    paths = JournalPaths.for_run(d, "running-agent")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    launch_supervised(AgentSpec(["sh", "-c", "sleep 600"], env), paths, new_nonce())
    try:
        result = await prune_journals(store, d, now=time.time())
        assert result.deleted == []
        assert [(k.run_id, k.reason) for k in result.kept] == [
            ("running-agent", "supervisor-alive")]
        assert paths.journal.exists()
    finally:
        kill_supervised(paths, grace=1.0, include_supervisor=True)
    # SIGKILL is delivered asynchronously
    await wait_until_async(lambda: not supervisor_alive(paths), "the supervisor to die")
    after = await prune_journals(store, d, now=time.time())
    assert after.deleted == ["running-agent"], after
    assert not paths.journal.exists()

    missing = await prune_journals(store, tmp_path / "nope", now=NOW)
    assert missing.deleted == [] and missing.failures and "nope" in missing.failures[0]


@pytest.mark.anyio
async def test_prune_store_errors_keep_the_files(tmp_path: Path) -> None:
    class Down:
        async def get(self, run_id: str) -> None:
            raise ConnectionError("store unreachable")

    d = tmp_path / "private"
    d.mkdir()
    files = _files(d, "r1")
    result = await prune_journals(Down(), d, now=NOW)
    assert result.deleted == [] and [k.reason for k in result.kept] == ["store-error"]
    assert "store unreachable" in result.failures[0]
    assert all(p.exists() for p in files)


@pytest.mark.anyio
async def test_prune_removes_an_agent_runs_state_note(store: Store, tmp_path: Path) -> None:
    # a docker agent run's mirror: journal, usage and this host's note of the agent's state
    d = tmp_path / "journals"
    d.mkdir()
    await store.create(NewRun("dock", "t"))
    await store.update("dock", RunPatch(status=RunStatus.COMPLETED))
    made = _files(d, "dock", names=(".journal", ".usage.json", ".agent-state.json"))
    result = await prune_journals(store, d, now=NOW, orphan_ttl=3600.0)
    assert result.deleted == ["dock"]
    assert not any(p.exists() for p in made)
