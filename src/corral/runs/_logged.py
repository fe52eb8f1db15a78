"""How far into the journal a driver has logged, so that events from no journal line
(approval requests and answers, policy denials) land after the agent's events that came
before them.

The agent (or the ACP bridge) writes its tool call to the journal and then asks the host
over the tool socket; the driver's pipe may still be a few lines behind when the question
arrives. An aside event waits until the pipe has logged every complete line the journal
held when it was raised, so a viewer sees ``TOOL_CALL_START`` before the approval request
for that call, the same way in every run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

import anyio

__all__ = ["ASIDE_ORDER_WAIT", "LoggedOffset", "complete_end"]

ASIDE_ORDER_WAIT: Final = 2.0
"""The longest an aside event waits for the pipe (a stalled pipe must not hold a question
back: order is a courtesy to viewers, the question is the run's progress)."""

_TAIL: Final = 1 << 16


class LoggedOffset:
    """The journal offset up to which this driver's pipe has logged (or skipped as
    eventless) every line; raised by the producer, awaited by aside events."""

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self._moved = anyio.Event()

    def reached(self, offset: int) -> None:
        """The pipe has logged everything before ``offset``."""
        if offset > self.offset:
            self.offset = offset
            self._moved.set()
            self._moved = anyio.Event()

    async def wait(self, offset: int, timeout: float = ASIDE_ORDER_WAIT) -> bool:
        """Wait until everything before ``offset`` is logged; ``False`` after ``timeout``."""
        with anyio.move_on_after(timeout):
            while self.offset < offset:
                await self._moved.wait()
            return True
        return False


def complete_end(path: Path) -> int:
    """The offset just past the journal's last complete line (0 if there is none, or no
    journal): where the pipe must have got to for every line written so far."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = max(0, size - _TAIL)
            f.seek(start)
            tail = f.read(size - start)
    except OSError:
        return 0
    cut = tail.rfind(b"\n")
    # a line longer than the tail read is still being written: wait for what precedes it
    return start + cut + 1 if cut >= 0 else start
