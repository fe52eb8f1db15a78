"""File events (``Sandbox(file_events=...)``): what they cost a run.

* start: the workspace manifest written before the agent launches (a walk + stat of every
  file) and the watch set up by each driver (one inotify watch per directory);
* catch-up: a driver's walk and comparison against the manifest and the log;
* latency: a file written in the workspace -> its ``sandbox.file`` event handed to the log
  (the feed's ``emit``), p50 / p99.

Run:
    PYTHONPATH=src python bench/file_events.py [--files 10000] [--dirs 100] [--samples 200]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from corral.providers._local import LocalProvider
from corral.runs._file_feed import FileFeed, catch_up, logged_file_state, scan_manifest
from corral.sandbox._contracts import SandboxSpec
from corral.sandbox._watch import WorkspaceWatcher


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.1f} ms"


async def main(files: int, dirs: int, samples: int) -> None:
    provider = LocalProvider(home=Path(tempfile.mkdtemp(prefix="corral-fe-")))
    handle = await provider.create(SandboxSpec())
    try:
        root = handle.host_path(handle.workdir)
        for d in range(dirs):
            sub = Path(root) / f"pkg{d}" / "src"
            sub.mkdir(parents=True)
            for f in range(files // dirs):
                (sub / f"m{f}.py").write_text("x = 1\n")
        print(f"workspace: {files} files in {dirs * 2} directories")

        t0 = time.perf_counter()
        manifest = scan_manifest(root)
        print(f"  start manifest (walk + stat)       {ms(time.perf_counter() - t0)}")
        t0 = time.perf_counter()
        watcher = WorkspaceWatcher(root)
        print(f"  watch set-up (inotify, every dir)  {ms(time.perf_counter() - t0)}")
        watcher.close()
        for d in range(0, dirs, 10):
            (Path(root) / f"pkg{d}" / "src" / "m0.py").write_text("x = 2\n")
        t0 = time.perf_counter()
        now = scan_manifest(root)
        missed = catch_up(manifest, logged_file_state([]), now)
        print(f"  catch-up (walk + compare)          {ms(time.perf_counter() - t0)}"
              f"   ({len(missed)} changes found)")

        seen: dict[str, float] = {}
        got = anyio.Event()

        async def emit(events: Any) -> None:
            for e in events:
                seen.setdefault(e["value"]["path"], time.perf_counter())
            got.set()

        feed = FileFeed(handle, root, emit=emit, diff=False, baseline=None, manifest=None)
        await feed.start([])
        lat: list[float] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(feed.run)
            for i in range(samples):
                got = anyio.Event()
                path = f"pkg{i % dirs}/src/new{i}.py"
                t0 = time.perf_counter()
                (Path(root) / path).write_text("y = 1\n")
                with anyio.fail_after(10):
                    while path not in seen:
                        await got.wait()
                        got = anyio.Event()
                lat.append(seen[path] - t0)
            tg.cancel_scope.cancel()
        feed.close()
        lat.sort()
        print(f"  write -> event handed to the log   p50 {ms(statistics.median(lat))}   "
              f"p99 {ms(lat[int(len(lat) * 0.99) - 1])}")
    finally:
        await provider.destroy(handle.ref)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=10000)
    parser.add_argument("--dirs", type=int, default=100)
    parser.add_argument("--samples", type=int, default=200)
    a = parser.parse_args()
    anyio.run(main, a.files, a.dirs, a.samples)
