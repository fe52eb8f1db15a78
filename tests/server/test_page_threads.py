"""The page's threads (#27) in headless Chromium (tests/server/e2e/page_threads.mjs): the
thread list, Undo turn and Fork on a thread, checked against the store."""

from __future__ import annotations

from pathlib import Path

from tests.server.conftest import TOKEN, Home
from tests.server.test_page import drive_page


def test_page_lists_threads_and_undoes_and_forks(home: Home, page_driver: Path,
                                                 screenshots: Path) -> None:
    with home.server(token=TOKEN) as server:
        out = drive_page(page_driver / "page_threads.mjs", server.url, screenshots, server.log)
    assert out["out1"] == "one\n" and out["out2"] == "one\n", out
    assert out["threadRow"][:3] == ["pt", "2", "completed"]
    assert any(f"undone: {out['r2']}" in b for b in out["undoBanners"]), out["undoBanners"]
    assert home.raw(out["r2"])["undone_at"] is not None
    assert out["out3"] == "one\n"  # the file as before r2
    assert out["threadField"] == "pt-fork", (out["forkBanners"], out["undoBanners"])
    assert home.raw(out["r4"])["thread_id"] == "pt-fork"
    assert out["out4"] == "one\n"  # the fork's state: after r3
    assert out["runUndoneShown"].endswith("(undone)")
    assert out["title"] == out["r3"]  # a click on thread pt showed its latest run
    assert out["layout"]["unnamed"] == []
    assert [e for e in out["consoleErrors"] if "401" not in e] == []
    assert (screenshots / "threads.png").stat().st_size > 10_000
