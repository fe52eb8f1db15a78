"""ensure(): bootstrap from git, setup shell, failures, reuse, snapshots, markers, gc."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral import GitSource, Lifecycle, Policy, RunContext, Sandbox, Workspace, parallel
from corral.providers._bubblewrap import BubblewrapProvider
from corral.providers._local import LocalProvider
from corral.stores._protocols import Store
from corral.sandbox._contracts import ResourceLimits
from corral.sandbox._gitsrc import GitError
from corral.sandbox._setup_shell import SetupError

from .conftest import Repo

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("bwrap_ok")]


def ctx(run: str = "r1", thread: str = "t1") -> RunContext:
    return RunContext(thread_id=thread, run_id=run)


async def text(sb_handle: object, path: str) -> str:
    return (await sb_handle.fs.read(path)).decode()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("ref", "commit", "expected"),
    [
        ("main", None, ("main_sha", "three")),
        ("feature", None, ("feature_sha", "feature")),
        ("v1", None, ("tag_sha", "two")),
        (None, "first_sha", ("first_sha", "one")),
        ("sha:first_sha", None, ("first_sha", "one")),
    ],
)
async def test_git_source_at_branch_tag_and_sha(
    git_repo: Repo, store: Store, ref: str | None, commit: str | None, expected: tuple[str, str]
) -> None:
    if ref and ref.startswith("sha:"):
        ref = getattr(git_repo, ref[4:])
    pinned = getattr(git_repo, commit) if commit else None
    sb = Sandbox(
        provider="bubblewrap",
        workspace=Workspace(
            source=GitSource(git_repo.url, ref=ref, commit=pinned),
            instructions="Be careful.",
            scripts={"test": "pytest -q"},
        ),
    )
    ensured = await sb.ensure(ctx(), store=store)
    h = ensured.handle
    try:
        assert ensured.origin == "created"
        want_sha, want_text = getattr(git_repo, expected[0]), expected[1]
        assert await text(h, "version.txt") == want_text + "\n"
        head = await h.process.exec(["git", "rev-parse", "HEAD"], cwd="/workspace")
        assert head.stdout.decode().strip() == want_sha
        agents = await text(h, "AGENTS.md")
        assert "Be careful." in agents and "`test`: `pytest -q`" in agents
        for link in ("CLAUDE.md", "GEMINI.md"):
            assert (await h.fs.stat(link)).type == "symlink"
            assert await text(h, link) == agents
        status = await h.process.exec(["git", "status", "--porcelain"], cwd="/workspace")
        assert ".corral" not in status.stdout.decode()  # the marker stays out of git
    finally:
        await sb.destroy(ctx(), store=store)


async def test_git_failure_raises_with_stderr_and_leaves_nothing(git_repo: Repo, store: Store) -> None:
    sb = Sandbox(provider="bubblewrap", workspace=Workspace(source=GitSource(git_repo.url, ref="nope")))
    provider = sb.get_provider()
    before = await provider.list()
    with pytest.raises(GitError) as err:
        await sb.ensure(ctx(), store=store)
    assert "nope" in str(err.value) and "not found" in str(err.value)
    assert await provider.list() == before
    assert await store.get_instance(sb.key(ctx())) is None


async def test_setup_keeps_cd_and_export_and_runs_groups_at_once(store: Store) -> None:
    # each parallel step waits (with a deadline) for the other's file: serial would fail
    wait_for = "for i in $(seq 200); do [ -e /workspace/{f} ] && exit 0; sleep 0.05; done; exit 9"
    sb = Sandbox(
        provider="bubblewrap",
        workspace=Workspace(
            setup=[
                "mkdir -p sub/dir && cd sub",
                "export GREETING='hello world' COUNT=3",
                "cd dir && pwd > /workspace/where.txt",
                'echo "$GREETING/$COUNT" > /workspace/env.txt',
                parallel(
                    "touch /workspace/a; " + wait_for.format(f="b"),
                    "touch /workspace/b; " + wait_for.format(f="a"),
                ),
                "pwd > /workspace/after-group.txt",
            ]
        ),
    )
    ensured = await sb.ensure(ctx(), store=store)
    try:
        h = ensured.handle
        assert await text(h, "where.txt") == "/workspace/sub/dir\n"
        assert await text(h, "env.txt") == "hello world/3\n"
        assert await text(h, "after-group.txt") == "/workspace/sub/dir\n"
    finally:
        await sb.destroy(ctx(), store=store)


async def test_failing_step_raises_tail_and_destroys_the_sandbox(store: Store) -> None:
    sb = Sandbox(
        provider="bubblewrap",
        workspace=Workspace(setup=["echo first", "echo some-output-here; echo oops >&2; exit 3", "touch never"]),
    )
    provider = sb.get_provider()
    before = await provider.list()
    with pytest.raises(SetupError) as err:
        await sb.ensure(ctx(), store=store)
    msg = str(err.value)
    assert "exit 3" in msg and "exit code 3" in msg
    assert "some-output-here" in msg and "oops" in msg
    assert await provider.list() == before
    assert await store.get_instance(sb.key(ctx())) is None


async def test_failing_parallel_step_names_it(store: Store) -> None:
    sb = Sandbox(provider="local", workspace=Workspace(setup=[parallel("true", "echo bad; exit 4")]))
    with pytest.raises(SetupError, match="exit 4"):
        await sb.ensure(ctx(), store=store)
    assert await store.get_instance(sb.key(ctx())) is None


async def test_reuse_thread_shares_and_reuse_run_does_not(store: Store) -> None:
    shared = Sandbox(provider="bubblewrap", lifecycle=Lifecycle(reuse="thread"))
    first = await shared.ensure(ctx("r1"), store=store)
    await first.handle.fs.write("note.txt", b"from run 1")
    second = await shared.ensure(ctx("r2"), store=store)
    try:
        assert second.origin == "resumed"
        assert second.handle.id == first.handle.id
        assert await text(second.handle, "note.txt") == "from run 1"
        other_thread = await shared.ensure(ctx("r3", thread="t2"), store=store)
        assert other_thread.handle.id != first.handle.id
        await shared.destroy(ctx("r3", thread="t2"), store=store)
    finally:
        await shared.destroy(ctx("r2"), store=store)

    per_run = Sandbox(provider="bubblewrap", lifecycle=Lifecycle(reuse="run"))
    a = await per_run.ensure(ctx("r1"), store=store)
    await a.handle.fs.write("note.txt", b"from run 1")
    b = await per_run.ensure(ctx("r2"), store=store)
    try:
        assert b.handle.id != a.handle.id
        assert not await b.handle.fs.exists("note.txt")
        again = await per_run.ensure(ctx("r1"), store=store)  # the same run finds its own
        assert again.handle.id == a.handle.id
    finally:
        await per_run.destroy(ctx("r1"), store=store)
        await per_run.destroy(ctx("r2"), store=store)


async def test_changed_workspace_or_provider_config_gives_a_new_key() -> None:
    c = ctx()
    base = Sandbox(provider="bubblewrap", workspace=Workspace(setup=["make"]))
    assert base.key(c) == Sandbox(provider="bubblewrap", workspace=Workspace(setup=["make"])).key(c)
    assert base.key(c) != Sandbox(provider="bubblewrap", workspace=Workspace(setup=["make all"])).key(c)
    limited = Sandbox(
        provider=BubblewrapProvider(limits=ResourceLimits(memory_bytes=256 << 20)),
        workspace=Workspace(setup=["make"]),
    )
    assert base.key(c) != limited.key(c)
    assert base.key(c) != Sandbox(provider="local", workspace=Workspace(setup=["make"])).key(c)
    assert base.key(c) != Sandbox(provider="bubblewrap", id="other", workspace=Workspace(setup=["make"])).key(c)
    assert base.key(c) != base.key(RunContext("t1", "r1", tenant="acme"))


async def test_only_direct_network_changes_the_key() -> None:
    # An allowlist is served per run from outside: the sandbox is the no-network one.
    c = ctx()
    closed = Sandbox(provider="bubblewrap")
    listed = Sandbox(provider="bubblewrap",
                     policy=Policy(network="allow", allow_hosts=["pypi.org"]))
    direct = Sandbox(provider="bubblewrap", policy=Policy(network="allow"))
    assert closed.key(c) == listed.key(c) != direct.key(c)


async def test_after_setup_snapshot_restores_without_running_setup(store: Store) -> None:
    sb = Sandbox(
        provider="bubblewrap",
        workspace=Workspace(setup=["echo ran >> /workspace/setup-count", "echo data > /workspace/built"]),
        lifecycle=Lifecycle(snapshot="after-setup"),
    )
    first = await sb.ensure(ctx("r1"), store=store)
    assert first.record.latest_snapshot_id
    # the live sandbox disappears behind the store's back
    await sb.get_provider().destroy(first.handle.id)
    second = await sb.ensure(ctx("r2"), store=store)
    try:
        assert second.origin == "restored"
        assert second.handle.id != first.handle.id
        assert await text(second.handle, "setup-count") == "ran\n"  # setup did not run again
        assert await text(second.handle, "built") == "data\n"
        res = await second.handle.process.exec(["sh", "-c", "echo more >> /workspace/built && id -u"])
        assert res.ok, res.stderr  # restored files are writable by the sandbox user
        rec = await store.get_instance(second.key)
        assert rec is not None and rec.provider_sandbox_id == second.handle.id
        assert rec.latest_snapshot_id == first.record.latest_snapshot_id
    finally:
        await sb.destroy(ctx("r2"), store=store)
    snaps = Path(sb.get_provider().base_dir).parent.parent / "snapshots" / "bubblewrap"
    assert not any(p.name.startswith("snap-") for p in snaps.iterdir())


async def test_missing_marker_is_bootstrapped_again(store: Store) -> None:
    sb = Sandbox(provider="local", workspace=Workspace(setup=["echo ran >> /dev/null; echo x >> count"]))
    first = await sb.ensure(ctx("r1"), store=store)
    await first.handle.fs.remove(".corral", recursive=True)
    second = await sb.ensure(ctx("r2"), store=store)
    try:
        assert second.origin == "rebootstrapped"
        assert second.handle.id == first.handle.id
        assert await text(second.handle, "count") == "x\nx\n"
        marker = json.loads(await text(second.handle, ".corral/bootstrap.json"))
        assert marker["workspace_hash"] == sb.workspace.hash()
        third = await sb.ensure(ctx("r3"), store=store)
        assert third.origin == "resumed"
    finally:
        await sb.destroy(ctx("r3"), store=store)


async def test_gc_destroys_idle_sandboxes(store: Store) -> None:
    from corral.sandbox._gc import collect_idle

    sb = Sandbox(provider="local", lifecycle=Lifecycle(keep_alive="10m"))
    ensured = await sb.ensure(ctx(), store=store)
    exp = ensured.record.expires_at
    assert exp is not None
    early = await collect_idle(store, now=exp - 1)
    assert early.entries == ()
    report = await collect_idle(store, now=exp + 1, providers={"local": sb.get_provider()})
    assert report.counts == {"destroyed": 1}
    assert await sb.get_provider().resume(ensured.handle.id) is None
    assert await store.get_instance(ensured.key) is None


async def test_local_provider_works_too(git_repo: Repo, store: Store) -> None:
    sb = Sandbox(
        provider=LocalProvider(),
        workspace=Workspace(source=GitSource(git_repo.url, ref="v1"), setup=["cd .. && cd workspace", "cat version.txt > copy.txt"]),
    )
    ensured = await sb.ensure(ctx(), store=store)
    try:
        assert await text(ensured.handle, "copy.txt") == "two\n"
    finally:
        await sb.destroy(ctx(), store=store)


def test_corral_gc_cli(cli_env: dict[str, str], corral_cmd: list[str], corral_home: Path) -> None:
    import subprocess

    import anyio

    sb = Sandbox(provider="local", lifecycle=Lifecycle(keep_alive=0.001))

    async def make() -> str:
        from corral.stores import open_store

        st = await open_store()
        try:
            return (await sb.ensure(ctx(), store=st)).handle.id
        finally:
            await st.aclose()

    sandbox_id = anyio.run(make)
    out = subprocess.run([*corral_cmd, "gc", "--json"], env=cli_env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    [line] = out.stdout.splitlines()  # one document
    [entry] = json.loads(line)["entries"]
    assert (entry["sandbox"], entry["outcome"]) == (sandbox_id, "destroyed")
    assert not (corral_home / "sandboxes" / "local" / sandbox_id).exists()
    again = subprocess.run([*corral_cmd, "gc"], env=cli_env, capture_output=True, text=True)
    assert again.returncode == 0 and "nothing idle" in again.stdout
    # nothing done is still an answer
    again = subprocess.run([*corral_cmd, "gc", "--json"], env=cli_env, capture_output=True,
                           text=True)
    assert (again.returncode, again.stdout) == (
        0, '{"dry_run": false, "entries": [], "counts": {}, "chunks": 0}\n')


async def test_local_dir_and_inline_files_sources(store: Store, tmp_path: Path) -> None:
    from corral import Files, LocalDir

    src = tmp_path / "proj"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    (src / "skip.log").write_text("noise")
    (src / "run.sh").write_text("#!/bin/sh\necho ok\n")
    (src / "run.sh").chmod(0o755)
    sb = Sandbox(provider="bubblewrap", workspace=Workspace(source=LocalDir(str(src), exclude=("*.log",))))
    e = await sb.ensure(ctx(), store=store)
    try:
        assert await text(e.handle, "pkg/mod.py") == "X = 1\n"
        assert not await e.handle.fs.exists("skip.log")
        res = await e.handle.process.exec(["./run.sh"], cwd="/workspace")
        assert res.stdout == b"ok\n"
    finally:
        await sb.destroy(ctx(), store=store)
    inline = Sandbox(provider="local", workspace=Workspace(source=Files({"a/b.txt": "hi", "c.bin": b"\x00\x01"})))
    e = await inline.ensure(ctx(), store=store)
    try:
        assert await text(e.handle, "a/b.txt") == "hi"
        assert await e.handle.fs.read("c.bin") == b"\x00\x01"
    finally:
        await inline.destroy(ctx(), store=store)


async def test_spec_hook_shapes_a_new_sandbox_and_not_a_resumed_one(store: Store) -> None:
    import shutil
    import tempfile
    from dataclasses import replace as dc_replace

    from corral.sandbox._contracts import SandboxSpec

    # Not under tmp_path: pytest makes it 0700, out of reach of the sandbox's uid.
    shared = Path(tempfile.mkdtemp(prefix="corral-hook-", dir="/var/tmp"))
    shared.chmod(0o755)
    (shared / "hello.txt").write_text("from the host\n")
    calls: list[SandboxSpec] = []

    def hook(spec: SandboxSpec) -> SandboxSpec:
        calls.append(spec)
        return dc_replace(spec, binds=[*spec.binds, (str(shared), "/opt/shared")])

    sb = Sandbox(provider="bubblewrap", lifecycle=Lifecycle(reuse="thread"))
    first = await sb.ensure(ctx("r1"), store=store, spec_hook=hook)
    try:
        assert first.origin == "created" and len(calls) == 1
        out = await first.handle.process.exec(["cat", "/opt/shared/hello.txt"])
        assert out.stdout == b"from the host\n", out
        second = await sb.ensure(ctx("r2"), store=store, spec_hook=hook)
        assert second.origin == "resumed" and second.handle.id == first.handle.id
        assert len(calls) == 1  # not called again: the sandbox keeps what it was made with
        out = await second.handle.process.exec(["cat", "/opt/shared/hello.txt"])
        assert out.stdout == b"from the host\n"
    finally:
        await sb.destroy(ctx("r1"), store=store)
        shutil.rmtree(shared, ignore_errors=True)


async def test_the_bootstrapping_record_is_written_with_the_setup_and_its_failure_is_raised(
    tmp_path: Path,
) -> None:
    """The record is written while setup runs; a store that fails that write fails ensure
    with the store's own error (not a group of them), and the new sandbox is destroyed."""
    from corral.stores._memory import MemoryStore
    from corral.stores._protocols import InstanceRecord, StoreError

    seen: list[str] = []

    class Failing(MemoryStore):
        async def upsert_instance(self, record: InstanceRecord) -> None:
            seen.append(str(record.meta["state"]))
            if record.meta["state"] == "bootstrapping":
                raise StoreError("the store is down")
            await super().upsert_instance(record)

    store = Failing()
    flag = tmp_path / "setup-ran"
    sb = Sandbox(provider="local", workspace=Workspace(setup=[f"sleep 0.2; touch {flag}"]),
                 lifecycle=Lifecycle(reuse="none"))
    provider = sb.get_provider()
    before = await provider.list()
    with pytest.raises(StoreError, match="the store is down"):
        await sb.ensure(ctx(), store=store)
    assert seen == ["bootstrapping"]
    assert not flag.exists()  # the setup was stopped with it
    assert await provider.list() == before
    assert await store.get_instance(sb.key(ctx())) is None

    # A working store: the bootstrapping record, then the ready one.
    seen.clear()
    ok = MemoryStore()
    states: list[str] = []
    orig = ok.upsert_instance

    async def record(rec: InstanceRecord) -> None:
        states.append(str(rec.meta["state"]))
        await orig(rec)

    ok.upsert_instance = record  # type: ignore[method-assign]
    ensured = await sb.ensure(ctx(), store=ok)
    assert states == ["bootstrapping", "ready"] and flag.exists()
    await sb.destroy(ctx(), store=ok)
    assert ensured.origin == "created"


async def test_the_ready_record_and_the_lock_release_are_one_write(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from corral.sandbox._ensure import key_lock_name
    from corral.stores._protocols import StoreError

    sb = Sandbox(provider="local", lifecycle=Lifecycle(reuse="none"))
    ensured = await sb.ensure(ctx(), store=store)
    try:
        record = await store.get_instance(ensured.key)  # type: ignore[attr-defined]
        assert record is not None and record.to_dict() == ensured.record.to_dict()
        assert record.meta["state"] == "ready"
        # released: another owner takes the key's lock at once
        assert await store.try_lock(key_lock_name(ensured.key), "other", 30)  # type: ignore[attr-defined]
        await store.unlock(key_lock_name(ensured.key), "other")  # type: ignore[attr-defined]
    finally:
        await sb.destroy(ctx(), store=store)

    # the merged write fails: ensure raises the store's error, and the lock is released
    async def broken(*args: object) -> None:
        raise StoreError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(store, "upsert_instance_unlocking", broken)
        with pytest.raises(StoreError, match="disk full"):
            await sb.ensure(ctx("r2"), store=store)
    key = sb.key(ctx("r2"))
    assert await store.try_lock(key_lock_name(key), "other", 30)  # type: ignore[attr-defined]
    await store.unlock(key_lock_name(key), "other")  # type: ignore[attr-defined]
    await sb.destroy(ctx("r2"), store=store)


async def test_the_key_lock_waits_for_another_owner_and_renews_its_lease(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """key_lock waits while another process holds the key, takes it when released, keeps
    its lease alive while held (the store's clock is the test's: the lease must follow
    it) and releases it at the end."""
    import anyio

    from corral.sandbox import _ensure
    from corral.stores._sqlite import SQLiteStore

    now = [1000.0]
    store = SQLiteStore(tmp_path / "s.db", clock=lambda: now[0])
    monkeypatch.setattr(_ensure, "LOCK_TTL", 0.3)  # a renewal every 0.1 s
    name = _ensure.key_lock_name("k")

    async def expiry() -> float:
        def read(conn: object) -> float:
            row = conn.execute(  # type: ignore[attr-defined]
                "SELECT expires_at FROM locks WHERE name = ?", (name,)).fetchone()
            return float(row[0]) if row else -1.0
        return await store._read(read)  # type: ignore[arg-type]

    try:
        assert await store.try_lock(name, "other", 30)
        inside = anyio.Event()
        leave = anyio.Event()

        async def hold() -> None:
            async with _ensure.key_lock(store, "k", read_instance=True) as held:
                assert held.read and held.instance is None
                inside.set()
                await leave.wait()

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(hold)
                await anyio.wait_all_tasks_blocked()
                assert not inside.is_set()  # the other owner holds the key
                assert await store.unlock(name, "other")
                await inside.wait()
                for later in (1010.0, 1020.0):  # far past the 0.3 s lease: renewed
                    now[0] = later
                    while await expiry() != later + 0.3:
                        await anyio.sleep(0.01)
                    assert not await store.try_lock(name, "other", 30)
                leave.set()
        assert await expiry() == -1.0  # released
    finally:
        await store.aclose()


async def test_a_keys_local_lock_is_gone_once_nobody_holds_or_waits_for_it(
        tmp_path: Path) -> None:
    """A long-lived server ensures run-scoped keys by the thousand: their in-process locks
    must not pile up; two tasks of one key still share one lock."""
    import gc

    import anyio

    from corral.sandbox import _ensure
    from corral.stores._sqlite import SQLiteStore

    store = SQLiteStore(tmp_path / "s.db")
    try:
        order: list[str] = []

        async def use(tag: str) -> None:
            async with _ensure.key_lock(store, "run-key"):
                order.append(f"{tag} in")
                await anyio.sleep(0.05)
                order.append(f"{tag} out")

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(use, "a")
                tg.start_soon(use, "b")
        assert order in (["a in", "a out", "b in", "b out"],
                         ["b in", "b out", "a in", "a out"])  # one lock: never interleaved
        for i in range(20):
            async with _ensure.key_lock(store, f"run-{i}"):
                pass
        gc.collect()
        assert not [k for k in _ensure._local_locks if k.startswith("run-")]
    finally:
        await store.aclose()
