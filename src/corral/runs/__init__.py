"""Durable runs: the :class:`Runner` (start, drive, attach, cancel, reap) and what it is
made of — the run spec, claims, the pipe into the event log, the reaper and reclaim. The
store's records are in :mod:`corral.stores`, its protocols in :mod:`corral.abc`."""

from __future__ import annotations

from corral._lazy import TYPE_CHECKING, lazy_namespace

# The public names, listed once: resolved on first use (corral._lazy)
if TYPE_CHECKING or not lazy_namespace(globals()):
    from corral.runs._claims import (
        HeldClaim as HeldClaim,
        hold_claim as hold_claim,
    )
    from corral.runs._file_feed import (
        FILE_DIFF_EVENT as FILE_DIFF_EVENT,
        FILE_EVENT as FILE_EVENT,
    )
    from corral.runs._pipe import (
        PipeResult as PipeResult,
        ProducerExit as ProducerExit,
        pipe_to_run_log as pipe_to_run_log,
    )
    from corral.runs._run_probe import (
        JournalLocationError as JournalLocationError,
        journal_location as journal_location,
        probe_run_exit as probe_run_exit,
    )
    from corral.journal._prune import PruneResult as PruneResult
    from corral.runs._reap_runner import prune_journals as prune_journals
    from corral.runs._quiesce import (
        LogNeverQuiet as LogNeverQuiet,
        await_log_quiet as await_log_quiet,
    )
    from corral.journal._exit_probe import ProbeResult as ProbeResult
    from corral.runs._reap_sweep import (
        ReapEntry as ReapEntry,
        ReapOutcome as ReapOutcome,
        ReapResult as ReapResult,
        reap_detached_runs as reap_detached_runs,
    )
    from corral.runs._produce import AgentNeverStarted as AgentNeverStarted
    from corral.runs._reclaim import (
        ReclaimOutcome as ReclaimOutcome,
        SandboxReclaimFailedError as SandboxReclaimFailedError,
        reclaim_sandbox as reclaim_sandbox,
        sandbox_reclaimer as sandbox_reclaimer,
    )
    from corral.runs._request import (
        DriveResult as DriveResult,
        RunRequest as RunRequest,
        RunStartError as RunStartError,
    )
    from corral.runs._runner import Runner as Runner
    from corral.runs._spec import (
        SPEC_VERSION as SPEC_VERSION,
        RunSpec as RunSpec,
    )
    from corral.runs._threads import (
        ThreadBusy as ThreadBusy,
        ThreadDetail as ThreadDetail,
        ThreadError as ThreadError,
        ThreadSummary as ThreadSummary,
        Threads as Threads,
        UnknownThread as UnknownThread,
    )
