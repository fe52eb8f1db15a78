"""Did a run's agent exit? Answered from its journal's tail only, without a run record.

This is what makes the reaper safe: after a viewer leaves nothing appends to the event log,
so the log cannot say whether the agent finished; the journal keeps growing and ends with
the supervisor's exit sentinel once it did. The probe reads only the end of the journal and
never drives the run, writes, or closes anything.

Where a run's journal is comes from a small mapping its starter records (the Runner keeps it
as ``record.journal``; :func:`locate_journal` reads it):

- ``dir``: the host-private directory holding the run's journal files
  (:class:`corral.journal._layout.JournalPaths`, named after the run id);
- ``nonce``: the run's sentinel nonce (32 lowercase hex characters).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import anyio.to_thread

from corral._errors import CorralError
from corral.journal._layout import JournalPaths
from corral.journal._reader import probe_journal_tail
from corral.journal._sentinel import normalize_nonce

__all__ = ["JournalLocationError", "ProbeResult", "locate_journal", "probe_exit"]


class JournalLocationError(CorralError):
    """A run does not say where its journal is (or says it malformed)."""


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """What an out-of-band look at a run's journal learned.

    Three states, not a boolean: "could not tell" must not read as "still working" (only
    one of them is something an operator should see), and never as "finished". A fourth,
    ``not-started``, is for a run whose starter provably died before it launched the
    agent: there is nothing to wait for, the run is claimed and ended like a finished one
    (its drive, under the claim, decides how).
    """

    state: Literal["finished", "producing", "unknown", "not-started"]
    exit_code: int | None = None
    error: str | None = None

    @classmethod
    def finished(cls, exit_code: int) -> ProbeResult:
        return cls("finished", exit_code=exit_code)

    @classmethod
    def producing(cls) -> ProbeResult:
        return cls("producing")

    @classmethod
    def unknown(cls, error: str) -> ProbeResult:
        return cls("unknown", error=error)

    @classmethod
    def not_started(cls, reason: str) -> ProbeResult:
        return cls("not-started", error=reason)


def locate_journal(info: Mapping[str, Any] | None, run_id: str) -> tuple[JournalPaths, str]:
    """The journal paths and nonce of run ``run_id`` from its journal mapping (keys
    ``dir``, ``nonce``). Raises :class:`JournalLocationError` naming what is missing."""
    if info is None:
        raise JournalLocationError(
            f"run {run_id!r} has no journal in its record; it was not started as a "
            "durable run, so nobody can tell whether its agent finished"
        )
    directory = info.get("dir")
    nonce = info.get("nonce")
    if not isinstance(directory, str) or not directory or not os.path.isabs(directory):
        raise JournalLocationError(
            f"run {run_id!r}: journal.dir must be an absolute directory path, "
            f"got {directory!r}"
        )
    if not isinstance(nonce, str):
        raise JournalLocationError(f"run {run_id!r}: journal.nonce is missing")
    try:
        normalize_nonce(nonce)
    except ValueError as exc:
        raise JournalLocationError(f"run {run_id!r}: journal.nonce: {exc}") from None
    return JournalPaths.for_run(directory, run_id), nonce


async def probe_exit(
    paths: JournalPaths,
    nonce: str,
    *,
    max_bytes: int = 65536,
    recent: float = 30.0,
) -> ProbeResult:
    """``finished`` with the agent's exit code when the journal ends with its exit
    sentinel; ``producing`` while the supervisor is alive or the journal changed within
    ``recent`` seconds; otherwise ``unknown`` with the reason. Any failure is ``unknown``,
    never ``finished``; it never raises.
    """
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
