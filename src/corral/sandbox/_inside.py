"""Optional handle capability: the durable-run supervisor runs inside the sandbox.

Container providers (docker) cannot run a host process in their sandboxes
(``host_processes=False``) and their sandboxes outlive every host: there the supervisor runs
as root inside the sandbox, the agent as the unprivileged user, and the journal, its stderr
sidecar and the supervisor's status live in a root-only directory there. Everything about
the run goes through the provider's API: starting it, reading the journal from an offset
(any host copies it into a local mirror and reads that), the status, stopping the agent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["InsideSupervisor"]


@runtime_checkable
class InsideSupervisor(Protocol):
    """A handle whose sandbox hosts its runs' supervisors (see the module docstring).
    ``run`` is the run's file-name token (``corral.journal._layout.encode_run_id``)."""

    async def launch_supervised(
        self, run: str, *, argv: Sequence[str], env: Mapping[str, str], cwd: str | None,
        nonce: str, stdin: bytes | None, timeout: float | None, max_output: int | None,
        redact: Mapping[str, str],
    ) -> int:
        """Start the supervised agent; return the supervisor's pid inside the sandbox."""
        ...

    async def read_journal(self, run: str, name: str, offset: int,
                           limit: int = 4 << 20) -> bytes | None:
        """Bytes of ``journal`` or ``journal.err`` from ``offset``; ``None`` when the file
        does not exist (the agent was never launched)."""
        ...

    async def supervisor_status(self, run: str) -> Mapping[str, Any]:
        """The supervisor's status (``state`` running|exited, ``code``), ``{}`` if none."""
        ...

    async def stop_supervised(self, run: str, grace: float = 2.0) -> None:
        """SIGTERM the agent, SIGKILL it after ``grace`` s; wait for the exit trailer."""
        ...
