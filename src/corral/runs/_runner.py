"""The Runner: start, drive (and take over), watch, detach and cancel durable runs.

One driving path serves every case. ``start`` creates the record, and under a first claim
makes the sandbox, logs the harness's start batch and launches the supervised agent; then it
releases the claim. Whoever wants the run to progress calls :meth:`Runner.drive`: it takes a
claim (breaking the lease of a driver that provably died on this machine, or waiting for a
remote one's lease to lapse), continues translating the journal after the journal offset
stored with the last logged event, and pipes the batches into the fenced log. A foreground
``corral run`` is ``start`` + ``drive``; ``corral attach`` and a takeover are just ``drive``.

Invariants kept here (DESIGN §4):

- every append and every terminal write carries the claim's epoch (the store fences them);
- a batch (the events of one journal item) is appended atomically with its journal offset,
  so a successor neither repeats nor skips events;
- a cancel is recorded in the store first (sticky), then the canceller takes the claim
  (fencing any live driver), stops the agent, destroys the sandbox and ends the log;
- leaving (detach) stops driving between batches without a status or a close, and stamps
  ``detached_since`` unless a cancel is recorded.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from ag_ui.core import BaseEvent

from corral._errors import ConfigError, CorralError
from corral.agents._prepare import (
    agent_prerequisites,
    finish_agent_run,
    prepare_agent,
    with_agent_binds,
)
from corral.harness._base import AgentRequest, Harness, RunContext, translate_run
from corral.harness._cli_base import CliHarness
from corral.harness._events import event_to_dict
from corral.harness._registry import build_harness, harness_for_record
from corral.agents._services import PendingServices
from corral._paths import corral_home
from corral.providers import get_provider
from corral.sandbox._registry import build_provider, config_key
from corral.runs._claims import hold_claim
from corral.journal._reader import JournalError
from corral.journal._layout import JournalPaths, read_status
from corral.runs._owner import driver_gone, new_owner_id, owner_is_dead
from corral.runs._pipe import LogBatch, PipeResult, Produced, pipe_to_run_log
from corral.runs._prune import PruneResult
from corral.runs._reap import ReapResult
from corral.runs._reaping import logged_end
from corral.stores._records import RunPatch, RunRecord
from corral.journal._sentinel import new_nonce
from corral.stores._protocols import (
    ClaimLost,
    ClaimRefused,
    LoggedEvent,
    NewRun,
    RefusalReason,
    Store,
    UnknownRun,
)
from corral.journal._supervisor import (
    AgentSpec,
    kill_supervised_async,
    launch_supervised_async,
    process_alive,
)
from corral.sandbox._contracts import Handle, HostPaths, Provider, UnsupportedCapability
from corral.sandbox._definition import Sandbox
from corral.sandbox._ensure import Ensured, _snapshotter, destroy_record, release
from corral.sandbox._key import RunContext as SandboxContext
from corral.sandbox._lifecycle import Lifecycle
from corral.sandbox._policy import Policy
from corral.sandbox._redact import Redactor
from corral.sandbox._secrets import Secrets
from corral.sandbox._sources import LocalDir
from corral.sandbox._watch import DEFAULT_MAX_WATCHES, check_max_watches

if TYPE_CHECKING:  # the MCP SDK loads only when a run has host tools
    from corral.runs._file_feed import FileFeed
    from corral.tools._core import Toolset

log = logging.getLogger("corral.runs._runner")

DEFAULT_LEASE_TTL = 10.0
DEFAULT_MAX_OUTPUT = 1 << 30
"""A run's default output limit (``RunRequest.max_output``): 1 GiB of journal and stderr."""
_POLL = 0.2
"""How often a waiting driver re-reads the record (takeover of a dead local driver and
noticing a cancel both happen within about this)."""
_SERVICES_CHECK = 0.5
"""How often a driver checks that its run's services daemon is alive."""


class RunStartError(CorralError):
    """The run could not be started; it was recorded as failed with this message."""


def lease_ttl_from_env() -> float:
    """``CORRAL_LEASE_TTL`` in seconds, or the default (10 s)."""
    raw = os.environ.get("CORRAL_LEASE_TTL")
    if not raw:
        return DEFAULT_LEASE_TTL
    try:
        ttl = float(raw)
    except ValueError:
        raise ConfigError(f"CORRAL_LEASE_TTL must be a number of seconds, got {raw!r}") from None
    if not 0.5 <= ttl <= 3600:
        raise ConfigError(f"CORRAL_LEASE_TTL must be between 0.5 and 3600 seconds, got {raw!r}")
    return ttl


def new_run_id() -> str:
    return "run-" + uuid.uuid4().hex[:20]


@dataclass(frozen=True, slots=True)
class RunRequest:
    """What to run. ``command`` is for the ``command`` harness; ``prompt`` for agent CLIs."""

    command: Sequence[str] | None = None
    prompt: str | None = None
    harness: str = "command"
    run_id: str | None = None
    thread_id: str | None = None
    provider: str = "bubblewrap"
    workspace: str | None = None
    """A host directory copied into the sandbox's workspace (when ``sandbox`` is not given,
    or gives no source)."""
    env: Mapping[str, str] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    """Harness options (e.g. ``model``)."""
    sandbox: Sandbox | None = None
    """The sandbox definition. Default: a fresh ``provider`` sandbox per run, destroyed
    when the run ends, holding a copy of ``workspace``."""
    tools: Toolset | None = field(default=None, compare=False)
    """Host tools for an agent CLI (the MCP server ``corral``), served by the process that
    drives the run: pass the same toolset to :meth:`Runner.drive` (or to the
    :class:`Runner`) in every process that may drive it. Never stored."""
    timeout: float | None = None
    """Seconds the agent may run; then its supervisor, on the host and out of the agent's
    reach, stops it (SIGTERM, SIGKILL 5 s later) and the run fails with exit code 124.
    ``None``: no limit."""
    token_budget: int | None = None
    """Model tokens (input + output + cache) an agent CLI run may use; the host model proxy
    refuses further model calls once the total reaches it. ``None``: no limit."""
    max_output: int = DEFAULT_MAX_OUTPUT
    """Bytes the agent may write to stdout and stderr together: its journal lives on the
    host, outside the sandbox's disk quota. Past it the supervisor stops the agent and the
    run fails saying so."""

    def __post_init__(self) -> None:
        t = self.timeout
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float))
                              or not 0 < t < float("inf")):
            raise ConfigError(f"timeout must be a positive number of seconds, not {t!r}")
        m = self.max_output
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ConfigError(f"max_output must be a positive number of bytes, not {m!r}")
        b = self.token_budget
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 1):
            raise ConfigError(f"token_budget must be a positive integer, not {b!r}")
        if b is not None and self.harness == "command":
            raise ConfigError("token_budget limits an agent CLI's model calls; the command "
                              "harness makes none")

    def definition(self) -> Sandbox:
        """The sandbox definition this run uses."""
        sandbox = self.sandbox
        if sandbox is None:
            sandbox = Sandbox(provider=self.provider, lifecycle=Lifecycle(reuse="none"))
        if self.workspace is not None and sandbox.workspace.source.kind == "none":
            if not Path(self.workspace).is_dir():
                raise ConfigError(f"workspace {self.workspace!r} is not a directory")
            source = LocalDir(str(Path(self.workspace).resolve()))
            sandbox = replace(sandbox, workspace=replace(sandbox.workspace, source=source))
        return sandbox

    def spec(self, sandbox: Sandbox) -> dict[str, Any]:
        out: dict[str, Any] = {**dict(self.options), "sandbox": sandbox.to_dict()}
        if len(sandbox.secrets):
            # names only: a driver that cannot redact them all withholds file events
            out["secret_names"] = list(sandbox.secrets)
        if self.command is not None:
            out["argv"] = list(self.command)
        if self.harness != "command" and sandbox.policy != Policy():
            # Only a policy the user wrote: the default one (default "ask") cannot be
            # enforced by the agent CLIs, and without one they run with their permission
            # prompts off, confined by the sandbox.
            out["policy"] = sandbox.policy.to_dict()
            if self.harness in ("claude-code", "codex"):
                # The CLI asks corral (permission prompt tool, command gate hook) on the
                # run's MCP server: the policy is evaluated live (ask rules become corral
                # approvals).
                out["permission_prompt"] = True
        return out


async def _file_baseline(handle: Handle, paths: JournalPaths, *, diff: bool) -> dict[str, Any]:
    """Record the workspace as the agent finds it: a manifest next to the journal (for the
    catch-up of unwatched changes) and, for diffs, a git baseline commit."""
    from corral.runs._file_feed import HostTreeBaseline, save_manifest, scan_manifest
    from corral.sandbox._watch import GitBaseline

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


@dataclass(frozen=True, slots=True)
class DriveResult:
    """How a call to :meth:`Runner.drive` ended: the record as last read, and whether this
    caller stopped (detached) rather than saw the run end."""

    record: RunRecord
    detached: bool = False


class Runner:
    """Drives durable runs against one store. Safe to use from many processes at once."""

    def __init__(
        self,
        store: Store,
        *,
        lease_ttl: float | None = None,
        journals_dir: str | os.PathLike[str] | None = None,
        provider_config: Mapping[str, Mapping[str, Any]] | None = None,
        tools: Toolset | None = None,
        approval_timeout: float = 300.0,
        max_file_watches: int = DEFAULT_MAX_WATCHES,
    ) -> None:
        """``tools``: host tools for the agent-CLI runs this runner starts and drives (a
        :class:`RunRequest` or :meth:`drive` may give its own). ``approval_timeout``: how long
        a call of an ``approval=True`` tool waits for ``corral approve``.
        ``max_file_watches``: directories a run's file events watch at most (changes in
        others are logged by a workspace walk before the run's end)."""
        self.store = store
        self.max_file_watches = check_max_watches(max_file_watches)
        self.tools = tools
        self.approval_timeout = approval_timeout
        self._run_tools: dict[str, Toolset] = {}
        # The secrets of runs this runner started: a definition rebuilt from the record
        # lacks values given in code (only env/file origins are recorded).
        self._run_secrets: dict[str, Secrets] = {}
        self.lease_ttl = lease_ttl if lease_ttl is not None else lease_ttl_from_env()
        self.journals_dir = Path(journals_dir) if journals_dir else corral_home() / "journals"
        self.owner = new_owner_id()
        self._provider_config = dict(provider_config or {})
        self._providers: dict[str, Provider] = {}

    # ------------------------------------------------------------------ helpers

    def provider(self, name: str, config: Mapping[str, Any] | None = None,
                 package: str | None = None) -> Provider:
        """The registered provider ``name`` with ``config`` (as a record names it; ``None``:
        this runner's configuration for it), built once per runner. ``package``: the one to
        name in the error when ``name`` is not installed here."""
        if config is None:
            if name not in self._providers:
                self._providers[name] = get_provider(name, **self._provider_config.get(name, {}))
            return self._providers[name]
        which = f"{name} {config_key(config)}"  # never a provider name (no spaces in those)
        if which not in self._providers:
            self._providers[which] = build_provider(name, config, package=package)
        return self._providers[which]

    def _run_provider(self, record: RunRecord, name: str) -> Provider:
        """Provider ``name`` with the configuration the run's definition recorded for it."""
        data = (record.spec or {}).get("sandbox")
        entry = data.get("provider") if isinstance(data, Mapping) else None
        if isinstance(entry, Mapping) and entry.get("name") == name:
            return self.provider(name, {k: v for k, v in entry.items() if k != "name"} or None)
        return self.provider(name)

    def _paths(self, record: RunRecord) -> JournalPaths | None:
        journal = record.journal or {}
        directory = journal.get("dir")
        if not isinstance(directory, str):
            return None
        return JournalPaths.for_run(directory, record.run_id)

    @staticmethod
    def _nonce(record: RunRecord) -> str | None:
        nonce = (record.journal or {}).get("nonce")
        return nonce if isinstance(nonce, str) else None

    @staticmethod
    def _harness(record: RunRecord) -> Harness:
        return harness_for_record(record)

    def _definition(self, record: RunRecord) -> Sandbox | None:
        """Rebuild the run's sandbox definition from its record (secrets are read again from
        this host's environment; without them the definition is used secret-less)."""
        data = (record.spec or {}).get("sandbox")
        if not isinstance(data, Mapping):
            return None
        try:
            return Sandbox.from_dict(data)
        except ConfigError as exc:
            if not data.get("secrets"):
                log.error("run %s: its sandbox definition is unusable: %s", record.run_id, exc)
                return None
            log.warning("run %s: secrets unavailable on this host (%s); events from here on "
                        "are redacted only for secrets this host knows", record.run_id, exc)
            try:
                return Sandbox.from_dict({k: v for k, v in data.items() if k != "secrets"})
            except ConfigError:
                return None

    def redactor_for(self, record: RunRecord) -> Redactor | None:
        """The redactor of the run's secrets as known on this host (``None``: no secrets)."""
        secrets = self._secrets_for(record)
        return secrets.redactor() if secrets is not None else None

    def _secrets_for(self, record: RunRecord) -> Secrets | None:
        known = self._run_secrets.get(record.run_id)
        if known is not None:
            return known
        sandbox = self._definition(record)
        if sandbox is None or not len(sandbox.secrets):
            return None
        return sandbox.secrets

    async def _require(self, run_id: str) -> RunRecord:
        record = await self.store.get(run_id)
        if record is None:
            raise UnknownRun(run_id)
        return record

    # ------------------------------------------------------------------ start

    async def start(self, request: RunRequest) -> RunRecord:
        """Create the run, make its sandbox and launch the supervised agent.

        Returns the record once the agent is running; nobody drives it until
        :meth:`drive` is called. On failure the run is recorded as failed (its log ends
        with a ``RUN_ERROR``), the new sandbox is destroyed, and :class:`RunStartError` is
        raised.
        """
        sandbox = request.definition()
        spec = request.spec(sandbox)
        harness = build_harness(request.harness, spec)
        agent_request = AgentRequest(
            prompt=request.prompt, env=dict(request.env), options=request.options
        )
        tools = request.tools if request.tools is not None else self.tools
        if request.tools is not None and not isinstance(harness, CliHarness):
            raise ConfigError(f"host tools need an agent-CLI harness (claude-code, codex); "
                              f"the {harness.name} harness cannot call them")
        if isinstance(harness, CliHarness):
            # Checked before anything is recorded: a missing CLI or key is the user's to fix.
            agent_prerequisites(harness)
            if not (request.prompt or "").strip():
                raise ConfigError(f"the {harness.name} harness needs a non-empty prompt")
        else:
            agent = harness.build_command(agent_request)
        provider = sandbox.get_provider()
        if not provider.capabilities.host_processes:
            raise ConfigError(
                f"provider {provider.name!r} cannot host a supervised agent yet; "
                "use --provider bubblewrap or local"
            )
        run_id = request.run_id or new_run_id()
        thread_id = request.thread_id or run_id
        if len(sandbox.secrets):
            self._run_secrets[run_id] = sandbox.secrets
        if (tools is None and isinstance(harness, CliHarness)
                and harness.policy_mapping.permission_prompt):
            from corral.tools._core import Toolset

            tools = Toolset()  # the server is needed for the permission prompt tool alone
        if tools is not None and isinstance(harness, CliHarness):
            self._run_tools[run_id] = tools
        nonce = new_nonce()
        self.journals_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        sctx = SandboxContext(thread_id=thread_id, run_id=run_id)
        await self.store.create(
            NewRun(
                run_id=run_id,
                thread_id=thread_id,
                harness=harness.name,
                spec=spec,
                journal={"dir": str(self.journals_dir), "nonce": nonce},
                # Recorded before the sandbox exists: ensure writes its instance record as
                # soon as the sandbox does, so if this process dies mid-bootstrap (the
                # workspace copy) whoever ends the run (the reaper) still finds and
                # reclaims it.
                sandbox_key=sandbox.key(sctx),
            )
        )
        paths = JournalPaths.for_run(self.journals_dir, run_id)
        ensured: Ensured | None = None
        async with hold_claim(self.store, run_id, self.owner, self.lease_ttl) as held:
            try:
                start = harness.translator(RunContext(run_id, thread_id)).start()
                if start:
                    await self.store.append(
                        run_id, [(event_to_dict(e), 0) for e in start], epoch=held.epoch
                    )
                cli = isinstance(harness, CliHarness)
                ensured = await sandbox.ensure(
                    sctx,
                    store=self.store,
                    # agent CLIs need their install and the model proxy's socket directory;
                    # a thread's sandbox gets them whatever runs first, since an agent run
                    # of the thread may come next
                    spec_hook=with_agent_binds
                    if provider.capabilities.isolated
                    and (cli or sandbox.lifecycle.reuse == "thread") else None,
                )
                handle = ensured.handle
                await self.store.update(
                    run_id,
                    RunPatch(
                        sandbox_key=ensured.key,
                        sandbox_ref={"provider": provider.name, "id": handle.id},
                    ),
                )
                if sandbox.file_events:
                    # before the agent starts: what its changes are measured against
                    spec["files"] = await _file_baseline(
                        handle, paths, diff=sandbox.file_events == "diff")
                    await self.store.update(run_id, RunPatch(spec=dict(spec)))
                if isinstance(harness, CliHarness):
                    launched_agent = await self._launch_cli_agent(
                        harness, ensured, agent_request, run_id, thread_id, paths, nonce,
                        sandbox, spec, host_tools=run_id in self._run_tools,
                        token_budget=request.token_budget, timeout=request.timeout,
                        max_output=request.max_output,
                    )
                else:
                    # Secrets reach the agent only here: through the supervisor's pipe into
                    # the agent's environment; never the store, the journal or a file.
                    host = handle.host_command(
                        agent.argv, cwd=agent.cwd, env=ensured.exec_env(agent.env)
                    )
                    launched_agent = await launch_supervised_async(
                        AgentSpec(
                            argv=host.argv,
                            env=host.env,
                            cwd=host.cwd,
                            stdin=agent.stdin,
                            redact=ensured.redactor.table(),
                            stdin_prefix=host.stdin_prefix,
                            timeout=request.timeout,
                            max_output=request.max_output,
                        ),
                        paths,
                        nonce,
                    )
                log.info("run %s: agent started (supervisor pid %d)", run_id,
                         launched_agent.supervisor_pid)
            except BaseException as exc:
                self._run_tools.pop(run_id, None)
                self._run_secrets.pop(run_id, None)
                with anyio.CancelScope(shield=True):
                    if ensured is not None:
                        if paths.status.exists():  # launched, then something failed
                            with anyio.move_on_after(30):
                                await kill_supervised_async(paths, grace=0.5)
                        await self._finish_sandbox(await self._require(run_id), "aborted")
                    await self._fail_start(run_id, held.epoch, exc, sandbox)
                if isinstance(exc, Exception):
                    message = sandbox.secrets.redactor().redact(str(exc))
                    raise RunStartError(f"run {run_id} could not start: {message}") from None
                raise
        return await self._require(run_id)

    async def _launch_cli_agent(
        self,
        harness: CliHarness,
        ensured: Ensured,
        request: AgentRequest,
        run_id: str,
        thread_id: str,
        paths: JournalPaths,
        nonce: str,
        sandbox: Sandbox,
        spec: Mapping[str, Any],
        *,
        host_tools: bool = False,
        token_budget: int | None = None,
        timeout: float | None = None,
        max_output: int | None = None,
    ) -> Any:
        """Prepare an agent CLI in the sandbox, start its model proxy as a detached daemon
        (so the run keeps its model when no process drives it), launch it supervised, and
        record what a successor needs to finish the run."""
        instructions = sandbox.workspace.instructions
        prepared = await prepare_agent(
            harness, ensured.handle, request, thread_id=thread_id, run_id=run_id,
            instructions=instructions if isinstance(instructions, str) else None,
            # an allowlist: the agent's only way out is the egress proxy (the sandbox has no
            # network of its own); the services daemon serves it next to the model proxy
            egress=list(sandbox.policy.allow_hosts) if sandbox.policy.allow_hosts else None,
            host_tools=host_tools,
            budget=token_budget,
            timeout=timeout,
        )
        # The sandbox's secrets join the agent's environment (as for any agent), under the
        # CLI's own variables: a secret never replaces the placeholder key or the endpoint.
        prepared.command = replace(
            prepared.command, env={**ensured.secrets.env(), **prepared.command.env}
        )
        tools_socket = prepared.host_tools.socket if prepared.host_tools else None
        agent_info: dict[str, Any] = {
            "resumed_session": prepared.resumed.session_id if prepared.resumed else None,
            "sockets": [str(p) for p in (prepared.model_socket, prepared.egress_socket,
                                         tools_socket) if p],
            "own_net_dir": str(prepared.own_net_dir) if prepared.own_net_dir else None,
            # where a driver serves the host tools (the token is derived, never stored)
            "tools_socket": str(tools_socket) if tools_socket else None,
            # what a driver needs to restart a dead services daemon (no key in it)
            "services": prepared.services_job(paths),
        }
        await self.store.update(run_id, RunPatch(spec={**spec, "agent": agent_info}))
        pending = await prepared.start_services(paths)
        try:
            launched = await launch_supervised_async(
                replace(prepared.agent_spec(), redact=ensured.redactor.table(),
                        max_output=max_output), paths, nonce
            )
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(lambda: _stop_pending(pending))
            raise
        services = await anyio.to_thread.run_sync(pending.ready)
        agent_info["services_pid"] = services.pid
        await self.store.update(run_id, RunPatch(spec={**spec, "agent": agent_info}))
        return launched

    async def _finish_agent(self, record: RunRecord) -> None:
        """The end of an agent-CLI run (any host, any outcome): save the CLI session for the
        thread's next prompt while the sandbox is still there, and record the tokens the
        model proxy metered."""
        if record.harness in (None, "command"):
            return
        try:
            harness = self._harness(record)
        except CorralError as exc:
            log.warning("run %s: cannot rebuild its harness: %s", record.run_id, exc)
            return
        if not isinstance(harness, CliHarness):
            return
        info = (record.spec or {}).get("agent")
        info = info if isinstance(info, Mapping) else {}
        paths = self._paths(record)
        pid = info.get("services_pid")
        if isinstance(pid, int):
            # The daemon writes its last usage as the agent exits, then stops.
            with anyio.move_on_after(3):
                while process_alive(pid):
                    await anyio.sleep(0.05)
        handle = None
        ref = record.sandbox_ref or {}
        name, sandbox_id = ref.get("provider"), ref.get("id")
        if isinstance(name, str) and isinstance(sandbox_id, str):
            try:
                handle = await self._run_provider(record, name).resume(sandbox_id)
            except CorralError as exc:
                log.warning("run %s: its sandbox is unreachable: %s", record.run_id, exc)
        resumed = info.get("resumed_session")
        own = info.get("own_net_dir")
        names = (record.spec or {}).get("secret_names") or []
        report = await finish_agent_run(
            harness, handle, record.thread_id, paths, self._nonce(record),
            # the saved CLI session can hold whatever the agent printed
            redactor=self.redactor_for(record),
            secret_names=[n for n in names if isinstance(n, str)],
            resumed_session=resumed if isinstance(resumed, str) else None,
            sockets=[Path(p) for p in info.get("sockets") or [] if isinstance(p, str)],
            own_net_dir=Path(own) if isinstance(own, str) else None,
        )
        for error in report.errors:
            log.warning("run %s: %s", record.run_id, error)
        if paths is not None and report.usage.requests:
            u = report.usage
            await self.store.update(record.run_id, RunPatch(usage={
                "input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
                "cache_read_tokens": u.cache_read_tokens,
                "cache_write_tokens": u.cache_write_tokens,
                "total_tokens": u.total, "requests": u.requests, "refused": u.refused,
            }))

    async def _finish_agent_quietly(self, record: RunRecord) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(60):
            try:
                await self._finish_agent(record)
            except Exception as exc:  # noqa: BLE001 - the reaper goes on
                log.error("finishing the agent of run %s failed: %s", record.run_id, exc)

    async def _fail_start(
        self, run_id: str, epoch: int, exc: BaseException, sandbox: Sandbox
    ) -> None:
        message = sandbox.secrets.redactor().redact(str(exc)) if isinstance(exc, Exception) else ""

        async def failing() -> AsyncIterator[Produced]:
            raise RunStartError(message or "the start was interrupted")
            yield  # pragma: no cover

        await pipe_to_run_log(self.store, run_id, failing(), epoch=epoch)

    # ------------------------------------------------------------------ drive

    async def drive(
        self,
        run_id: str,
        *,
        stop: anyio.Event | None = None,
        clear_detached: bool = True,
        tools: Toolset | None = None,
    ) -> DriveResult:
        """Make the run progress until it ends, or until ``stop`` is set (then detach).

        Takes the claim when nobody live holds it; while another live driver holds it,
        waits and takes over as soon as that driver is gone (at once for a dead process on
        this machine, at lease expiry otherwise).

        ``clear_detached``: the claim clears ``detached_since`` (the caller is a viewer).
        A server that drives runs whether or not anyone watches passes ``False`` and keeps
        ``detached_since`` itself, as the mark of viewer absence.

        ``tools``: the run's host tools (default: those it was started with by this runner,
        else the runner's). While this call holds the claim it serves them to the agent
        on the run's tool socket; calls of ``approval=True`` tools log a CUSTOM
        ``corral.approval_request`` event and wait for ``corral approve``. A run started
        with host tools and driven without them sees its tool calls fail.
        """
        toolset = tools if tools is not None else self._run_tools.get(run_id, self.tools)
        while True:
            record = await self._require(run_id)
            if record.terminal:
                self._run_tools.pop(run_id, None)
                self._run_secrets.pop(run_id, None)
                return DriveResult(record)
            held_elsewhere = not driver_gone(record)
            if stop is not None and stop.is_set():
                if held_elsewhere:
                    # Only a viewer here (another driver holds the run): nothing to stamp.
                    return DriveResult(record, detached=True)
                # Nobody drives it: leaving must mark it detached for attach or the reaper.
                return DriveResult(await self.detach(run_id), detached=True)
            if record.cancel_requested:
                if held_elsewhere:
                    await _wait(stop, _POLL)  # the canceller is ending the run
                    continue
                return DriveResult(await self.cancel(run_id))  # a canceller died midway
            if held_elsewhere:
                await _wait(stop, _POLL)
                continue
            try:
                result = await self._drive_claimed(record, stop, clear_detached, toolset)
            except ClaimRefused as refused:
                if refused.reason in (RefusalReason.UNKNOWN, RefusalReason.TERMINAL):
                    continue  # the loop re-reads and returns
                await _wait(stop, _POLL)
                continue
            except ClaimLost:
                continue
            if result is None:
                continue
            if result.stopped:
                return DriveResult(await self.detach(run_id), detached=True)
            if result.claim_lost:
                continue
            if result.record_error is not None:
                # The store would not take the terminal status: the log is still open,
                # the next claim (ours or another driver's) records the logged end.
                await _wait(stop, _POLL)
                continue
            final = result.record or await self._require(run_id)
            self._run_tools.pop(run_id, None)
            self._run_secrets.pop(run_id, None)
            await self._finish_sandbox(final, final.status.value)
            return DriveResult(final)

    async def _drive_claimed(
        self, record: RunRecord, stop: anyio.Event | None, clear_detached: bool = True,
        tools: Toolset | None = None,
    ) -> PipeResult | None:
        run_id = record.run_id
        paths = self._paths(record)
        nonce = self._nonce(record)
        if paths is None or nonce is None:
            return None
        breaking = record.claim_owner if owner_is_dead(record.claim_owner) else None
        async with hold_claim(
            self.store,
            run_id,
            self.owner,
            self.lease_ttl,
            clear_detached=clear_detached,
            break_lease_of=breaking,
        ) as held:
            # Appends from any predecessor are fenced from here on, so the tail is final.
            end = await logged_end(self.store, record)
            if end is not None:
                # A predecessor logged the run's end (or closed the log) but never stored
                # the status: record that end; resuming after the exit would find none.
                return await pipe_to_run_log(self.store, run_id, _once(end),
                                             epoch=held.epoch)
            tail = await self.store.tail(run_id)
            if not paths.journal.exists():
                # We hold the claim, so the starter is gone: it died before launching the
                # agent. Nothing will ever write this journal.
                await self._stop_agent(record)
                return await pipe_to_run_log(
                    self.store, run_id, _never_launched(), epoch=held.epoch
                )
            harness = self._harness(record)
            ctx = RunContext(run_id, record.thread_id)
            secrets = self._secrets_for(record)  # once: it may rebuild the definition
            redactor = secrets.redactor() if secrets is not None else None
            abort = anyio.Event()
            result: PipeResult | None = None
            feed = await self._file_feed(record, paths, held.epoch, secrets)
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch_cancel, run_id, abort)
                if isinstance(harness, CliHarness):
                    tg.start_soon(self._keep_services, record, paths, held.epoch)
                await self._serve_tools(tg, record, tools, held.epoch)
                if feed is not None:
                    try:
                        await feed.start(e.event for e in await self.store.snapshot(run_id))
                    except Exception as exc:  # noqa: BLE001 - e.g. inotify limits: the run goes on
                        log.warning("run %s: no file events from this driver: %s", run_id, exc)
                        feed.close()
                        feed = None
                    else:
                        tg.start_soon(feed.run)
                result = await pipe_to_run_log(
                    self.store,
                    run_id,
                    self._produce(
                        harness, ctx, paths, nonce, tail.last_journal_offset, abort, redactor,
                        feed,
                    ),
                    epoch=held.epoch,
                    abort=abort,
                    stop=stop,
                    journal_offset=tail.last_journal_offset or 0,
                )
                tg.cancel_scope.cancel()
            if feed is not None:
                feed.close()
            return result

    async def _append_aside(self, run_id: str, events: Sequence[Mapping[str, Any]],
                            epoch: int) -> None:
        """Log events that come from no journal line (approval requests, file events) at
        the highest journal offset logged (the store keeps the maximum): a successor
        resumes the journal after it, so they are neither repeated nor in the way of the
        agent's events."""
        tail = await self.store.tail(run_id)
        await self.store.append(
            run_id, [(e, tail.last_journal_offset or 0) for e in events], epoch=epoch)

    async def _serve_tools(self, tg: anyio.abc.TaskGroup, record: RunRecord,
                           tools: Toolset | None, epoch: int) -> None:
        """Serve the run's host tools in ``tg`` (this driver's claimed section), if it has
        a tool socket. Approval events go into the run's log under ``epoch``."""
        info = (record.spec or {}).get("agent")
        socket_path = info.get("tools_socket") if isinstance(info, Mapping) else None
        if not isinstance(socket_path, str):
            return
        spec = record.spec or {}
        prompt = spec.get("permission_prompt") is True and isinstance(spec.get("policy"),
                                                                         Mapping)
        if tools is None and prompt:
            from corral.tools._core import Toolset

            tools = Toolset()  # the permission prompt needs only the run's policy
        if tools is None:
            log.warning("run %s was started with host tools, and this driver has none: its "
                        "tool calls fail until a driver with the toolset takes it",
                        record.run_id)
            return
        from corral.tools._approvals import Approvals
        from corral.tools._mcp_server import HostToolServer
        from corral.tools._projection import run_tools_token

        run_id = record.run_id

        async def emit(event: BaseEvent) -> None:
            try:
                await self._append_aside(run_id, [event_to_dict(event)], epoch)
            except CorralError as exc:
                log.warning("run %s: cannot log %s: %s", run_id,
                            getattr(event, "name", event.type), exc)

        gate = Approvals(run_id, emit=emit, timeout=self.approval_timeout)
        if prompt:
            from corral.tools._core import Toolset
            from corral.tools._permission import PermissionPromptTool

            tools = Toolset([*tools, PermissionPromptTool(
                Policy(**dict(spec["policy"])), gate)])
        server = HostToolServer(tools, token=run_tools_token(run_id), run_id=run_id,
                                approvals=gate)
        await tg.start(server.serve, socket_path)

    async def _produce(
        self,
        harness: Harness,
        ctx: RunContext,
        paths: JournalPaths,
        nonce: str,
        after: int | None,
        abort: anyio.Event,
        redactor: Redactor | None,
        feed: FileFeed | None = None,
    ) -> AsyncIterator[Produced]:
        batches = translate_run(harness, ctx, paths, nonce=nonce, after=after, follow=True)
        try:
            async for batch in batches:
                events = [event_to_dict(e) for e in batch.events]
                if redactor is not None:
                    events = [redactor.redact_obj(e) for e in events]
                exit = batch.exit
                if exit is None:
                    yield LogBatch(events, batch.journal_offset)
                    continue
                # A cancel kills the agent; its exit must not land as a failure.
                current = await self.store.get(ctx.run_id)
                if current is not None and current.cancel_requested:
                    abort.set()
                    return
                if feed is not None:
                    await feed.flush()  # the agent's last changes go in before its end
                yield LogBatch(events, batch.journal_offset, exit_code=exit.code)
                return
        except JournalError:
            current = await self.store.get(ctx.run_id)
            if current is not None and current.cancel_requested:
                abort.set()
                return
            raise
        finally:
            await batches.aclose()  # type: ignore[attr-defined]

    async def unlogged_file_events(self, record: RunRecord) -> list[dict[str, Any]]:
        """The file events of a run with ``file_events`` that its log lacks (changes made
        while nobody watched), for a driver that finishes the run without a watch (the
        reaper); ``[]`` when there are none or they cannot be had. Never raises."""
        paths = self._paths(record)
        if paths is None:
            return []
        got: list[dict[str, Any]] = []

        async def collect(events: Sequence[dict[str, Any]]) -> None:
            got.extend(events)

        try:
            feed = await self._file_feed(record, paths, 0, self._secrets_for(record),
                                         emit=collect)
            if feed is None:
                return []
            await feed.catch_up(e.event for e in await self.store.snapshot(record.run_id))
        except Exception as exc:  # noqa: BLE001 - file events never stop a run's end
            log.warning("run %s: no catch-up of file events: %s", record.run_id, exc)
            return []
        return got

    async def _file_feed(self, record: RunRecord, paths: JournalPaths, epoch: int,
                         secrets: Secrets | None, *,
                         emit: Callable[[Sequence[dict[str, Any]]], Awaitable[None]] | None
                         = None) -> FileFeed | None:
        """The run's file feed when its sandbox definition asked for file events."""
        from corral.runs._file_feed import FileFeed, load_manifest

        files = (record.spec or {}).get("files")
        ref = record.sandbox_ref or {}
        if not isinstance(files, Mapping) or not isinstance(ref.get("id"), str):
            return None
        try:
            handle = await self._run_provider(record, str(ref.get("provider"))).resume(
                str(ref["id"]))
        except CorralError as exc:
            log.warning("run %s: no file events, its sandbox is unreachable: %s",
                        record.run_id, exc)
            return None
        if not isinstance(handle, HostPaths):
            return None
        run_id = record.run_id
        names = (record.spec or {}).get("secret_names") or []
        missing = set(names) - set(secrets or ())
        if missing:
            # Paths and patches could carry them: the next driver that knows every secret
            # logs what this one did not (the catch-up).
            log.warning("run %s: no file events from this driver: secrets %s are not known "
                        "here", run_id, sorted(missing))
            return None

        async def append(events: Sequence[dict[str, Any]]) -> None:
            try:
                await self._append_aside(run_id, events, epoch)
            except Exception as exc:  # noqa: BLE001 - file events never stop a run
                log.warning("run %s: cannot log file events: %s", run_id, exc)

        baseline = files.get("baseline")
        tree = files.get("tree")
        async def logged() -> list[Mapping[str, Any]]:
            return [e.event for e in await self.store.snapshot(run_id)]

        return FileFeed(handle, handle.host_path(handle.workdir), emit=emit or append,
                        max_watches=self.max_file_watches, logged=logged,
                        diff=files.get("diff") is True,
                        baseline=baseline if isinstance(baseline, str) else None,
                        manifest=load_manifest(paths.files),
                        redactor=secrets.redactor() if secrets is not None else None,
                        tree=(str(tree[0]), str(tree[1])) if isinstance(tree, list)
                        and len(tree) == 2 else None)

    async def _keep_services(self, record: RunRecord, paths: JournalPaths, epoch: int
                             ) -> None:
        """While this driver holds the run: if the run's services daemon (model and egress
        proxies) dies while the agent runs, start another on the same sockets. The agent's
        forwarder retries a refused socket for a while, so its model calls go on; the new
        daemon continues the usage count (and so the budget) from the usage file."""
        info = (record.spec or {}).get("agent")
        job = info.get("services") if isinstance(info, Mapping) else None
        pid = info.get("services_pid") if isinstance(info, Mapping) else None
        if not isinstance(job, Mapping) or not isinstance(pid, int):
            return
        while True:
            await anyio.sleep(_SERVICES_CHECK)
            if _is_services_daemon(pid):
                continue
            status = read_status(paths.status)
            if status is None or status.state != "running":
                return  # the agent is done: the daemon exited as it should
            try:
                pid = await self._restart_services(record, paths, job, epoch)
            except CorralError as exc:
                log.error("run %s: its services daemon died and could not be restarted: %s",
                          record.run_id, exc)
                return

    async def _restart_services(self, record: RunRecord, paths: JournalPaths,
                                job: Mapping[str, Any], epoch: int) -> int:
        from corral.agents._services import start_services
        from corral.net._model_proxy import Upstream

        up = dict(job["upstream"])
        key = Upstream.from_env(up["api"]).api_key  # this host's key for the same API
        full = {**job, "upstream": {**up, "api_key": key}}
        pending = await anyio.to_thread.run_sync(
            lambda: start_services(full, paths.directory, paths.token))
        services = await anyio.to_thread.run_sync(pending.ready)
        log.warning("run %s: its services daemon had died; restarted it (pid %d)",
                    record.run_id, services.pid)
        current = await self._require(record.run_id)
        spec = dict(current.spec or {})
        spec["agent"] = {**dict(spec.get("agent") or {}), "services_pid": services.pid}
        await self.store.update(record.run_id, RunPatch(spec=spec), expect_epoch=epoch)
        return services.pid

    async def _watch_cancel(self, run_id: str, abort: anyio.Event) -> None:
        while not abort.is_set():
            record = await self.store.get(run_id)
            if record is None or record.cancel_requested:
                abort.set()
                return
            await anyio.sleep(_POLL)

    async def _finish_sandbox(self, record: RunRecord, outcome: str) -> None:
        """Apply the run's lifecycle to its sandbox: destroy it (``destroy_on_complete`` or
        an aborted run), or snapshot/keep it for the next run of the thread."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(120):
            try:
                await self._finish_sandbox_now(record, outcome)
            except Exception as exc:  # noqa: BLE001
                log.error("finishing the sandbox of run %s failed: %s", record.run_id, exc)

    async def _finish_sandbox_now(self, record: RunRecord, outcome: str) -> None:
        try:
            await self._finish_agent(record)  # before the sandbox may go
        except Exception as exc:  # noqa: BLE001 - the sandbox's lifecycle still applies
            log.error("finishing the agent of run %s failed: %s", record.run_id, exc)
        sandbox = self._definition(record)
        key = record.sandbox_key
        if sandbox is not None and key is None:
            # The starter died between making the sandbox and recording its key.
            key = sandbox.key(SandboxContext(thread_id=record.thread_id, run_id=record.run_id))
        if sandbox is None or key is None:
            ref = record.sandbox_ref or {}
            name, sandbox_id = ref.get("provider"), ref.get("id")
            if isinstance(name, str) and isinstance(sandbox_id, str):
                await self._run_provider(record, name).destroy(sandbox_id)
            return
        instance = await self.store.get_instance(key)
        if instance is None:
            return
        provider = sandbox.get_provider()
        if instance.latest_run_id not in (None, record.run_id) and instance.latest_run_id:
            latest = await self.store.get(instance.latest_run_id)
            if latest is not None and not latest.terminal and outcome != "aborted":
                return  # a later run of the thread uses this sandbox now
        if sandbox.lifecycle.destroys_on_complete or outcome == "aborted":
            await destroy_record(
                provider, instance, self.store, snapshots=_snapshotter(sandbox, provider)
            )
            return
        handle = await provider.resume(instance.provider_sandbox_id)
        if handle is None:
            await self.store.delete_instance(key)
            return
        ensured = Ensured(handle, key, instance, "resumed", sandbox.secrets)
        sctx = SandboxContext(thread_id=record.thread_id, run_id=record.run_id)
        status = outcome if outcome in ("completed", "failed", "aborted") else "failed"
        await release(sandbox, ensured, sctx, store=self.store, outcome=status)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ reap

    async def reap(
        self,
        *,
        ttl: float,
        max_runs: int = 25,
        budget: float = 30.0,
        now: float | None = None,
    ) -> tuple[ReapResult, PruneResult | None]:
        """One reaper sweep over unattended runs (detached, or their driver's lease lapsed:
        finalize, expire, reclaim), then one prune
        of this runner's journal directory. Never raises for a run's failure."""
        from corral.runs._reaping import reap_runner_runs

        from corral.sandbox._gc import collect_idle

        journals = self.journals_dir
        result = await reap_runner_runs(
            self.store,
            provider_for=self.provider,
            ttl=ttl,
            max_runs=max_runs,
            budget=budget,
            now=now,
            owner=self.owner,
            journals_dir=str(journals) if journals.is_dir() else None,
            redactor_for=self.redactor_for,
            before_reclaim=self._finish_agent_quietly,
            files_for=self.unlogged_file_events,
        )
        # keep_alive is enforced as part of every sweep (idle sandboxes past it go).
        try:
            report = await collect_idle(self.store, now=now, providers=self._providers)
            if report.entries:
                log.info("reap: idle sandboxes: %s", dict(report.counts))
        except Exception as exc:  # noqa: BLE001 - the sweep never raises
            log.error("reap: collecting idle sandboxes failed: %s", exc)
        return result

    # ------------------------------------------------------------------ watch / detach

    def events(self, run_id: str, after: int = 0) -> AsyncIterator[LoggedEvent]:
        """The run's logged events after offset ``after``, following until the log closes."""
        return self.store.read(run_id, after)

    async def detach(self, run_id: str) -> RunRecord:
        """The viewer left: stamp ``detached_since`` (unless the run ended or a cancel is
        recorded). The agent keeps running; ``drive`` or a reaper picks the run up later."""
        record = await self._require(run_id)
        if record.terminal or record.cancel_requested:
            return record
        await self.store.update(run_id, RunPatch(detached_since=time.time()))
        return await self._require(run_id)

    # ------------------------------------------------------------------ cancel

    async def cancel(self, run_id: str) -> RunRecord:
        """Cancel a run from any process: recorded first, then the agent is stopped, the
        sandbox destroyed, and the log ended with ``RUN_ERROR`` (status ``aborted``)."""
        record = await self.store.request_cancel(run_id)
        if record is None:
            raise UnknownRun(run_id)
        for _ in range(100):
            if record.terminal:
                return record
            try:
                async with hold_claim(
                    self.store,
                    run_id,
                    self.owner,
                    self.lease_ttl,
                    allow_cancelled=True,
                    break_lease_of=record.claim_owner,
                ) as held:
                    await self._stop_agent(record)

                    async def nothing() -> AsyncIterator[Produced]:
                        return
                        yield  # pragma: no cover

                    stopped = anyio.Event()
                    stopped.set()
                    await pipe_to_run_log(self.store, run_id, nothing(), epoch=held.epoch,
                                          abort=stopped)
            except ClaimRefused as refused:
                if refused.reason is RefusalReason.UNKNOWN:
                    raise UnknownRun(run_id) from None
                if refused.reason is not RefusalReason.TERMINAL:
                    await anyio.sleep(0.05)  # the lease changed hands: read again
            except ClaimLost:
                pass
            record = await self._require(run_id)
        return record

    async def _stop_agent(self, record: RunRecord) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(30):
            paths = self._paths(record)
            if paths is not None:
                try:
                    await kill_supervised_async(paths, grace=0.5)
                except Exception as exc:  # noqa: BLE001
                    log.warning("stopping the agent of run %s: %s", record.run_id, exc)
            await self._finish_sandbox(record, "aborted")


def _is_services_daemon(pid: int) -> bool:
    """``pid`` is alive and still a corral services daemon (not a reused pid)."""
    if not process_alive(pid):
        return False
    try:
        return b"corral.agents._services" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _stop_pending(pending: PendingServices) -> None:
    """Stop a services daemon whose agent never started (it would wait for a minute)."""
    try:
        services = pending.ready(10.0)
    except CorralError:
        return
    with contextlib.suppress(OSError):
        os.kill(services.pid, signal.SIGTERM)


async def _once(item: Produced) -> AsyncIterator[Produced]:
    yield item


async def _never_launched() -> AsyncIterator[Produced]:
    raise RunStartError("the run's starter stopped before it launched the agent")
    yield  # pragma: no cover


async def _wait(stop: anyio.Event | None, seconds: float) -> None:
    if stop is None:
        await anyio.sleep(seconds)
        return
    with anyio.move_on_after(seconds):
        await stop.wait()
