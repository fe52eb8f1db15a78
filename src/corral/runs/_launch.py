"""Starting a run's agent (its request checked: :mod:`corral.runs._plan`): log the start
batch (with the prompt: :data:`PROMPT_EVENT`), make the sandbox, record the file events'
baseline, and launch the supervised agent (a command, or an agent CLI started with its
services daemon: :func:`corral.agents._start.start_agent`) at the run's agent site; or
record why the start failed (:func:`fail_start`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import anyio
import anyio.to_thread
from ag_ui.core import CustomEvent, RunStartedEvent

from corral._log import library_logger
from corral.agents._prepare import with_agent_binds
from corral.agents._start import start_agent
from corral.harness._base import RunContext
from corral.harness._cli_base import CliHarness
from corral.harness._events import event_to_dict
from corral.journal._layout import JournalPaths
from corral.journal._prune import delete_journal
from corral.runs._file_feed import file_baseline
from corral.runs._pipe import PipeStore, Produced, pipe_to_run_log
from corral.runs._plan import StartPlan
from corral.runs._request import RunRequest, RunStartError
from corral.runs._session_lost import announce_lost, expected_session
from corral.runs._site import AgentSite, SupervisedCommand
from corral.sandbox._ensure import Ensured
from corral.sandbox._key import RunContext as SandboxContext
from corral.stores._protocols import Store
from corral.stores._records import RunPatch

__all__ = ["PROMPT_EVENT", "fail_start", "launch_run", "with_prompt"]

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


PROMPT_EVENT = "corral.prompt"
"""The CUSTOM event after an agent run's ``RUN_STARTED``: ``{"prompt": text}``, the prompt
that started the run, so a viewer shows the conversation from the log alone. (Not AG-UI's
``RUN_STARTED.input``: AG-UI clients add its messages to their own by id, and the client
that started a run already holds its prompt under an id corral never sees.)"""


def with_prompt(start: list[Any], request: RunRequest) -> list[Any]:
    """The start batch of a run, with its prompt (:data:`PROMPT_EVENT`) after
    ``RUN_STARTED``."""
    if request.prompt is None:
        return start
    at = 1 if start and isinstance(start[0], RunStartedEvent) else len(start)
    return [*start[:at], CustomEvent(name=PROMPT_EVENT, value={"prompt": request.prompt}),
            *start[at:]]


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
    """Start an agent CLI in the sandbox with its model proxy as a detached daemon (so the
    run keeps its model when no process drives it), launch it supervised, and record what
    a successor needs to finish the run."""
    sandbox, request = plan.sandbox, plan.request
    instructions = sandbox.workspace.instructions
    redactor = ensured.redactor  # the sandbox's secrets, and the run's tokens
    # the session the thread's conversation is in, by its history: a store without it
    # makes this turn a new conversation, which the run must say (or fail, if asked)
    expected, refused = await expected_session(store, thread_id, run_id, harness.name)
    paths = site.paths
    state = await site.services_watch()  # what the services daemon stops with
    started = await start_agent(
        harness, ensured.handle, plan.agent_request, store=store, thread_id=thread_id,
        run_id=run_id, journal=paths, watch=state, redactor=redactor,
        secrets_env=ensured.secrets.env(), host_tools=plan.tools is not None,
        instructions=instructions if isinstance(instructions, str) else None,
        # an allowlist: the agent's only way out is the egress proxy (the sandbox has no
        # network of its own); the services daemon serves it next to the model proxy
        egress=list(sandbox.policy.allow_hosts) if sandbox.policy.allow_hosts else None,
        budget=request.token_budget, timeout=request.timeout,
        expected_session=expected, refused_session=refused,
        on_session_lost=request.on_session_lost)
    prepared, tools = started.prepared, started.prepared.host_tools
    try:  # the daemon runs now: a start that fails from here on stops it
        if prepared.session_lost is not None:
            await announce_lost(store, run_id, prepared.session_lost, epoch)
        plan.spec = plan.spec.with_agent(
            resumed_session=prepared.resumed.session_id if prepared.resumed else None,
            sockets=[str(p) for p in (prepared.model_socket, prepared.egress_socket,
                                      tools.socket if tools else None) if p],
            own_net_dir=str(prepared.own_net_dir) if prepared.own_net_dir else None,
            # where a driver serves the host tools (the token is derived, never stored)
            tools_socket=str(tools.socket) if tools else None,
            # what a driver needs to restart a dead services daemon (no key in it)
            services=started.services_job,
        )
        await store.update(run_id, RunPatch(spec=plan.spec.to_json()))
        cmd = prepared.command
        pid = await site.launch(SupervisedCommand(
            cmd.argv, cmd.env, cmd.cwd, cmd.stdin, cmd.timeout, request.max_output,
            redactor.table(), host_job=started.host_job))  # an ACP run's bridge
    except BaseException:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(started.pending.abandon)
        raise
    services = await anyio.to_thread.run_sync(started.pending.ready)
    plan.spec = plan.spec.with_agent(services_pid=services.pid)
    await store.update(run_id, RunPatch(spec=plan.spec.to_json()))
    return pid
