"""The one polling helper: wait until a condition holds, or fail naming what was awaited.

Tests wait on conditions, never sleep past a race. :func:`wait_until` blocks the calling
thread (for code outside an event loop); :func:`wait_until_async` sleeps on the running
event loop (asyncio or trio) and accepts a predicate that is itself async.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable

import anyio

__all__ = ["WaitTimeout", "wait_until", "wait_until_async"]


class WaitTimeout(AssertionError):
    """A condition did not hold in time. An ``AssertionError``, so a test reports it as a
    failure (not an error) and a kit reports it as a failed check."""


def _timed_out(what: str, timeout: float) -> WaitTimeout:
    return WaitTimeout(f"timed out after {timeout}s waiting for {what}")


def wait_until(
    predicate: Callable[[], object],
    what: str,
    *,
    timeout: float = 10.0,
    interval: float = 0.01,
) -> None:
    """Call ``predicate`` every ``interval`` seconds until it returns a true value; raise
    :class:`WaitTimeout` naming ``what`` after ``timeout`` seconds. The predicate is
    always called at least once, and once more at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout)
        time.sleep(interval)


async def wait_until_async(
    predicate: Callable[[], object | Awaitable[object]],
    what: str,
    *,
    timeout: float = 10.0,
    interval: float = 0.01,
) -> None:
    """:func:`wait_until` on the running event loop: sleeps with :func:`anyio.sleep`
    between polls; ``predicate`` may be a plain or an async function."""
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout)
        await anyio.sleep(interval)
