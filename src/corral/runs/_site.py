"""A run's agent site: where its supervised agent lives, behind one interface.

A durable run's agent runs under a supervisor that writes its journal (DESIGN §4). Where
that supervisor lives depends on the provider:

- **on this host** (:class:`~corral.runs._host_site.HostSite`: local, bubblewrap): the
  supervisor is a host process that runs the agent through the handle's ``host_command``;
  its journal and status are files of the runner's journal directory, readable on the host
  that started the run (or one sharing the directory);
- **inside the sandbox** (:class:`~corral.runs._sandbox_site.SandboxSite`: docker, and
  every remote or VM provider after it): the handle is an
  :class:`~corral.sandbox._inside.InsideSupervisor`, and every host copies the journal
  through the provider's API into a mirror of its own.

The rest of ``runs/`` asks the site (:class:`AgentSite`), never where it is: launch a
supervised command, the journal paths this host reads, stop it, probe it, refresh the
mirror. The choice is made once, in :mod:`corral.runs._placement`: from the provider's
capabilities when a run starts, from the run's record everywhere else. The provider kit
(:func:`corral.testing.check_provider`) proves a provider's site launches, probes and
stops a supervised command.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, Self

from corral._errors import CorralError
from corral._log import library_logger
from corral.journal._layout import JournalPaths
from corral.journal._exit_probe import ProbeResult
from corral.journal._supervisor import AgentSpec
from corral.runs._providers import ProviderCache
from corral.sandbox._contracts import Handle, Provider, SandboxGoneError
from corral.stores._records import RunRecord

__all__ = ["AgentSite", "ProviderFor", "SiteBase", "SupervisedCommand", "gone_error",
           "recorded_sandbox"]

log = library_logger("corral.runs._runner")

ProviderFor = Callable[[str], Provider]
"""``provider_for(name)``: the provider a run's record names, built as it recorded."""


@dataclass(frozen=True, slots=True)
class SupervisedCommand:
    """A command a site runs supervised: the in-sandbox argv, its complete environment (a
    run's secrets reach the agent only here, through the supervisor; never the store, the
    journal or a file), cwd and stdin."""

    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    cwd: str | None = None
    stdin: bytes | None = field(default=None, repr=False)
    timeout: float | None = None
    """Seconds the agent may run; then the supervisor (out of its reach) stops it, code 124."""
    max_output: int | None = None
    """Bytes of stdout and stderr together; past it the supervisor stops the agent."""
    redact: Mapping[str, str] = field(default_factory=dict, repr=False)
    """``{secret value or encoding: name}``, replaced in the journal by the supervisor."""
    host_job: AgentSpec | None = field(default=None, repr=False)
    """What a supervisor on this host runs instead of the handle's host command (an ACP
    run's bridge, a host process beside the supervisor); only a site with
    ``HOST_BRIDGE`` runs it."""


class AgentSite(Protocol):
    """Where one run's supervised agent lives (see the module docstring). Built by
    :mod:`corral.runs._placement` only: ``started`` when the run starts, ``recorded``
    from its record in any process of any host."""

    RECORD: ClassVar[Mapping[str, Any]]
    """What the run's record keeps of the site (keys of ``record.journal``)."""
    HOST_BRIDGE: ClassVar[bool]
    """Whether a host process can run beside the supervisor (an ACP run's bridge)."""

    run_id: str
    paths: JournalPaths
    """The journal files this host reads: the supervisor's own, or this host's mirror."""
    nonce: str
    """The run's sentinel nonce (the journal's exit line carries it)."""

    @classmethod
    def started(cls, handle: Handle, run_id: str, paths: JournalPaths, nonce: str,
                provider_for: ProviderFor) -> Self:
        """The site of a run being started in ``handle``'s sandbox."""
        ...

    @classmethod
    def recorded(cls, record: RunRecord, nonce: str, directory: str,
                 journals_dir: Path | None, provider_for: ProviderFor | None) -> Self:
        """The site of a recorded run (``directory``: its ``journal.dir``;
        ``journals_dir``: this host's, default ``$CORRAL_HOME/journals``)."""
        ...

    def check_here(self) -> None:
        """Raise :class:`~corral.journal._exit_probe.JournalUnreachable` when this host cannot
        read the run's journal (it is on another machine)."""
        ...

    async def launch(self, command: SupervisedCommand) -> int:
        """Start the supervised command; return the supervisor's pid (where it runs)."""
        ...

    async def stop(self, grace: float, *, supervisor: bool = False) -> None:
        """SIGTERM the agent, SIGKILL it after ``grace`` s; the supervisor records the exit
        (``supervisor``: a host supervisor is killed too). Nothing when never launched."""
        ...

    async def probe(self, *, max_bytes: int = 65536, recent: float = 30.0) -> ProbeResult:
        """Did the agent exit? (:func:`corral.journal._exit_probe.probe_exit`). Never raises."""
        ...

    async def refresh(self) -> bool:
        """Bring :attr:`paths` up to date (copy what a mirror lacks); return whether the
        sandbox holds a journal (on this host: nothing to copy, ``False``)."""
        ...

    async def follow(self) -> None:
        """Keep :attr:`paths` up to date while a driver follows the journal, until the
        agent's exit is copied or the sandbox is gone (on this host: return at once)."""
        ...

    async def gone(self) -> SandboxGoneError | None:
        """The error of a run whose sandbox its provider says no longer exists; ``None``
        when it exists, or nobody here can tell."""
        ...

    async def lost(self) -> SandboxGoneError | None:
        """:meth:`gone`, when the journal's unread part went with the sandbox (it lived
        there, and this host's copy has no exit); ``None`` otherwise."""
        ...

    async def agent_running(self) -> bool:
        """Whether the agent runs, as this host knows it (an agent CLI's services daemon
        is kept alive while it does)."""
        ...

    async def services_watch(self) -> Path | None:
        """The file an agent CLI's services daemon on this host watches to stop with the
        agent (``None``: the supervisor's status); a note of this host's is marked
        ``running`` now."""
        ...

    async def note_exited(self) -> None:
        """Tell this host's services daemon (if any) that the agent ended."""
        ...


def gone_error(provider: str, sandbox_id: str) -> SandboxGoneError:
    """The error a run whose sandbox vanished under it ends with: it names the provider and
    the sandbox (the docker container's name), never a host path."""
    return SandboxGoneError.of(
        provider, sandbox_id, "it was removed while the run used it, so the agent's "
        "remaining output and its exit status are lost (what was logged is kept)")


@dataclass(slots=True)
class SiteBase:
    """What both sites hold: the run, its journal, its sandbox and how to reach it."""

    run_id: str
    paths: JournalPaths
    nonce: str
    sandbox: tuple[str, str] | None
    """The run's sandbox: ``(provider name, sandbox id)`` (``None``: none recorded)."""
    provider_for: ProviderFor | None = field(default=None, repr=False)
    record: RunRecord | None = field(default=None, repr=False)

    def provider(self, name: str) -> Provider:
        """The provider ``name`` as the run's record configured it."""
        if self.provider_for is None:
            if self.record is None:
                return ProviderCache().get(name)
            self.provider_for = ProviderCache().for_record(self.record)
        return self.provider_for(name)

    async def resume(self) -> Handle | None:
        """The run's sandbox (``None``: it is gone, or none is recorded); raises what the
        provider raises when it cannot tell."""
        if self.sandbox is None:
            return None
        name, sandbox_id = self.sandbox
        return await self.provider(name).resume(sandbox_id)

    async def gone(self) -> SandboxGoneError | None:
        if self.sandbox is None:
            return None
        name, sandbox_id = self.sandbox
        try:
            handle = await self.resume()
        except SandboxGoneError:
            return gone_error(name, sandbox_id)
        except CorralError as exc:
            # e.g. the Docker daemon is unreachable: that is not the sandbox's end
            log.info("run %s: cannot tell whether its sandbox exists: %s", self.run_id, exc)
            return None
        return gone_error(name, sandbox_id) if handle is None else None


def recorded_sandbox(record: RunRecord) -> tuple[str, str] | None:
    """The ``(provider, id)`` of the sandbox the record names, if any."""
    ref = record.sandbox_ref or {}
    name, sandbox_id = ref.get("provider"), ref.get("id")
    if isinstance(name, str) and isinstance(sandbox_id, str):
        return name, sandbox_id
    return None

