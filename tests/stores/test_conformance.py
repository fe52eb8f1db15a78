"""The shipped conformance suite, run against the memory and SQLite backends."""

from corral.testing._stores import (  # noqa: F401
    TestClaims,
    TestEventLog,
    TestInstanceStore,
    TestListRuns,
    TestNamedLock,
    TestPipeToRunLog,
    TestRunStoreContract,
)
