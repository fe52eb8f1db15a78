"""Waiting for a run's event log to stop growing before a new driver appends to it.

The store already fences appends by epoch, so once a claim is taken no predecessor can land
anything. The wait is the second line of defence the design asks for: a successor that reads
"where the log stopped" only after the length held still for one window does not start from
a position a predecessor was still moving (for instance a backend whose fence is weaker, or a
predecessor that had a batch in flight when the claim changed hands).

Only the log's length is compared (its last offset, which equals the number of events because
offsets are gap-free from 1), read with calls that never wait on an open log.
"""

from __future__ import annotations

from typing import Final, Protocol

import anyio

from corral._errors import CorralError
from corral.stores._protocols import LogTail

__all__ = ["DEFAULT_QUIET", "MAX_QUIET_PROBES", "LogNeverQuiet", "await_log_quiet"]

DEFAULT_QUIET: Final = 1.0
"""Seconds the log length must hold still. Short because the store's fenced append already
stops a superseded writer; the window only has to outlast a batch in flight."""

MAX_QUIET_PROBES: Final = 6
"""Re-measurements after the first one before giving up."""


class TailReader(Protocol):
    async def tail(self, run_id: str) -> LogTail: ...


class LogNeverQuiet(CorralError):
    """The log kept growing for every window: someone else is still writing to it."""

    def __init__(self, run_id: str, length: int, probes: int, quiet: float) -> None:
        super().__init__(
            f"the event log of run {run_id!r} never quiesced: it was still growing after "
            f"{probes} windows of {quiet:g}s (now {length} events); another driver is "
            "probably still writing, try again later"
        )
        self.run_id = run_id
        self.length = length


async def await_log_quiet(
    log: TailReader,
    run_id: str,
    quiet: float = DEFAULT_QUIET,
    *,
    probes: int = MAX_QUIET_PROBES,
) -> int:
    """Return the log's length once it held still for ``quiet`` seconds.

    Measures once, then up to ``probes`` times after sleeping ``quiet`` each (no sleep when
    ``quiet <= 0``); two equal measurements in a row end the wait. Raises
    :class:`LogNeverQuiet` when every window saw growth.
    """
    previous = (await log.tail(run_id)).last_offset
    for _ in range(max(1, probes)):
        if quiet > 0:
            await anyio.sleep(quiet)
        current = (await log.tail(run_id)).last_offset
        if current == previous:
            return current
        previous = current
    raise LogNeverQuiet(run_id, previous, max(1, probes), quiet)
