"""An agent CLI's start, in one call (:func:`start_agent`): the run's tokens, the agent
prepared in its sandbox (install, the thread's session, host tools, model proxy:
:func:`~corral.agents._prepare.prepare_agent`), and its services daemon started, in that
order. The caller records :attr:`StartedAgent.services_job`, launches
:attr:`StartedAgent.prepared`'s command supervised, then waits for
:attr:`StartedAgent.pending` (the daemon's start-up overlaps the CLI's)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.agents._prepare import PreparedAgent, prepare_agent
from corral.agents._services import (
    PendingServices,
    launch_services,
    run_proxy_token,
    services_job,
)
from corral.harness._base import AgentRequest
from corral.harness._cli_base import CliHarness
from corral.journal._layout import JournalPaths
from corral.journal._supervisor import AgentSpec
from corral.sandbox._contracts import Handle
from corral.sandbox._redact import Redactor
from corral.stores._protocols import Store
from corral.tools._projection import TOKEN_ENV as TOOLS_TOKEN_NAME
from corral.tools._projection import run_tools_token

__all__ = ["StartedAgent", "start_agent"]


@dataclass(frozen=True, slots=True)
class StartedAgent:
    """An agent CLI ready to launch, its services daemon starting."""

    prepared: PreparedAgent
    services_job: dict[str, Any]
    """The daemon's job without its secrets: what a driver needs to restart it."""
    pending: PendingServices
    host_job: AgentSpec | None
    """An ACP run's bridge, a host process beside the supervisor (``None``: none)."""


async def start_agent(
    harness: CliHarness,
    handle: Handle,
    request: AgentRequest,
    *,
    store: Store,
    thread_id: str,
    run_id: str,
    journal: JournalPaths,
    watch: Path | None,
    redactor: Redactor,
    secrets_env: Mapping[str, str],
    host_tools: bool,
    instructions: str | None = None,
    egress: Sequence[str] | None = None,
    budget: int | None = None,
    timeout: float | None = None,
    expected_session: str | None = None,
    refused_session: str | None = None,
    on_session_lost: str = "continue",
) -> StartedAgent:
    """Prepare run ``run_id``'s agent CLI in ``handle`` and start its services daemon
    beside the run's ``journal`` (it stops when ``watch``, default the supervisor's
    status, says the agent exited). The run's tokens derive from corral's key in
    ``store`` (any driver of the run, on any host, derives them again) and join
    ``redactor``; the sandbox's secrets (``secrets_env``) join the agent's environment.
    The rest as for :func:`~corral.agents._prepare.prepare_agent`."""
    proxy_token = await run_proxy_token(store, run_id)
    tools_token = await run_tools_token(store, run_id) if host_tools else None
    if tools_token is not None:
        redactor.add(TOOLS_TOKEN_NAME, tools_token)
    prepared = await prepare_agent(
        harness, handle, request, thread_id=thread_id, run_id=run_id,
        instructions=instructions, egress=egress, host_tools=host_tools,
        tools_token=tools_token, proxy_token=proxy_token, redactor=redactor,
        budget=budget, timeout=timeout, sessions=store, expected_session=expected_session,
        refused_session=refused_session, on_session_lost=on_session_lost)
    # The sandbox's secrets join the agent's environment (as for any agent), under the
    # CLI's own variables: a secret never replaces the placeholder key or the endpoint.
    prepared.command = dataclasses.replace(
        prepared.command, env={**secrets_env, **prepared.command.env})
    host_job = prepared.agent_spec() if prepared.bridge is not None else None
    job = services_job(prepared.model_proxy, prepared.model_socket, prepared.egress_proxy,
                       prepared.egress_socket, watch or journal.status)
    pending = await launch_services(job, prepared.model_proxy, prepared.proxy_token, journal)
    return StartedAgent(prepared, job, pending, host_job)
