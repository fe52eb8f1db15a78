"""Pruning a journal directory against the run store: the journal's prune
(:mod:`corral.journal._prune`) told by run records which runs ended."""

from __future__ import annotations

import logging
import os
from typing import Protocol

from corral.journal._prune import (
    DEFAULT_MAX_DELETES,
    DEFAULT_ORPHAN_TTL,
    KeptJournal,
    PruneResult,
    decode_run_id,
    prune_journal_dir,
)
from corral.stores._records import RunRecord

__all__ = [
    "DEFAULT_MAX_DELETES",
    "DEFAULT_ORPHAN_TTL",
    "KeptJournal",
    "PruneResult",
    "decode_run_id",
    "prune_journals",
]


class RecordReader(Protocol):
    async def get(self, run_id: str) -> RunRecord | None: ...


async def prune_journals(
    store: RecordReader,
    directory: str | os.PathLike[str],
    *,
    now: float | None = None,
    orphan_ttl: float = DEFAULT_ORPHAN_TTL,
    max_deletes: int = DEFAULT_MAX_DELETES,
    logger: logging.Logger | None = None,
) -> PruneResult:
    """Delete the journal files in ``directory`` of runs whose record is terminal, or of
    long-orphaned runs (no record); see :mod:`corral.journal._prune`. Never raises."""

    async def run_ended(run_id: str) -> bool | None:
        record = await store.get(run_id)
        return None if record is None else record.terminal

    return await prune_journal_dir(run_ended, directory, now=now, orphan_ttl=orphan_ttl,
                                   max_deletes=max_deletes, logger=logger)
