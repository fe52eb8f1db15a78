"""Durable runs: the :class:`Runner` (start, drive, attach, cancel, reap) and what it is
made of — the run spec, claims, the pipe into the event log, the reaper and reclaim. The
store protocols and records are re-exported from :mod:`corral.stores`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral._lazy import lazy_exports

if TYPE_CHECKING:
    from corral.runs._claims import HeldClaim, hold_claim
    from corral.runs._file_feed import FILE_DIFF_EVENT, FILE_EVENT
    from corral.runs._pipe import PipeResult, ProducerExit, pipe_to_run_log
    from corral.runs._probe import JournalLocationError, journal_location, probe_run_exit
    from corral.runs._prune import PruneResult, prune_journals
    from corral.runs._quiesce import LogNeverQuiet, await_log_quiet
    from corral.journal._probe import ProbeResult
    from corral.runs._reap import (
        ReapEntry,
        ReapOutcome,
        ReapResult,
        reap_detached_runs,
    )
    from corral.runs._produce import AgentNeverStarted
    from corral.runs._reclaim import (
        ReclaimOutcome,
        SandboxReclaimFailedError,
        reclaim_sandbox,
        sandbox_reclaimer,
    )
    from corral.runs._request import DriveResult, RunRequest, RunStartError
    from corral.runs._runner import Runner
    from corral.runs._spec import SPEC_VERSION, RunSpec
    from corral.runs._threads import (
        ThreadBusy,
        ThreadDetail,
        ThreadError,
        ThreadSummary,
        Threads,
        UnknownThread,
    )

# Names resolve on first use (corral._lazy).
_EXPORTS: dict[str, str] = {
    "HeldClaim": "corral.runs._claims",
    "hold_claim": "corral.runs._claims",
    "FILE_DIFF_EVENT": "corral.runs._file_feed",
    "FILE_EVENT": "corral.runs._file_feed",
    "PipeResult": "corral.runs._pipe",
    "ProducerExit": "corral.runs._pipe",
    "pipe_to_run_log": "corral.runs._pipe",
    "JournalLocationError": "corral.runs._probe",
    "journal_location": "corral.runs._probe",
    "probe_run_exit": "corral.runs._probe",
    "PruneResult": "corral.runs._prune",
    "prune_journals": "corral.runs._prune",
    "LogNeverQuiet": "corral.runs._quiesce",
    "await_log_quiet": "corral.runs._quiesce",
    "ProbeResult": "corral.journal._probe",
    "ReapEntry": "corral.runs._reap",
    "ReapOutcome": "corral.runs._reap",
    "ReapResult": "corral.runs._reap",
    "reap_detached_runs": "corral.runs._reap",
    "AgentNeverStarted": "corral.runs._produce",
    "DriveResult": "corral.runs._request",
    "RunRequest": "corral.runs._request",
    "RunStartError": "corral.runs._request",
    "Runner": "corral.runs._runner",
    "SPEC_VERSION": "corral.runs._spec",
    "RunSpec": "corral.runs._spec",
    "ReclaimOutcome": "corral.runs._reclaim",
    "SandboxReclaimFailedError": "corral.runs._reclaim",
    "reclaim_sandbox": "corral.runs._reclaim",
    "sandbox_reclaimer": "corral.runs._reclaim",
    **dict.fromkeys(("ThreadBusy", "ThreadDetail", "ThreadError", "ThreadSummary", "Threads",
                     "UnknownThread"), "corral.runs._threads"),
}


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

__all__ = [
    "FILE_DIFF_EVENT",
    "FILE_EVENT",
    "SPEC_VERSION",
    "AgentNeverStarted",
    "DriveResult",
    "HeldClaim",
    "JournalLocationError",
    "LogNeverQuiet",
    "PipeResult",
    "ProbeResult",
    "ProducerExit",
    "PruneResult",
    "ReapEntry",
    "ReapOutcome",
    "ReapResult",
    "ReclaimOutcome",
    "RunRequest",
    "RunSpec",
    "RunStartError",
    "Runner",
    "SandboxReclaimFailedError",
    "ThreadBusy",
    "ThreadDetail",
    "ThreadError",
    "ThreadSummary",
    "Threads",
    "UnknownThread",
    "await_log_quiet",
    "hold_claim",
    "journal_location",
    "pipe_to_run_log",
    "probe_run_exit",
    "prune_journals",
    "reap_detached_runs",
    "reclaim_sandbox",
    "sandbox_reclaimer",
]
