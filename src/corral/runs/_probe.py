"""``probe_run_exit``: did a detached run's agent exit? Answered from the journal's tail only.

This is what makes the reaper safe: after a viewer leaves nothing appends to the event log,
so the log cannot say whether the agent finished; the journal keeps growing and ends with
the supervisor's exit sentinel once it did. The probe reads only the end of the journal and
never drives the run, writes, or closes anything.

Where the journal is comes from the run record's ``journal`` mapping, which the Runner
writes when it starts the run:

- ``dir``: the host-private directory holding the run's journal files
  (:class:`corral.journal._layout.JournalPaths`, named after the run id);
- ``nonce``: the run's sentinel nonce (32 lowercase hex characters).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import anyio.to_thread

from corral._errors import CorralError
from corral.journal._reader import probe_journal_tail
from corral.journal._layout import JournalPaths
from corral.runs._reap import ProbeResult
from corral.stores._records import RunRecord
from corral.journal._sentinel import normalize_nonce

__all__ = ["JournalLocationError", "journal_location", "probe_run_exit"]


class JournalLocationError(CorralError):
    """A run record does not say where its journal is (or says it malformed)."""


def journal_location(record: RunRecord) -> tuple[JournalPaths, str]:
    """The run's journal paths and nonce, from ``record.journal`` (keys ``dir``, ``nonce``).

    Raises :class:`JournalLocationError` naming what is missing.
    """
    info: Mapping[str, Any] | None = record.journal
    if info is None:
        raise JournalLocationError(
            f"run {record.run_id!r} has no journal in its record; it was not started as a "
            "durable run, so nobody can tell whether its agent finished"
        )
    directory = info.get("dir")
    nonce = info.get("nonce")
    if not isinstance(directory, str) or not directory or not os.path.isabs(directory):
        raise JournalLocationError(
            f"run {record.run_id!r}: journal.dir must be an absolute directory path, "
            f"got {directory!r}"
        )
    if not isinstance(nonce, str):
        raise JournalLocationError(f"run {record.run_id!r}: journal.nonce is missing")
    try:
        normalize_nonce(nonce)
    except ValueError as exc:
        raise JournalLocationError(f"run {record.run_id!r}: journal.nonce: {exc}") from None
    return JournalPaths.for_run(directory, record.run_id), nonce


async def probe_run_exit(
    record: RunRecord,
    *,
    max_bytes: int = 65536,
    recent: float = 30.0,
) -> ProbeResult:
    """``finished`` with the agent's exit code when the run's journal ends with its exit
    sentinel; ``producing`` while the supervisor is alive or the journal changed within
    ``recent`` seconds; otherwise ``unknown`` with the reason. Any failure is ``unknown``,
    never ``finished``; it never raises and never drives the run.
    """
    try:
        paths, nonce = journal_location(record)
    except JournalLocationError as exc:
        return ProbeResult.unknown(str(exc))
    try:
        # A local file read, but possibly on slow storage: keep it off the event loop.
        probe = await anyio.to_thread.run_sync(
            lambda: probe_journal_tail(paths, nonce, max_bytes=max_bytes, recent=recent)
        )
    except Exception as exc:  # noqa: BLE001 - a probe never raises
        return ProbeResult.unknown(f"probing the journal failed: {exc}")
    if probe.state == "finished" and probe.code is not None:
        return ProbeResult.finished(probe.code)
    if probe.state == "producing":
        return ProbeResult.producing()
    return ProbeResult.unknown(probe.reason or "the journal probe could not tell")
