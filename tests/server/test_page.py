"""The web page in headless Chromium (playwright-core, driven by tests/server/e2e/page.mjs):
token, start a run, watch it, reload mid-run and see the rest exactly once, cancel."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from corral.testing._plugin import require
from tests.server.conftest import TOKEN, Home, ticker_text

CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture
def playwright(request: pytest.FixtureRequest, e2e: Path) -> Path:
    require(request.config, CHROMIUM.exists(), "Chromium at /usr/bin/chromium",
            "apt-get install chromium")
    return e2e / "page.mjs"


def test_page_start_watch_reload_cancel(home: Home, playwright: Path, tmp_path: Path) -> None:
    shots = tmp_path / "shots"
    shots.mkdir()
    with home.server(token=TOKEN) as server:
        done = subprocess.run(["node", str(playwright), server.url, TOKEN, str(shots)],
                              capture_output=True, text=True, timeout=180, cwd=playwright.parent)
        assert done.returncode == 0, done.stderr + "".join(server.log)
        out = json.loads(done.stdout.strip().splitlines()[-1])

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
    assert "run finished" in out["finishedBanner"]
    assert stored[-1]["type"] == "RUN_FINISHED"

    cancelled = home.log(out["cancelRunId"])
    assert cancelled[-1]["type"] == "RUN_ERROR"
    assert home.raw(out["cancelRunId"])["status"] == "aborted"
    assert "run error" in out["cancelBanner"]
    assert out["hostileText"] == "<img src=x onerror=window.pwned=1>\n"
    assert out["hostileImages"] == 0 and out["pwned"] is False
    # the page starts runs with file events on: the file the agent made is listed, as text
    assert "<img src=y onerror=window.pwned=1>" in out["filesShown"], out["filesShown"]
    # ... and with diffs, its patch on click, as text (no markup made of it)
    assert "+<b>bold</b>" in out["diffShown"], out["diffShown"]
    assert out["diffBold"] == 0
    # Only the API's 401 before the token was given.
    assert [e for e in out["consoleErrors"] if "401" not in e] == []
    for name in ("page-finished.png", "page-cancelled.png"):
        assert (shots / name).stat().st_size > 10_000
    keep = Path("/tmp/corral-page-shots")
    keep.mkdir(exist_ok=True)
    for shot in shots.iterdir():
        shutil.copy(shot, keep / shot.name)
