"""One reaper sweep's default limits, apart from :mod:`corral.runs._reap_sweep` (which
re-exports them): ``corral reap --help`` and ``corral completion``, which print them, import
no reaper."""

from __future__ import annotations

from typing import Final

__all__ = ["DEFAULT_BUDGET", "DEFAULT_MAX_RUNS"]

DEFAULT_BUDGET: Final = 30.0
"""Seconds one drive may take once it started. On the finalization path a safety net (the
agent already exited, replaying its tail should be quick); on the expiry path the designed
stop for an agent that is still working."""

DEFAULT_MAX_RUNS: Final = 25
"""Runs one sweep takes on; the next sweep takes the next batch."""
