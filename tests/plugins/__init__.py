"""Test-only plugin packages (a provider, a harness), installed into subprocesses by a
directory on PYTHONPATH."""

from __future__ import annotations

import json
import subprocess
from typing import Any


def read_until(proc: subprocess.Popen[str], text: str) -> list[dict[str, Any]]:
    """The NDJSON events ``proc`` prints, up to the one whose text has ``text``."""
    assert proc.stdout is not None
    seen: list[dict[str, Any]] = []
    while True:
        line = proc.stdout.readline()
        assert line, f"the process ended before printing {text!r}: {seen}"
        seen.append(json.loads(line))
        if text in seen[-1]["event"].get("delta", ""):
            return seen
