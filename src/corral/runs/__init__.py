"""Durable runs: records, store protocols, claims and the pipe into the event log."""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral._lazy import lazy_exports

if TYPE_CHECKING:
    from corral.runs.claims import HeldClaim, hold_claim
    from corral.runs.file_feed import FILE_DIFF_EVENT, FILE_EVENT
    from corral.runs.pipe import PipeResult, ProducerExit, pipe_to_run_log
    from corral.runs.probe import JournalLocationError, journal_location, probe_run_exit
    from corral.runs.prune import PruneResult, prune_journals
    from corral.runs.quiesce import LogNeverQuiet, await_log_quiet
    from corral.runs.reap import (
        ProbeResult,
        ReapEntry,
        ReapOutcome,
        ReapResult,
        reap_detached_runs,
    )
    from corral.runs.reclaim import (
        ReclaimOutcome,
        SandboxReclaimFailedError,
        reclaim_sandbox,
        sandbox_reclaimer,
    )
    from corral.runs.records import UNSET, RunError, RunPatch, RunRecord, RunStatus
    from corral.runs.store import (
        Claim,
        ClaimLost,
        ClaimRefused,
        ClaimStore,
        EventLog,
        InstanceRecord,
        InstanceStore,
        InvalidEvent,
        LockStore,
        LogClosed,
        LoggedEvent,
        LogTail,
        NewRun,
        RefusalReason,
        RunExists,
        RunStore,
        Store,
        StoreError,
        UnknownRun,
    )

# Names resolve on first use (corral._lazy).
_EXPORTS: dict[str, str] = {
    "HeldClaim": "corral.runs.claims",
    "hold_claim": "corral.runs.claims",
    "FILE_DIFF_EVENT": "corral.runs.file_feed",
    "FILE_EVENT": "corral.runs.file_feed",
    "PipeResult": "corral.runs.pipe",
    "ProducerExit": "corral.runs.pipe",
    "pipe_to_run_log": "corral.runs.pipe",
    "JournalLocationError": "corral.runs.probe",
    "journal_location": "corral.runs.probe",
    "probe_run_exit": "corral.runs.probe",
    "PruneResult": "corral.runs.prune",
    "prune_journals": "corral.runs.prune",
    "LogNeverQuiet": "corral.runs.quiesce",
    "await_log_quiet": "corral.runs.quiesce",
    "ProbeResult": "corral.runs.reap",
    "ReapEntry": "corral.runs.reap",
    "ReapOutcome": "corral.runs.reap",
    "ReapResult": "corral.runs.reap",
    "reap_detached_runs": "corral.runs.reap",
    "ReclaimOutcome": "corral.runs.reclaim",
    "SandboxReclaimFailedError": "corral.runs.reclaim",
    "reclaim_sandbox": "corral.runs.reclaim",
    "sandbox_reclaimer": "corral.runs.reclaim",
    "UNSET": "corral.runs.records",
    "RunError": "corral.runs.records",
    "RunPatch": "corral.runs.records",
    "RunRecord": "corral.runs.records",
    "RunStatus": "corral.runs.records",
    "Claim": "corral.runs.store",
    "ClaimLost": "corral.runs.store",
    "ClaimRefused": "corral.runs.store",
    "ClaimStore": "corral.runs.store",
    "EventLog": "corral.runs.store",
    "InstanceRecord": "corral.runs.store",
    "InstanceStore": "corral.runs.store",
    "InvalidEvent": "corral.runs.store",
    "LockStore": "corral.runs.store",
    "LogClosed": "corral.runs.store",
    "LoggedEvent": "corral.runs.store",
    "LogTail": "corral.runs.store",
    "NewRun": "corral.runs.store",
    "RefusalReason": "corral.runs.store",
    "RunExists": "corral.runs.store",
    "RunStore": "corral.runs.store",
    "Store": "corral.runs.store",
    "StoreError": "corral.runs.store",
    "UnknownRun": "corral.runs.store",
}


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

__all__ = [
    "FILE_DIFF_EVENT",
    "FILE_EVENT",
    "UNSET",
    "Claim",
    "ClaimLost",
    "ClaimRefused",
    "ClaimStore",
    "EventLog",
    "HeldClaim",
    "InstanceRecord",
    "InstanceStore",
    "InvalidEvent",
    "JournalLocationError",
    "LockStore",
    "LogClosed",
    "LogNeverQuiet",
    "LogTail",
    "LoggedEvent",
    "NewRun",
    "PipeResult",
    "ProbeResult",
    "ProducerExit",
    "PruneResult",
    "ReapEntry",
    "ReapOutcome",
    "ReapResult",
    "ReclaimOutcome",
    "RefusalReason",
    "RunError",
    "RunExists",
    "RunPatch",
    "RunRecord",
    "RunStatus",
    "RunStore",
    "SandboxReclaimFailedError",
    "Store",
    "StoreError",
    "UnknownRun",
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
