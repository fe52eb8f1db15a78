"""The journal: the agent's output on the host, written by the supervisor, read by offset.

Lazy on purpose: the supervisor (``python -m corral.journal._supervisor``) is a fresh
interpreter per run and imports only what it needs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral._lazy import lazy_exports

if TYPE_CHECKING:
    from corral.journal._layout import JournalPaths
    from corral.journal._reader import (
        Exit,
        JournalAbandonedError,
        JournalError,
        JournalTamperedError,
        Line,
        Probe,
        probe_journal_tail,
        read_journal,
    )
    from corral.journal._sentinel import new_nonce
    from corral.journal._supervisor import (
        AgentSpec,
        SupervisedRun,
        SupervisorError,
        kill_supervised_async,
        launch_supervised_async,
    )

# Names resolve on first use (corral._lazy).
_EXPORTS: dict[str, str] = {
    "JournalPaths": "corral.journal._layout",
    "Exit": "corral.journal._reader",
    "JournalAbandonedError": "corral.journal._reader",
    "JournalError": "corral.journal._reader",
    "JournalTamperedError": "corral.journal._reader",
    "Line": "corral.journal._reader",
    "Probe": "corral.journal._reader",
    "probe_journal_tail": "corral.journal._reader",
    "read_journal": "corral.journal._reader",
    "new_nonce": "corral.journal._sentinel",
    "AgentSpec": "corral.journal._supervisor",
    "SupervisedRun": "corral.journal._supervisor",
    "SupervisorError": "corral.journal._supervisor",
    "kill_supervised_async": "corral.journal._supervisor",
    "launch_supervised_async": "corral.journal._supervisor",
}

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

__all__ = [
    "AgentSpec",
    "Exit",
    "JournalAbandonedError",
    "JournalError",
    "JournalPaths",
    "JournalTamperedError",
    "Line",
    "Probe",
    "SupervisedRun",
    "SupervisorError",
    "kill_supervised_async",
    "launch_supervised_async",
    "new_nonce",
    "probe_journal_tail",
    "read_journal",
]
