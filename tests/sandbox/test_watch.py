"""File hooks: create / change / delete from inotify, diffs against the git baseline."""

from __future__ import annotations

import math
from pathlib import Path

import anyio
import pytest

from corral import FileEvent, GitSource, Hooks, RunContext, Sandbox, Workspace
from corral.stores._protocols import Store
from corral.sandbox._watch import WorkspaceWatcher, watch_workspace

from .conftest import Repo

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("bwrap_ok")]


@pytest.mark.parametrize("provider", ["local", "bubblewrap"])
async def test_file_events_with_diffs(git_repo: Repo, store: Store, provider: str) -> None:
    send, receive = anyio.create_memory_object_stream[FileEvent](math.inf)
    creates: list[str] = []

    async def on_file(event: FileEvent) -> None:
        await send.send(event)

    hooks = Hooks(on_file=on_file, on_file_create=lambda e: creates.append(e.path))
    sb = Sandbox(
        provider=provider,
        workspace=Workspace(source=GitSource(git_repo.url, ref="main"), setup=["echo bye > gone.txt"]),
        hooks=hooks,
    )
    ctx = RunContext("t", "r")
    ensured = await sb.ensure(ctx, store=store)
    h = ensured.handle
    try:
        async with watch_workspace(h, sb.hooks) as watcher:
            assert watcher is not None
            res = await h.process.exec(
                ["sh", "-c", "echo new > new.txt; echo more >> version.txt; rm gone.txt; "
                 "mkdir -p d/e && echo x > d/e/f; mkdir -p node_modules/p && echo y > node_modules/p/i"],
                cwd="/workspace",
            )  # fmt: skip
            assert res.ok, res.stderr
            want = {("create", "new.txt"), ("change", "version.txt"), ("delete", "gone.txt"),
                    ("create", "d/e/f")}  # fmt: skip
            seen: dict[tuple[str, str], FileEvent] = {}
            with anyio.fail_after(15):
                while not want <= set(seen):
                    ev = await receive.receive()
                    seen[(ev.kind, ev.path)] = ev
        assert not any(p.startswith(("node_modules", ".git")) for _, p in seen)
        change = await seen[("change", "version.txt")].diff()
        assert " three\n+more\n" in change
        added = await seen[("create", "new.txt")].diff()
        assert "new file mode" in added and "+new" in added
        assert "new.txt" in creates and "d/e/f" in creates
    finally:
        await sb.destroy(ctx, store=store)


async def test_no_file_hooks_means_no_watcher(store: Store) -> None:
    sb = Sandbox(provider="local")
    ctx = RunContext("t", "r")
    ensured = await sb.ensure(ctx, store=store)
    try:
        async with watch_workspace(ensured.handle, sb.hooks) as watcher:
            assert watcher is None
    finally:
        await sb.destroy(ctx, store=store)


async def test_ready_error_destroy_hooks(store: Store) -> None:
    calls: list[str] = []
    hooks = Hooks(
        on_ready=lambda h: calls.append(f"ready:{h.id}"),
        on_destroy=lambda rec: calls.append(f"destroy:{rec.provider_sandbox_id}"),
        on_error=lambda exc: calls.append(f"error:{type(exc).__name__}"),
    )
    ok = Sandbox(provider="local", hooks=hooks)
    ctx = RunContext("t", "r")
    ensured = await ok.ensure(ctx, store=store)
    await ok.destroy(ctx, store=store)
    assert calls == [f"ready:{ensured.handle.id}", f"destroy:{ensured.handle.id}"]
    bad = Sandbox(provider="local", hooks=hooks, workspace=Workspace(setup=["exit 1"]))
    with pytest.raises(Exception, match="exit 1"):
        await bad.ensure(ctx, store=store)
    assert calls[-1] == "error:SetupError"


async def test_watcher_sees_every_file_of_trees_made_while_it_runs(tmp_path: Path) -> None:
    """Directories created and filled faster than the watcher adds its watches: every file
    still arrives as exactly one create (the watch goes on before the listing)."""
    watcher = WorkspaceWatcher(tmp_path)
    script = "; ".join(
        f"mkdir -p t{i}/a/b/c && echo x > t{i}/a/b/c/f && echo y > t{i}/a/g" for i in range(200)
    )
    want = {f"t{i}/a/b/c/f" for i in range(200)} | {f"t{i}/a/g" for i in range(200)}
    creates: list[str] = []
    try:
        with anyio.fail_after(20):
            async with await anyio.open_process(["sh", "-c", script], cwd=tmp_path) as proc:
                # consumed while the trees are being made, so the watcher races the writer
                async for kind, path in watcher.events():
                    if kind == "create":
                        creates.append(path)
                    if want <= set(creates):
                        break
                assert await proc.wait() == 0
    finally:
        watcher.close()
    assert sorted(creates) == sorted(want)  # no file twice
