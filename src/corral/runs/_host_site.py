"""The agent site on this host (:class:`HostSite`; providers with ``host_processes``: local,
bubblewrap).

The supervisor is a host process of its own (:mod:`corral.journal._supervisor`) that runs
the agent through the handle's ``host_command``; the journal, its stderr sidecar and the
supervisor's status are files in the runner's journal directory (``record.journal.dir``).
Another machine cannot read them (:meth:`HostSite.check_here`), unless it shares the
directory. Stopping the agent signals its process group from any process of this host.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from corral._paths import corral_home
from corral.journal._layout import JournalPaths, read_status
from corral.journal._exit_probe import ProbeResult, check_here, probe_exit
from corral.journal._supervisor import AgentSpec, kill_supervised_async, launch_supervised_async
from corral.runs._site import ProviderFor, SiteBase, SupervisedCommand, recorded_sandbox
from corral.sandbox._contracts import Handle, SandboxGoneError
from corral.stores._records import RunRecord

__all__ = ["HostSite"]


@dataclass(slots=True)
class HostSite(SiteBase):
    """The run's supervisor is a process of this host (see the module docstring)."""

    RECORD: ClassVar[Mapping[str, Any]] = {}
    HOST_BRIDGE: ClassVar[bool] = True

    handle: Handle | None = field(default=None, repr=False)
    """The sandbox when the run is being started (its ``host_command`` runs the agent)."""
    journal: Mapping[str, Any] | None = field(default=None, repr=False)
    """The record's journal mapping (which machine wrote it)."""

    @classmethod
    def started(cls, handle: Handle, run_id: str, paths: JournalPaths, nonce: str,
                provider_for: ProviderFor) -> HostSite:
        return cls(run_id, paths, nonce, (handle.ref.provider, handle.id), provider_for,
                   handle=handle)

    @classmethod
    def recorded(cls, record: RunRecord, nonce: str, directory: str,
                 journals_dir: Path | None, provider_for: ProviderFor | None) -> HostSite:
        return cls(record.run_id, JournalPaths.for_run(directory, record.run_id), nonce,
                   recorded_sandbox(record), provider_for, record, journal=record.journal)

    def check_here(self) -> None:
        if self.journal is not None:
            check_here(self.journal, self.paths, self.run_id)

    async def launch(self, command: SupervisedCommand) -> int:
        if command.host_job is not None:
            spec = replace(command.host_job, redact=command.redact,
                           max_output=command.max_output)
        else:
            if self.handle is None:
                raise RuntimeError("only a run being started launches its agent")
            host = self.handle.host_command(command.argv, cwd=command.cwd, env=command.env)
            spec = AgentSpec(argv=host.argv, env=host.env, cwd=host.cwd, stdin=command.stdin,
                             redact=command.redact, stdin_prefix=host.stdin_prefix,
                             timeout=command.timeout, max_output=command.max_output)
        launched = await launch_supervised_async(spec, self.paths, self.nonce)
        return launched.supervisor_pid

    async def stop(self, grace: float, *, supervisor: bool = False) -> None:
        await kill_supervised_async(self.paths, grace=grace, include_supervisor=supervisor)

    async def probe(self, *, max_bytes: int = 65536, recent: float = 30.0) -> ProbeResult:
        return await probe_exit(self.paths, self.nonce, max_bytes=max_bytes, recent=recent)

    async def refresh(self) -> bool:
        return False  # the supervisor writes these very files

    async def follow(self) -> None:
        return

    async def gone(self) -> SandboxGoneError | None:
        if os.geteuid() != 0 and self.paths.directory.parent != corral_home(create=False):
            # Not root, a host-side sandbox is reachable from the home that made it only
            # (see corral.providers._bubblewrap's files index): elsewhere, not found means
            # nothing.
            return None
        return await SiteBase.gone(self)

    async def lost(self) -> SandboxGoneError | None:
        return None  # the journal is on this host: the sandbox's end loses none of it

    async def agent_running(self) -> bool:
        status = read_status(self.paths.status)
        return status is not None and status.state == "running"

    async def services_watch(self) -> Path | None:
        return None  # the daemon watches the supervisor's status

    async def note_exited(self) -> None:
        return  # the supervisor's status says it
