"""Small helpers the test suites share (importable functions, not fixtures)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable


def wait_until(cond: Callable[[], bool], timeout: float, what: str, every: float = 0.01) -> None:
    """Poll ``cond`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def one_line_refusal(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    """A user mistake's answer: non-zero exit, one line on stderr holding every needle,
    never a traceback."""
    assert r.returncode != 0, r.stdout
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for needle in needles:
        assert needle in r.stderr, r.stderr
