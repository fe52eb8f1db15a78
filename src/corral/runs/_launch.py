"""Starting a run's agent: check the request before anything is recorded, record the file
events' baseline, and launch the supervised agent (a command, or an agent CLI with its
services daemon) in the run's sandbox."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import anyio
import anyio.to_thread
from ag_ui.core import CustomEvent, RunStartedEvent

from corral._errors import ConfigError, CorralError
from corral._log import library_logger
from corral.agents._prepare import agent_prerequisites, prepare_agent, with_agent_binds
from corral.agents._services import PendingServices, run_proxy_token
from corral.harness._base import AgentCommand, AgentRequest, Harness, RunContext
from corral.harness._cli_base import CliHarness
from corral.harness._events import event_to_dict
from corral.harness._registry import build_harness
from corral.journal._layout import JournalPaths, encode_run_id
from corral.journal._supervisor import AgentSpec, SupervisedRun, launch_supervised_async
from corral.runs._inside import agent_state, mark_agent_state
from corral.runs._file_feed import HostTreeBaseline, save_manifest, scan_manifest
from corral.runs._pipe import PipeStore, Produced, pipe_to_run_log
from corral.runs._request import RunRequest, RunStartError
from corral.runs._spec import RunSpec
from corral.sandbox._contracts import Handle, HostPaths, Provider, UnsupportedCapability
from corral.sandbox._definition import Sandbox
from corral.sandbox._ensure import Ensured
from corral.sandbox._inside import InsideSupervisor
from corral.sandbox._key import RunContext as SandboxContext
from corral.sandbox._watch import GitBaseline
from corral.stores._protocols import Store
from corral.stores._records import RunPatch
from corral.tools._core import Toolset
from corral.tools._projection import TOKEN_ENV as TOOLS_TOKEN_NAME
from corral.tools._projection import run_tools_token

__all__ = ["StartPlan", "fail_start", "file_baseline", "launch_run", "plan_start"]

log = library_logger("corral.runs._runner")


@dataclass(slots=True)
class StartPlan:
    """A checked request: what :meth:`corral.runs.Runner.start` records and launches."""

    request: RunRequest
    sandbox: Sandbox
    spec: RunSpec
    harness: Harness
    agent_request: AgentRequest
    provider: Provider
    tools: Toolset | None
    """The host tools the run's drivers serve (agent CLIs only; ``None``: no tool server)."""
    command: AgentCommand | None
    """The command harness's agent command (``None`` for an agent CLI)."""
    ensured: Ensured | None = None
    """The run's sandbox, once made."""


def plan_start(request: RunRequest, default_tools: Toolset | None) -> StartPlan:
    """Check ``request`` before anything is recorded (a missing CLI or key, a prompt-less
    agent run, a provider that cannot host a supervised agent are the user's to fix):
    raises :class:`ConfigError`."""
    sandbox = request.definition()
    spec = request.spec(sandbox)
    harness = build_harness(request.harness, spec.harness_config())
    agent_request = AgentRequest(
        prompt=request.prompt, env=dict(request.env), options=request.options
    )
    tools = request.tools if request.tools is not None else default_tools
    # where the agent runs first: what it cannot host is the clearest error
    provider = sandbox.get_provider()
    caps = provider.capabilities
    hosts_runs = caps.host_processes or caps.supervisor_inside
    if hosts_runs and provider.host_route == "none" and isinstance(harness, CliHarness):
        raise ConfigError(
            f"agent runs need corral's host services (model proxy, host tools), which cannot "
            f"reach the {provider.name} provider's sandboxes from this host (e.g. a remote "
            f"Docker daemon); command runs work (corral run --provider {provider.name} -- CMD)")
    if isinstance(harness, CliHarness) and harness.bridged and caps.supervisor_inside:
        what = "--harness acp" if harness.name == "acp" else (
            f"--harness {harness.name} with this policy (its ask rules are answered through "
            f"the agent's ACP mode)")
        raise ConfigError(
            f"{what} needs corral's ACP bridge on the host next to the supervisor, and the "
            f"{provider.name} provider runs the supervisor in the sandbox; use --provider "
            "bubblewrap or local" + ("" if harness.name == "acp" else
                                     ", or allow/deny rules only"))
    if not hosts_runs:
        raise ConfigError(
            f"provider {provider.name!r} cannot host a supervised agent yet; "
            "use --provider bubblewrap or local"
        )
    command = None
    if request.tools is not None and not isinstance(harness, CliHarness):
        raise ConfigError("host tools need an agent-CLI harness (claude-code, codex, "
                          f"gemini-cli, opencode); the {harness.name} harness cannot call them")
    if isinstance(harness, CliHarness):
        agent_prerequisites(harness)
        if not (request.prompt or "").strip():
            raise ConfigError(f"the {harness.name} harness needs a non-empty prompt")
        if tools is None and (harness.policy_mapping.permission_prompt
                              or spec.frontend_tools
                              or (spec.output_schema is not None
                                  and not harness.native_output)):
            # the server is needed for the permission prompt, a client's tools or the
            # submit_result tool alone
            tools = Toolset()
    else:
        command = harness.build_command(agent_request)
        tools = None
    return StartPlan(request, sandbox, spec, harness, agent_request, provider, tools, command)


async def file_baseline(handle: Handle, paths: JournalPaths, *, diff: bool) -> dict[str, Any]:
    """Record the workspace as the agent finds it: a manifest next to the journal (for the
    catch-up of unwatched changes) and, for diffs, a git baseline commit."""
    if not isinstance(handle, HostPaths):
        raise UnsupportedCapability(handle.ref.provider, "file events",
                                    "file_events needs a host-directory provider")
    root = handle.host_path(handle.workdir)
    manifest = await anyio.to_thread.run_sync(scan_manifest, root)
    await anyio.to_thread.run_sync(save_manifest, paths.files, manifest)
    base = (await GitBaseline.capture(handle)).base if diff else None
    out: dict[str, Any] = {"diff": diff, "baseline": base}
    if diff and base is None:
        # no git repository in the workspace: a baseline tree of the host's own
        tree = await HostTreeBaseline.create(handle, paths.baseline_git, root)
        if tree is not None:
            out["tree"] = [str(paths.baseline_git), tree.base]
    return out


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


async def launch_run(plan: StartPlan, store: Store, run_id: str, thread_id: str,
                     paths: JournalPaths, nonce: str, epoch: int) -> None:
    """Under the run's first claim (``epoch``): log the harness's start batch, make the
    sandbox (``plan.ensured``: a failure after it must destroy it), record the file events'
    baseline, launch the agent."""
    sandbox, provider = plan.sandbox, plan.provider
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
        plan.spec = plan.spec.model_copy(update={"files": files})
        await store.update(run_id, RunPatch(spec=plan.spec.to_json()))
    launched = await _launch_agent(plan, ensured, store, run_id, thread_id, paths, nonce)
    log.info("run %s: agent started (supervisor pid %d)", run_id, launched.supervisor_pid)


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


async def _launch_agent(plan: StartPlan, ensured: Ensured, store: Store, run_id: str,
                        thread_id: str, paths: JournalPaths, nonce: str) -> SupervisedRun:
    """Launch the run's agent supervised in its sandbox (``plan.spec`` as recorded so
    far); an agent CLI's runtime is recorded in the spec for its successors."""
    request = plan.request
    if isinstance(plan.harness, CliHarness):
        return await _launch_cli_agent(plan, plan.harness, ensured, store, run_id, thread_id,
                                       paths, nonce)
    agent = plan.command
    assert agent is not None  # plan_start built it for every non-CLI harness
    handle = ensured.handle
    if handle.capabilities.supervisor_inside and isinstance(handle, InsideSupervisor):
        # the supervisor runs inside the sandbox; its journal is read through the API
        pid = await handle.launch_supervised(
            encode_run_id(run_id), argv=agent.argv, env=ensured.exec_env(agent.env),
            cwd=agent.cwd, nonce=nonce, stdin=agent.stdin, timeout=request.timeout,
            max_output=request.max_output, redact=ensured.redactor.table())
        return SupervisedRun(paths, pid, None)
    # Secrets reach the agent only here: through the supervisor's pipe into the agent's
    # environment; never the store, the journal or a file.
    host = ensured.handle.host_command(agent.argv, cwd=agent.cwd,
                                       env=ensured.exec_env(agent.env))
    return await launch_supervised_async(
        AgentSpec(argv=host.argv, env=host.env, cwd=host.cwd, stdin=agent.stdin,
                  redact=ensured.redactor.table(), stdin_prefix=host.stdin_prefix,
                  timeout=request.timeout, max_output=request.max_output),
        paths, nonce,
    )


async def _launch_cli_agent(plan: StartPlan, harness: CliHarness, ensured: Ensured,
                            store: Store, run_id: str, thread_id: str,
                            paths: JournalPaths, nonce: str) -> SupervisedRun:
    """Prepare an agent CLI in the sandbox, start its model proxy as a detached daemon
    (so the run keeps its model when no process drives it), launch it supervised, and
    record what a successor needs to finish the run."""
    sandbox, request = plan.sandbox, plan.request
    instructions = sandbox.workspace.instructions
    # derived from corral's key, so any driver of the run (any host) serves with this token
    tools_token = await run_tools_token(store, run_id) if plan.tools is not None else None
    proxy_token = await run_proxy_token(store, run_id)
    redactor = ensured.redactor  # the sandbox's secrets, and the run's tokens below
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
    )
    # The sandbox's secrets join the agent's environment (as for any agent), under the
    # CLI's own variables: a secret never replaces the placeholder key or the endpoint.
    prepared.command = replace(
        prepared.command, env={**ensured.secrets.env(), **prepared.command.env}
    )
    tools_socket = prepared.host_tools.socket if prepared.host_tools else None
    if tools_token is not None:
        redactor.add(TOOLS_TOKEN_NAME, tools_token)
    handle = ensured.handle
    inside = handle.capabilities.supervisor_inside and isinstance(handle, InsideSupervisor)
    # the supervisor's status lives in the sandbox: the services daemon watches this host's
    # note of it instead (corral.runs._inside.agent_state)
    state = agent_state(paths) if inside else None
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
    if inside:
        await anyio.to_thread.run_sync(mark_agent_state, paths, "running")
    pending = await prepared.start_services(paths, state)
    try:
        if inside:
            assert isinstance(handle, InsideSupervisor)
            cmd = prepared.command
            pid = await handle.launch_supervised(
                encode_run_id(run_id), argv=cmd.argv, env=cmd.env, cwd=cmd.cwd, nonce=nonce,
                stdin=cmd.stdin, timeout=cmd.timeout, max_output=request.max_output,
                redact=redactor.table())
            launched = SupervisedRun(paths, pid, None)
        else:
            launched = await launch_supervised_async(
                replace(prepared.agent_spec(), redact=redactor.table(),
                        max_output=request.max_output), paths, nonce
            )
    except BaseException:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(lambda: _stop_pending(pending))
        raise
    services = await anyio.to_thread.run_sync(pending.ready)
    plan.spec = plan.spec.with_agent(services_pid=services.pid)
    await store.update(run_id, RunPatch(spec=plan.spec.to_json()))
    return launched


def _stop_pending(pending: PendingServices) -> None:
    """Stop a services daemon whose agent never started (it would wait for a minute)."""
    try:
        services = pending.ready(10.0)
    except CorralError:
        return
    with contextlib.suppress(OSError):
        os.kill(services.pid, signal.SIGTERM)
