"""Starting a run's agent (its request checked: :mod:`corral.runs._plan`): log the start
batch, make the sandbox, record the file events' baseline, and launch the supervised agent
(a command, or an agent CLI with its services daemon) at the run's agent site."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import replace

import anyio
import anyio.to_thread

from corral._errors import CorralError
from corral._log import library_logger
from corral.agents._prepare import prepare_agent, with_agent_binds
from corral.agents._services import PendingServices, run_proxy_token
from corral.harness._base import RunContext
from corral.harness._cli_base import CliHarness
from corral.harness._events import event_to_dict
from corral.journal._layout import JournalPaths
from corral.journal._prune import delete_journal
from corral.runs._file_feed import file_baseline
from corral.runs._pipe import PipeStore, Produced, pipe_to_run_log
from corral.runs._plan import StartPlan, with_prompt
from corral.runs._request import RunStartError
from corral.runs._session_lost import announce_lost, expected_session
from corral.runs._site import AgentSite, SupervisedCommand
from corral.sandbox._ensure import Ensured
from corral.sandbox._key import RunContext as SandboxContext
from corral.stores._protocols import Store
from corral.stores._records import RunPatch
from corral.tools._projection import TOKEN_ENV as TOOLS_TOKEN_NAME
from corral.tools._projection import run_tools_token

__all__ = ["fail_start", "launch_run"]

log = library_logger("corral.runs._runner")


async def launch_run(plan: StartPlan, store: Store, run_id: str, thread_id: str,
                     paths: JournalPaths, nonce: str, epoch: int) -> None:
    """Under the run's first claim (``epoch``): log the harness's start batch, make the
    sandbox (``plan.ensured``: a failure after it must destroy it), record the file events'
    baseline, launch the agent."""
    sandbox, provider = plan.sandbox, plan.provider
    if any(p.exists() for p in paths.all()):
        # a journal of an earlier run with this id, deleted from the store since (corral
        # threads rm --runs on this host deletes it too; another host's is left): this run
        # must not read it as its own
        failed = delete_journal(paths)
        if failed:
            raise RunStartError(f"a stale journal of an earlier run {run_id!r} is in the "
                                f"way and could not be deleted: {failed}")
    start = with_prompt(plan.harness.translator(RunContext(run_id, thread_id)).start(),
                        plan.request)
    if start:
        await store.append(run_id, [(event_to_dict(e), 0) for e in start], epoch=epoch)
    cli = isinstance(plan.harness, CliHarness)
    plan.ensured = ensured = await sandbox.ensure(
        SandboxContext(thread_id=thread_id, run_id=run_id),
        store=store,
        # agent CLIs need their install and the model proxy's socket directory; a thread's
        # sandbox gets them whatever runs first, since an agent run of the thread may come
        # next
        # (not where the host's paths mean nothing: a remote daemon)
        spec_hook=with_agent_binds if provider.capabilities.isolated
        and provider.host_route != "none"
        and (cli or sandbox.lifecycle.reuse == "thread") else None,
    )
    handle = ensured.handle
    await store.update(run_id, RunPatch(
        sandbox_key=ensured.key, sandbox_ref={"provider": provider.name, "id": handle.id}))
    if sandbox.file_events:
        # before the agent starts: what its changes are measured against
        files = await file_baseline(handle, paths, diff=sandbox.file_events == "diff")
        plan.spec = replace(plan.spec, files=files)
        await store.update(run_id, RunPatch(spec=plan.spec.to_json()))
    plan.site = site = plan.placement.started(handle, run_id, paths, nonce, lambda _: provider)
    pid = await _launch_agent(plan, ensured, site, store, run_id, thread_id, epoch)
    log.info("run %s: agent started (supervisor pid %d)", run_id, pid)


async def fail_start(plan: StartPlan, store: PipeStore, run_id: str, epoch: int,
                     exc: BaseException) -> None:
    """Record the run as failed (its log ends with a ``RUN_ERROR`` saying why, redacted)."""
    message = (plan.sandbox.secrets.redactor().redact(str(exc))
               if isinstance(exc, Exception) else "")

    code = getattr(exc, "code", None)

    async def failing() -> AsyncIterator[Produced]:
        raise RunStartError(message or "the start was interrupted",
                            code if isinstance(code, str) else None)
        yield  # pragma: no cover

    await pipe_to_run_log(store, run_id, failing(), epoch=epoch)


async def _launch_agent(plan: StartPlan, ensured: Ensured, site: AgentSite, store: Store,
                        run_id: str, thread_id: str, epoch: int) -> int:
    """Launch the run's agent supervised at its site (``plan.spec`` as recorded so far); an
    agent CLI's runtime is recorded in the spec for its successors."""
    if isinstance(plan.harness, CliHarness):
        return await _launch_cli_agent(plan, plan.harness, ensured, site, store, run_id,
                                       thread_id, epoch)
    agent, request = plan.command, plan.request
    assert agent is not None  # plan_start built it for every non-CLI harness
    # Secrets reach the agent only here: through the supervisor into the agent's
    # environment; never the store, the journal or a file.
    return await site.launch(SupervisedCommand(
        agent.argv, ensured.exec_env(agent.env), agent.cwd, agent.stdin, request.timeout,
        request.max_output, ensured.redactor.table()))


async def _launch_cli_agent(plan: StartPlan, harness: CliHarness, ensured: Ensured,
                            site: AgentSite, store: Store, run_id: str, thread_id: str,
                            epoch: int) -> int:
    """Prepare an agent CLI in the sandbox, start its model proxy as a detached daemon
    (so the run keeps its model when no process drives it), launch it supervised, and
    record what a successor needs to finish the run."""
    sandbox, request = plan.sandbox, plan.request
    instructions = sandbox.workspace.instructions
    # derived from corral's key, so any driver of the run (any host) serves with this token
    tools_token = await run_tools_token(store, run_id) if plan.tools is not None else None
    proxy_token = await run_proxy_token(store, run_id)
    redactor = ensured.redactor  # the sandbox's secrets, and the run's tokens below
    # the session the thread's conversation is in, by its history: a store without it
    # makes this turn a new conversation, which the run must say (or fail, if asked)
    expected, refused = await expected_session(store, thread_id, run_id, harness.name)
    prepared = await prepare_agent(
        harness, ensured.handle, plan.agent_request, thread_id=thread_id, run_id=run_id,
        instructions=instructions if isinstance(instructions, str) else None,
        # an allowlist: the agent's only way out is the egress proxy (the sandbox has no
        # network of its own); the services daemon serves it next to the model proxy
        egress=list(sandbox.policy.allow_hosts) if sandbox.policy.allow_hosts else None,
        host_tools=plan.tools is not None,
        tools_token=tools_token,
        proxy_token=proxy_token,
        # the run's tokens are secrets of the run: the journal redacts them too
        redactor=redactor,
        budget=request.token_budget,
        timeout=request.timeout,
        # the thread's CLI session: restored from the store, whichever host saved it
        sessions=store,
        expected_session=expected,
        refused_session=refused,
        on_session_lost=request.on_session_lost,
    )
    if prepared.session_lost is not None:
        await announce_lost(store, run_id, prepared.session_lost, epoch)
    # The sandbox's secrets join the agent's environment (as for any agent), under the
    # CLI's own variables: a secret never replaces the placeholder key or the endpoint.
    prepared.command = replace(
        prepared.command, env={**ensured.secrets.env(), **prepared.command.env}
    )
    tools_socket = prepared.host_tools.socket if prepared.host_tools else None
    if tools_token is not None:
        redactor.add(TOOLS_TOKEN_NAME, tools_token)
    paths = site.paths
    state = await site.services_watch()  # what the services daemon stops with
    plan.spec = plan.spec.with_agent(
        resumed_session=prepared.resumed.session_id if prepared.resumed else None,
        sockets=[str(p) for p in (prepared.model_socket, prepared.egress_socket,
                                  tools_socket) if p],
        own_net_dir=str(prepared.own_net_dir) if prepared.own_net_dir else None,
        # where a driver serves the host tools (the token is derived, never stored)
        tools_socket=str(tools_socket) if tools_socket else None,
        # what a driver needs to restart a dead services daemon (no key in it)
        services=prepared.services_job(paths, state),
    )
    await store.update(run_id, RunPatch(spec=plan.spec.to_json()))
    pending = await prepared.start_services(paths, state)
    cmd = prepared.command
    try:
        pid = await site.launch(SupervisedCommand(
            cmd.argv, cmd.env, cmd.cwd, cmd.stdin, cmd.timeout, request.max_output,
            redactor.table(),
            # an ACP run's bridge: a host process beside the supervisor
            host_job=prepared.agent_spec() if prepared.bridge is not None else None))
    except BaseException:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(lambda: _stop_pending(pending))
        raise
    services = await anyio.to_thread.run_sync(pending.ready)
    plan.spec = plan.spec.with_agent(services_pid=services.pid)
    await store.update(run_id, RunPatch(spec=plan.spec.to_json()))
    return pid


def _stop_pending(pending: PendingServices) -> None:
    """Stop a services daemon whose agent never started (it would wait for a minute)."""
    try:
        services = pending.ready(10.0)
    except CorralError:
        return
    with contextlib.suppress(OSError):
        os.kill(services.pid, signal.SIGTERM)
