"""The shipped reaper conformance suite, run against the memory and SQLite backends."""

from corral.testing._reaper import (  # noqa: F401
    TestReapOutcomes,
    TestReapSweep,
    TestReclaim,
    reaper_world,
)
