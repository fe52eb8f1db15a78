"""The takeover limit (#27): a run whose drivers keep dying is ended, not adopted again.

A *takeover* is a claim on a run whose previous driver never let go (it died, or its lease
lapsed): the Runner's drivers (``corral attach``, a server adopting a run) and the reaper's
sweep alike. Each one is counted on the record, fenced by the new claim, as long as the
run's log does not move (``{"count", "offset"}``): any logged progress, or a driver that let
go cleanly (a detach), resets the count. The driver that finds the count over the limit
ends the run ``failed`` with :class:`TakeoverLimit` instead of driving it, so a turn that
kills every host adopting it stops doing so.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Final

from corral._errors import CorralError
from corral.runs._pipe import Produced
from corral.stores._protocols import RunStore
from corral.stores._records import RunPatch, RunRecord

__all__ = ["DEFAULT_MAX_TAKEOVERS", "TakeoverLimit", "count_takeover", "raising"]

DEFAULT_MAX_TAKEOVERS: Final = 3
"""Drivers that may take a run over and die without it making progress before the next
one ends it ``failed`` (``Runner(max_takeovers=)``, ``$CORRAL_MAX_TAKEOVERS``)."""


class TakeoverLimit(CorralError):
    """A run whose drivers keep dying is ended rather than taken over again."""

    code = "takeover_limit"

    def __init__(self, count: int, limit: int) -> None:
        super().__init__(
            f"the run was ended after {count - 1} drivers in a row took it over and died "
            f"without it making progress (the limit is {limit}: Runner(max_takeovers=), "
            "$CORRAL_MAX_TAKEOVERS); it may be what kills its hosts")


async def count_takeover(store: RunStore, record: RunRecord, offset: int, epoch: int,
                         takeover: bool) -> int:
    """Consecutive takeovers of the run at log offset ``offset`` (progress resets the
    count, and so does a driver that let go cleanly: ``takeover`` false), written on the
    record fenced by the claim at ``epoch``; returns the count. ``record``: the run as read
    when (or after) the claim was taken."""
    prev = record.takeovers or {}
    count = 0
    if takeover:
        same = prev.get("offset") == offset and isinstance(prev.get("count"), int)
        count = int(prev["count"]) + 1 if same else 1
    if count or prev:
        await store.update(record.run_id, RunPatch(
            takeovers={"count": count, "offset": offset} if count else None),
            expect_epoch=epoch)
    return count


async def raising(exc: Exception) -> AsyncIterator[Produced]:
    """A producer that fails with ``exc`` at once (what ends a run through the pipe)."""
    raise exc
    yield  # pragma: no cover
