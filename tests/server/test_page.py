"""The web page in headless Chromium (playwright-core, driven by tests/server/e2e/page.mjs)
with command runs: token, start a run, reload mid-run and see the rest exactly once, detach
and watch again, cancel, hostile output, file patches, a phone's viewport. Agent runs (a
tool call, an approval) are in tests/agents/test_page_agent.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.server.conftest import TOKEN, Home, ticker_text


def drive_page(script: Path, url: str, shots: Path, log: list[str]) -> dict[str, Any]:
    """Run a page driver against the page at ``url``; its JSON summary."""
    done = subprocess.run(["node", str(script), url, TOKEN, str(shots)],
                          capture_output=True, text=True, timeout=300, cwd=script.parent)
    assert done.returncode == 0, done.stderr + "".join(log)
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def test_page_start_watch_reload_detach_cancel(home: Home, page_driver: Path,
                                               screenshots: Path) -> None:
    with home.server(token=TOKEN) as server:
        out = drive_page(page_driver / "page.mjs", server.url, screenshots, server.log)

    run_id = out["runId"]
    stored = home.log(run_id)
    n = len(stored)
    # Every event shown exactly once, in order, across the reload.
    assert out["offsets"] == list(range(1, n + 1))
    assert out["dupes"] == 0 and out["gaps"] == 0
    # The reload happened mid-run and resumed after what was shown, not from the start.
    assert out["shownBeforeReload"] <= out["resumedFrom"] < n
    assert out["receivedAfterReload"] == list(range(out["resumedFrom"] + 1, n + 1))
    assert out["receivedBeforeReload"][:10] == list(range(1, 11))
    assert out["transcript"] == ticker_text(40)
    assert out["commandShown"].startswith("$ sh -c ")
    assert "run finished" in out["finishedBanner"]
    assert stored[-1]["type"] == "RUN_FINISHED"

    # Detached: the page stopped watching while the run went on; watching again showed the
    # rest with nothing lost or repeated; then it was cancelled from the page.
    assert out["detachLabel"] == "Watch"
    assert out["serverWentOn"] is True
    assert out["shownWhileDetached"] == 0 and out["receivedWhileDetached"] == 0
    assert out["detachedRecord"]["status"] == "running"
    assert out["detachedRecord"]["detachedSince"] is not None
    assert out["serverWentOnAfterReload"] is True and out["detachLabelAfterReload"] == "Watch"
    assert out["shownAfterDetachedReload"] == 0 and out["receivedAfterDetachedReload"] == 0
    cancelled = home.log(out["cancelRunId"])
    assert out["detachOffsets"] == list(range(1, len(cancelled) + 1))
    assert out["detachDupes"] == 0 and out["detachGaps"] == 0
    assert cancelled[-1]["type"] == "RUN_ERROR"
    assert home.raw(out["cancelRunId"])["status"] == "aborted"
    assert "run error" in out["cancelBanner"]

    # Hostile output and file names are text; nothing they spell was made or ran.
    assert out["hostileText"] == \
        "<img src=x onerror=window.pwned=1></script><script>window.pwned=1</script>\n"
    assert any("<img src=y onerror=window.pwned=1>" in f for f in out["filesShown"]), out
    assert out["diffOpenBefore"] is False  # patches start folded
    assert "+<b>bold</b>" in out["diffShown"], out["diffShown"]
    assert out["diffBold"] == 0
    assert out["hostile"] == {"images": 0, "scripts": 0, "pwned": False}

    # Labelled controls, no sideways scrolling, on a desktop and a phone.
    for layout in (out["desktop"], out["phone"]):
        assert layout["unnamed"] == []
        assert layout["scrollWidth"] <= layout["width"], layout
    assert out["phone"]["width"] == 375
    # Only the API's 401 before the token was given.
    assert [e for e in out["consoleErrors"] + out["phoneConsoleErrors"] if "401" not in e] == []
    for name in ("command-finished", "command-detached", "command-cancelled", "command-phone"):
        assert (screenshots / f"{name}.png").stat().st_size > 10_000


def test_page_run_list_shows_dates_and_pages(home: Home, page_driver: Path,
                                             screenshots: Path) -> None:
    """A run of another day shows its date (and year), not only a time; the list shows the
    newest 50 and "Show older runs" brings the next ones."""
    import time

    import anyio

    from corral import open_store
    from corral.stores._protocols import NewRun, RunStatus

    old = 1709640000.0  # 2024-03-05 12:00 UTC: the same day in any browser's zone

    async def seed() -> None:
        store = await open_store(f"sqlite:///{home.db}")
        try:
            for i in range(59):
                await store.create(NewRun(f"run-old-{i:02d}", f"run-old-{i:02d}",
                                          status=RunStatus.COMPLETED), now=old + i)
            await store.create(NewRun("run-today", "run-today", status=RunStatus.COMPLETED),
                               now=time.time())
        finally:
            await store.aclose()

    anyio.run(seed)
    with home.server(token=TOKEN) as server:
        out = drive_page(page_driver / "page_list.mjs", server.url, screenshots, server.log)

    first, second = out["first"], out["second"]
    assert [r["id"] for r in first] == ["run-today"] + [f"run-old-{i:02d}"
                                                        for i in range(58, 9, -1)]
    assert out["moreVisible"] and out["moreText"] == "Show older runs (50 shown)"
    today = first[0]["when"]
    assert out["expectedDay"] not in today and ":" in today  # today: the time alone
    for row in first[1:]:
        assert row["when"].startswith(out["expectedDay"] + " "), row  # another day: its date
        assert "2024" in row["title"]
    assert [r["id"] for r in second] == [r["id"] for r in first] + [
        f"run-old-{i:02d}" for i in range(9, -1, -1)]
    assert not out["moreVisibleAfter"]  # all 60 shown
    assert [e for e in out["consoleErrors"] if "401" not in e] == []  # 401: before the token
