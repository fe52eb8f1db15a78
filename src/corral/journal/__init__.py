"""The journal: the agent's output on the host, written by the supervisor, read by offset.

Lazy on purpose: the supervisor (``python -m corral.journal._supervisor``) is a fresh
interpreter per run and imports only what it needs."""

from __future__ import annotations

from corral._lazy import TYPE_CHECKING, lazy_namespace

# The public names, listed once: resolved on first use (corral._lazy)
if TYPE_CHECKING or not lazy_namespace(globals()):
    from corral.journal._layout import JournalPaths as JournalPaths
    from corral.journal._reader import (
        Exit as Exit,
        JournalAbandonedError as JournalAbandonedError,
        JournalError as JournalError,
        JournalTamperedError as JournalTamperedError,
        Line as Line,
        Probe as Probe,
        probe_journal_tail as probe_journal_tail,
        read_journal as read_journal,
    )
    from corral.journal._sentinel import new_nonce as new_nonce
    from corral.journal._supervisor import (
        AgentSpec as AgentSpec,
        SupervisedRun as SupervisedRun,
        SupervisorError as SupervisorError,
        kill_supervised_async as kill_supervised_async,
        launch_supervised_async as launch_supervised_async,
    )
