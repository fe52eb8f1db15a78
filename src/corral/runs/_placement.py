"""Where a run's agent lives (its :class:`~corral.runs._site.AgentSite`), decided here and
nowhere else: from the provider's declared capabilities when a run starts
(:func:`placement`), from the run's record everywhere else (:func:`site_of`), which says
what the start chose (``AgentSite.RECORD``). A new substrate whose supervisor runs inside
its sandbox (Kubernetes, a VM, a remote host) declares ``supervisor_inside`` and gives
handles that are :class:`~corral.sandbox._inside.InsideSupervisor`s: nothing in ``runs/``
changes."""

from __future__ import annotations

from pathlib import Path

from corral.journal._exit_probe import journal_entry
from corral.runs._host_site import HostSite
from corral.runs._sandbox_site import SandboxSite
from corral.runs._site import AgentSite, ProviderFor
from corral.sandbox._contracts import Capabilities
from corral.stores._records import RunRecord

__all__ = ["placement", "site_of"]


def placement(capabilities: Capabilities) -> type[AgentSite] | None:
    """The site of a provider's runs (``None``: it cannot host a supervised agent)."""
    return (SandboxSite if capabilities.supervisor_inside
            else HostSite if capabilities.host_processes else None)


def site_of(record: RunRecord, *, journals_dir: Path | None = None,
            provider_for: ProviderFor | None = None) -> AgentSite:
    """The site of a recorded run, as any process of any host sees it (``journals_dir``:
    this host's, default ``$CORRAL_HOME/journals``; ``provider_for``: how to build the
    run's provider, default as its record configured it). Raises
    :class:`~corral.journal._exit_probe.JournalLocationError` when the record names no usable
    journal; whether this host can read it is :meth:`AgentSite.check_here`."""
    directory, nonce = journal_entry(record.journal, record.run_id)
    kind: type[AgentSite] = SandboxSite if (record.journal or {}).get("inside") else HostSite
    return kind.recorded(record, nonce, directory, journals_dir, provider_for)
