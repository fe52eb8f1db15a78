"""Running an agent CLI in a sandbox: binds at creation, then :func:`prepare_agent` per run.

The sequence (the Runner makes it through :func:`corral.agents._start.start_agent`, with
the services as a detached daemon)::

    spec = with_agent_binds(SandboxSpec(...))          # once, when creating the sandbox
    handle = await provider.create(spec)
    prepared = await prepare_agent(harness, handle, AgentRequest(prompt=...),
                                   thread_id=t, run_id=r)
    async with prepared.services():                   # host-side model (+ egress) proxy
        await launch_supervised_async(prepared.agent_spec(), paths, nonce)
        async for batch in translate_run(harness, RunContext(r, t), paths, nonce=nonce):
            ...                                        # append batch.events atomically
    report = await prepared.finish(paths, nonce)       # save the CLI session for resume

The services must run as long as the agent does (they hold the only route to the model);
they are restartable: a successor host that takes a run over builds a fresh
:class:`PreparedAgent` with the same ``run_id`` and enters its ``services()``: the socket
paths derive from the run id, so the agent's forwarder reaches the new proxy (token counts
start again from zero on that host).

Isolated sandboxes (bubblewrap) see two read-only binds made at creation: the agents root
at ``/opt/corral/agents`` and a per-sandbox socket directory at ``/run/corral``. Without
isolation (local) the CLI runs from its host path and the sockets live in a host directory.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import json
import os
import secrets
import stat
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from corral._errors import AgentNotInstalled, ConfigError, CorralError, PrerequisiteMissing
from corral._insandbox import acp_client as acp_client
from corral._insandbox import command_gate as command_gate
from corral.harness._acp_agents import ACP_AGENTS
from corral.harness._base import AgentCommand, AgentRequest
from corral.harness._registry import build_harness
from corral.harness._cli_base import CliHarness, CliOptions
from corral.agents._installs import (
    AGENTS_MOUNT,
    InstalledAgent,
    agents_root,
    ensure_mount_source,
    installed_at,
)
from corral.agents._sessions import (
    SANDBOX_HOME,
    SavedSession,
    SessionUnusable,
    load_session,
    restore_session,
    save_session,
)
from corral.agents._services import (
    PROXY_TOKEN_NAME,
    PendingServices,
    launch_services,
    run_proxy_token,
    services_job,
)
from corral.net._egress import EgressProxy
from corral.net._model_proxy import ModelProxy, Upstream, Usage
from corral._paths import net_root, restrict_net_dir
from corral.journal._reader import Line, read_journal
from corral.journal._layout import JournalPaths
from corral.journal._supervisor import AgentSpec
from corral.sandbox._contracts import Described, Handle, HostCommand, SandboxIds, SandboxSpec
from corral.sandbox._redact import Redactor
from corral.stores._protocols import SessionStore
from corral.tools._names import MCP_PATH
from corral.tools._output import submit_instructions
from corral.tools._projection import host_tools_projection

if TYPE_CHECKING:  # the MCP SDK loads only for runs given host tools
    from corral.tools._projection import HostToolsProjection

__all__ = [
    "NET_MOUNT",
    "FinishReport",
    "PreparedAgent",
    "SessionLost",
    "agent_binds",
    "agent_prerequisites",
    "finish_agent_run",
    "new_net_dir",
    "prepare_agent",
    "run_proxy_token",
    "with_agent_binds",
]

ON_SESSION_LOST = ("continue", "fail")
"""What a run does when it was to continue its thread's saved CLI session and cannot:
``continue`` (a new conversation, said by ``CUSTOM corral.session_lost``) or ``fail``."""


class SessionLost(CorralError):
    """The run was to continue its thread's saved CLI session, could not, and was asked
    to fail then (``on_session_lost="fail"``)."""

    code = "session_lost"


GATE_SCRIPT = "command_gate.py"
"""The command gate's script in a run's socket directory (:mod:`corral._insandbox.command_gate`)."""

NET_MOUNT = "/run/corral"
"""Where a sandbox's socket directory appears inside it (read-only bind)."""
MAX_SOCKET_PATH = 100


def new_net_dir() -> Path:
    """A fresh socket directory for one sandbox (unguessable name, not listable; closed
    to all but the sandbox's ids by :func:`prepare_agent`)."""
    d = net_root() / secrets.token_hex(12)
    d.mkdir(mode=0o711)
    os.chmod(d, 0o711)
    return d


def agent_binds(net_dir: Path | None = None, *, root: Path | None = None
                ) -> list[tuple[str, str]]:
    """The read-only binds an isolated sandbox needs to run agent CLIs."""
    net = net_dir if net_dir is not None else new_net_dir()
    return [(str(ensure_mount_source(root or agents_root())), AGENTS_MOUNT),
            (str(net), NET_MOUNT)]


def with_agent_binds(spec: SandboxSpec, *, root: Path | None = None) -> SandboxSpec:
    """``spec`` plus :func:`agent_binds` (a new socket directory)."""
    return dataclasses.replace(spec, binds=[*spec.binds, *agent_binds(root=root)])


def _handle_binds(handle: Handle) -> list[tuple[str, str]] | None:
    if not isinstance(handle, Described):
        return None
    return [(str(h), str(i)) for h, i in handle.binds]


@dataclass
class FinishReport:
    """What :meth:`PreparedAgent.finish` did."""

    session_id: str | None = None
    saved: SavedSession | None = None
    usage: Usage = field(default_factory=Usage)
    errors: list[str] = field(default_factory=list)


@dataclass
class PreparedAgent:
    """Everything one run of an agent CLI needs (see the module docstring)."""

    harness: CliHarness
    handle: Handle
    command: AgentCommand
    """The in-sandbox command (argv/env/cwd/stdin) for ``handle.host_command``."""
    thread_id: str
    run_id: str
    install: InstalledAgent | None
    """``None`` for an agent that comes from no install (``--agent-command``)."""
    model_proxy: ModelProxy
    model_socket: Path
    proxy_token: str = field(repr=False, default="")
    """The run's token: the model API key of its CLI, the password of its egress proxy
    URL; the proxies refuse requests without it (a secret: not in :meth:`services_job`)."""
    egress_proxy: EgressProxy | None = None
    egress_socket: Path | None = None
    resumed: SavedSession | None = None
    """The saved CLI session this run continues, if any."""
    session_lost: dict[str, str] | None = None
    """``{"harness", "expected", "reason"}`` when the run was to continue the thread's
    saved session and starts a new conversation instead (found before the CLI starts:
    the session is not in the store, or its files cannot be resumed); the caller logs
    ``CUSTOM corral.session_lost`` with it before the agent's first event."""
    own_net_dir: Path | None = None
    """A socket directory created for this run only (non-isolated sandboxes)."""
    host_tools: HostToolsProjection | None = None
    """Where the run's host-tool server must listen (and with which token), when the agent
    was given host tools: serve a :class:`corral.tools._mcp_server.HostToolServer` on
    ``host_tools.socket`` with ``token=host_tools.token`` while the agent runs."""
    redactor: Redactor | None = None
    """The run's secrets: the saved CLI session goes through it (see :meth:`finish`)."""
    sessions: SessionStore | None = None
    """Where the thread's CLI session is restored from and saved to (the run's store);
    ``None``: the run neither resumes nor saves one."""
    bridge: dict[str, Any] | None = None
    """The harness's part of the ACP bridge's configuration (``acp`` runs: the supervisor
    runs the bridge, which runs :meth:`host_command`; see :func:`bridged_spec`)."""

    def host_command(self) -> HostCommand:
        """How a host process (the supervisor) runs the agent in the sandbox."""
        # (bubblewrap's host command carries --die-with-parent: stopping the host-side
        # bwrap stops every process of the sandbox)
        return self.handle.host_command(self.command.argv, cwd=self.command.cwd,
                                        env=self.command.env)

    def agent_spec(self) -> AgentSpec:
        """The supervisor's job for this agent (``launch_supervised(spec, paths, nonce)``)."""
        hc = self.host_command()
        if self.bridge is not None:
            return bridged_spec(self.bridge, hc, self.host_tools, self.command.timeout)
        return AgentSpec(argv=hc.argv, env=hc.env, cwd=hc.cwd, stdin=self.command.stdin,
                         stdin_prefix=hc.stdin_prefix, timeout=self.command.timeout)

    @property
    def usage(self) -> Usage:
        """Tokens metered by the model proxy for this run so far."""
        return self.model_proxy.usage

    @contextlib.asynccontextmanager
    async def services(self) -> AsyncIterator[PreparedAgent]:
        """Serve the model proxy (and the egress proxy) in this process while the block
        runs. The sockets are bound before the block starts. See also
        :meth:`start_services` (a detached daemon)."""
        async with anyio.create_task_group() as tg:
            await tg.start(self.model_proxy.serve, self.model_socket)
            if self.egress_proxy is not None and self.egress_socket is not None:
                await tg.start(self.egress_proxy.serve, self.egress_socket)
            try:
                yield self
            finally:
                tg.cancel_scope.cancel()

    def services_job(self, paths: JournalPaths, status: Path | None = None
                     ) -> dict[str, Any]:
        """The services daemon's job, *without* the upstream key (safe to record: a
        driver restarting a dead daemon adds the key from its own environment).
        ``status``: the file whose ``state`` turning ``exited`` stops the daemon (default:
        the run's supervisor status, ``paths.status``)."""
        return services_job(self.model_proxy, self.model_socket, self.egress_proxy,
                            self.egress_socket, status or paths.status)

    async def start_services(self, paths: JournalPaths, status: Path | None = None
                             ) -> PendingServices:
        """Start the services as a detached daemon instead of :meth:`services` (they
        outlive this process and stop when the run's supervisor records the agent's exit).
        Launch the agent, then call ``ready()`` on the result (the daemon's ~0.2 s
        start-up overlaps the CLI's). ``paths`` are the run's journal paths; ``status`` as
        for :meth:`services_job`."""
        return await launch_services(self.services_job(paths, status), self.model_proxy,
                                     self.proxy_token, paths)

    async def finish(self, paths: JournalPaths | None = None, nonce: str | None = None
                     ) -> FinishReport:
        """After the agent exited: find the CLI's session id in the journal and save the
        session files for the thread (redacted by :attr:`redactor`). Never raises; problems
        are listed in the report."""
        report = await finish_agent_run(
            self.harness, self.handle, self.thread_id, paths, nonce,
            sessions=self.sessions, run_id=self.run_id,
            redactor=self.redactor,
            resumed_session=self.resumed.session_id if self.resumed is not None else None,
            sockets=[s for s in (self.model_socket, self.egress_socket,
                                 self.host_tools.socket if self.host_tools else None)
                     if s is not None],
            own_net_dir=self.own_net_dir)
        if paths is None or Usage.load(paths.usage) is None:
            report.usage = self.model_proxy.usage  # the services ran in this process
        return report


PERMISSION_PATIENCE = 3600.0
"""Seconds the ACP bridge keeps asking for a permission while no driver serves the run's
tool socket (a successor answers), when the run has no timeout; then it refuses."""


def bridged_spec(bridge: dict[str, Any], host: HostCommand,
                 tools: HostToolsProjection | None, timeout: float | None) -> AgentSpec:
    """The supervisor's job for an ACP run: the bridge (:mod:`corral._insandbox.acp_client`,
    the host's Python, stdlib only) with its whole configuration on stdin (the inner host
    command, its stdin prefix, the permission channel): nothing in argv or env."""
    config: dict[str, Any] = {
        **{k: v for k, v in bridge.items() if k != "ask_corral"},
        "argv": list(host.argv), "env": dict(host.env), "cwd": host.cwd,
        "stdin_prefix": base64.b64encode(host.stdin_prefix).decode(),
        "await_ports": True,
        "permission": None, "secrets": {},
    }
    if host.cwd is not None:
        # the agent runs as a host process (no isolation: local): its paths are the host's
        config["workdir"] = host.cwd
    if tools is not None:
        # the header values of mcpServers name the token as ${CORRAL_TOOLS_TOKEN}
        config["secrets"] = dict(tools.env)
        if bridge.get("ask_corral"):
            config["permission"] = {"socket": str(tools.socket), "token": tools.token,
                                    "path": MCP_PATH,
                                    "patience": timeout or PERMISSION_PATIENCE}
    elif bridge.get("ask_corral"):
        raise ConfigError("this ACP run enforces its policy through corral's permission "
                          "prompt: prepare it with host_tools=True")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"}
    return AgentSpec(argv=[sys.executable, "-I", "-S", acp_client.__file__], env=env,
                     stdin=acp_client.encode_header(config), timeout=timeout)


async def finish_agent_run(
    harness: CliHarness,
    handle: Handle | None,
    thread_id: str,
    paths: JournalPaths | None,
    nonce: str | None,
    *,
    sessions: SessionStore | None = None,
    run_id: str | None = None,
    redactor: Redactor | None = None,
    secret_names: Sequence[str] = (),
    resumed_session: str | None = None,
    sockets: Sequence[Path] = (),
    own_net_dir: Path | None = None,
) -> FinishReport:
    """The end of a run of an agent CLI, from what any host can know: the session id from
    the journal (else ``resumed_session``) and its files saved for ``thread_id`` in
    ``sessions`` (the run's store; when the sandbox ``handle`` is still there), the usage written by a detached services daemon,
    and the run's sockets (and own socket directory) removed. Never raises; problems are
    listed in the report. Saving twice is harmless (the later copy wins).

    The session files go through ``redactor`` (the run's secrets). ``secret_names``: the
    run's secrets by name; when ``redactor`` does not know one of them (a host without
    that secret finishes the run) the session is not saved, since it could hold it."""
    report = FinishReport()
    if paths is not None:
        detached = Usage.load(paths.usage)
        if detached is not None:  # the services ran as a daemon (start_services)
            report.usage = detached
        try:
            report.session_id = await _session_from_journal(harness, paths, nonce)
        except (OSError, CorralError) as exc:
            report.errors.append(f"cannot read the journal: {exc}")
    if report.session_id is None:
        report.session_id = resumed_session
    known = {name for name, _value in redactor.items()} if redactor is not None else set()
    unknown = sorted(set(secret_names) - known)
    if unknown and report.session_id is not None and handle is not None:
        report.errors.append(
            f"the {harness.name} session is not saved: secrets {', '.join(unknown)} are not "
            "known on this host, so it cannot be redacted")
    elif report.session_id is not None and handle is not None and sessions is not None:
        try:
            report.saved = await save_session(
                handle, harness.name, harness.session_dirs, thread_id, report.session_id,
                store=sessions, run_id=run_id, redactor=redactor)
        except (OSError, CorralError) as exc:
            report.errors.append(f"cannot save the {harness.name} session: {exc}")
    for sock in sockets:
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.lstat(sock).st_mode):
                os.unlink(sock)
    if own_net_dir is not None:
        with contextlib.suppress(OSError):
            os.rmdir(own_net_dir)
    return report


def agent_prerequisites(harness: CliHarness, *, agents: Path | None = None,
                        upstream: Upstream | None = None
                        ) -> tuple[InstalledAgent | None, Upstream]:
    """The installed CLI and the model upstream for ``harness`` (default: from the host's
    ``ANTHROPIC_*`` / ``OPENAI_*`` variables). Raises :class:`PrerequisiteMissing` naming
    the fix (``corral agents install NAME``, the variable to set)."""
    pkg = harness.package.name
    # (an ACP agent given as a command, --agent-command, comes from no install)
    needs_install = getattr(harness, "needs_install", True)
    install = installed_at(pkg, harness.version, root=agents) if needs_install else None
    if install is None and needs_install:
        raise AgentNotInstalled(
            f"{pkg} {harness.version} is not installed: run `corral agents install "
            f"{pkg}" + (f" --version {harness.version}`"
                        if harness.version != harness.package.version else "`")
        )
    api = harness.upstream_api()
    upstream = upstream or Upstream.from_env(api)
    if upstream.api != api:
        raise ConfigError(f"{harness.name} speaks the {api} API; the upstream "
                          f"given is {upstream.api}")
    return install, upstream


async def _session_from_journal(harness: CliHarness, paths: JournalPaths, nonce: str | None
                                ) -> str | None:
    found: str | None = None
    reader = read_journal(paths, nonce=nonce, follow=False)
    try:
        async for item in reader:
            if not isinstance(item, Line) or not any(
                    m in item.data for m in harness.session_markers):
                continue
            try:
                obj = json.loads(item.data)
            except ValueError:
                continue
            if isinstance(obj, dict):
                sid = harness.session_id(obj)
                if sid:
                    found = sid
    finally:
        await reader.aclose()
    return found


def _run_token(run_id: str) -> str:
    return hashlib.sha256(run_id.encode()).hexdigest()[:12]


async def prepare_agent(
    harness: CliHarness,
    handle: Handle,
    request: AgentRequest,
    *,
    thread_id: str,
    run_id: str,
    upstream: Upstream | None = None,
    budget: int | None = None,
    egress: Sequence[str] | None = None,
    timeout: float | None = None,
    model_idle_timeout: float = 300.0,
    instructions: str | None = None,
    resume: bool = True,
    agents: Path | None = None,
    host_tools: bool = False,
    tools_token: str | None = None,
    redactor: Redactor | None = None,
    proxy_token: str | None = None,
    sessions: SessionStore | None = None,
    expected_session: str | None = None,
    refused_session: str | None = None,
    on_session_lost: str = "continue",
) -> PreparedAgent:
    """Prepare one run of ``harness`` in ``handle`` (see the module docstring).

    ``upstream``: where model calls go and with which key (default: from the host's
    ``ANTHROPIC_*`` / ``OPENAI_*`` variables). ``budget``: token budget of the run.
    ``egress``: allowlist (``host[:port]``) of an egress proxy; ``None`` = no egress at all.
    ``timeout``: the agent is stopped after that many seconds. ``instructions``: written
    to the CLI's global instructions file in the sandbox home. ``resume``: continue the
    thread's saved CLI session (restoring its files into a fresh sandbox). ``host_tools``:
    give the CLI the MCP server ``corral`` (the run's host tools): a forwarder to the
    socket in :attr:`PreparedAgent.host_tools`, the server in the CLI's MCP config, and its
    bearer token in the CLI's environment only (see :mod:`corral.tools._projection`); the
    caller serves the tools there. ``tools_token``: that bearer token (default: a fresh
    random one; the Runner passes :func:`corral.tools.run_tools_token`, which any host
    sharing its store derives again). ``redactor``: the run's secrets, redacted from the CLI
    session saved by :meth:`PreparedAgent.finish` (the proxy token joins them).
    ``proxy_token``: the run's token, which the model and egress proxies ask of every
    request (default: a fresh random one; the Runner passes :func:`run_proxy_token`).
    ``sessions``: the store holding the thread's saved CLI sessions (the Runner passes its
    store): ``resume`` restores from it, :meth:`PreparedAgent.finish` saves to it; without
    one the run neither resumes nor saves a session. ``expected_session``: the session
    the thread's history says it continues (its last turn's): when the store has none
    for it (or another one), the run starts a new conversation (or continues that
    other one) and says so (:attr:`PreparedAgent.session_lost`), as when the saved
    session's files cannot be resumed
    (:meth:`~corral.harness._cli_base.CliHarness.session_problem`), or when the saved
    session is ``refused_session`` (the thread's last turn failed because its agent
    refused it). ``on_session_lost``: ``"continue"`` (that) or ``"fail"``: raise :class:`SessionLost`
    instead (an ACP bridge is told to fail too when the agent refuses the session). The
    run's socket directory is closed to every uid but the sandbox's (and corral's).

    Raises :class:`PrerequisiteMissing` (CLI not installed, no API key on the host) and
    :class:`ConfigError` (sandbox created without :func:`with_agent_binds`, bad options).
    """
    if not isinstance(harness, CliHarness):
        raise ConfigError(f"prepare_agent needs an agent-CLI harness, got {harness!r}")
    if on_session_lost not in ON_SESSION_LOST:
        raise ConfigError(f"on_session_lost must be one of {', '.join(ON_SESSION_LOST)}, "
                          f"got {on_session_lost!r}")
    install, upstream = agent_prerequisites(harness, agents=agents, upstream=upstream)
    token = _run_token(run_id)
    secret = proxy_token or secrets.token_urlsafe(32)
    if redactor is not None:
        redactor.add(PROXY_TOKEN_NAME, secret)
    own_net: Path | None = None
    options: dict[str, Any] = dict(request.options)
    if handle.capabilities.isolated:
        binds = _handle_binds(handle)
        net_host = next((Path(h) for h, i in binds or [] if i == NET_MOUNT), None)
        agents_bound = any(i == AGENTS_MOUNT for _h, i in binds or [])
        if net_host is None or not agents_bound:
            raise ConfigError(
                "this sandbox was created without the agent binds: create it with "
                "corral.agents._prepare.with_agent_binds(spec) (it binds the agent CLIs and a "
                "socket directory for the model proxy)"
            )
        sock_dir_inside = NET_MOUNT
        options.setdefault("bin", harness.default_bin)
        # the sockets then open to the sandbox's gid only (corral._paths.socket_access)
        restrict_net_dir(net_host, await handle.host_gid()
                         if isinstance(handle, SandboxIds) else None)
    else:
        net_host = own_net = new_net_dir()
        restrict_net_dir(own_net, os.getegid())  # the agent runs as corral's own user
        sock_dir_inside = str(net_host)
        if install is not None:
            options.setdefault("bin", harness.bin_under(str(install.path)))
    model_socket = net_host / f"model-{token}.sock"
    if len(str(model_socket)) > MAX_SOCKET_PATH:
        raise ConfigError(f"socket path {model_socket} is too long for a unix socket; set "
                          "CORRAL_SHARED_DIR or CORRAL_HOME to a shorter directory")
    resumed: SavedSession | None = None
    lost: dict[str, str] | None = None
    if resume and "resume" not in options and sessions is not None:
        saved = await load_session(sessions, thread_id, harness.name) \
            if refused_session else None
        try:
            if refused_session and saved is not None and saved.session_id == refused_session:
                # not again (nor from a kept sandbox's copy): it would fail the same way
                raise SessionUnusable(refused_session, "the agent refused it in the "
                                      "thread's last turn")
            resumed = await restore_session(handle, thread_id, harness.name, store=sessions,
                                            check=harness.session_problem)
        except SessionUnusable as exc:
            lost = {"harness": harness.name, "expected": exc.session_id,
                    "reason": f"the saved session cannot be resumed: {exc.problem}"}
        if resumed is not None and resumed.session_id is not None:
            options["resume"] = resumed.session_id
            if expected_session and resumed.session_id != expected_session:
                # the thread's last turn went on in a session it could not save
                lost = {"harness": harness.name, "expected": expected_session,
                        "reason": f"the store holds an earlier session, "
                                  f"{resumed.session_id}, which this turn continues"}
        elif lost is None and expected_session:
            lost = {"harness": harness.name, "expected": expected_session,
                    "reason": "the saved session is not in the store"}
    if lost is not None and on_session_lost == "fail":
        raise SessionLost(f"thread {thread_id!r}: its {harness.name} session "
                          f"{lost['expected']} cannot be continued ({lost['reason']}) and "
                          'on_session_lost is "fail"')
    options["proxy_token"] = secret
    forward: list[dict[str, Any]] = [
        {"name": "model", "port": 0, "unix": f"{sock_dir_inside}/model-{token}.sock"}]
    egress_proxy: EgressProxy | None = None
    egress_socket: Path | None = None
    if egress is not None:
        egress_proxy = EgressProxy(list(egress), token=secret)
        egress_socket = net_host / f"egress-{token}.sock"
        forward.append({"name": "egress", "port": 0,
                        "unix": f"{sock_dir_inside}/egress-{token}.sock"})
        options["egress"] = True
    projection: HostToolsProjection | None = None
    if host_tools:

        projection = host_tools_projection(net_host, sock_dir_inside, run_id,
                                           token=tools_token)
        if len(str(projection.socket)) > MAX_SOCKET_PATH:
            raise ConfigError(f"socket path {projection.socket} is too long for a unix "
                              "socket; set CORRAL_SHARED_DIR or CORRAL_HOME to a shorter "
                              "directory")
        forward.append(projection.forward)
        servers = options.get("mcp_servers") or {}
        if not isinstance(servers, dict):
            raise ConfigError("agent option 'mcp_servers' must map names to server configs")
        options["mcp_servers"] = {**servers, **projection.mcp_servers}
        request = dataclasses.replace(request, env={**request.env, **projection.env})
        # The command gate's script, where the sandbox sees it read-only (the CLI's hook
        # command then names a file instead of carrying the whole script).
        gate = net_host / GATE_SCRIPT
        gate.write_bytes(Path(command_gate.__file__).read_bytes())
        gate.chmod(0o644)
        options["gate_script"] = f"{sock_dir_inside}/{GATE_SCRIPT}"
    # Forwarders the caller gave keep their place unless they reuse one of our names.
    ours = {f["name"] for f in forward}
    given = options.get("forward") or []
    if not isinstance(given, (list, tuple)):
        raise ConfigError("agent option 'forward' must be a list of forwarder entries")
    options["forward"] = [*(f for f in given if not (isinstance(f, dict)
                                                     and f.get("name") in ours)), *forward]
    if timeout is not None:
        options["timeout"] = timeout
    for rel in harness.guarded_workspace_files:
        # Read just before the CLI starts, while nothing of the agent runs in the sandbox.
        path = f"{request.workdir.rstrip('/')}/{rel}"
        if await handle.fs.exists(path):
            harness.check_workspace_file(rel, await handle.fs.read(path))
    cleared = list(harness.cleared_home_files)
    if harness.policy_mapping.permission_prompt:
        cleared += harness.gated_home_files
    for rel in cleared:
        try:
            await handle.fs.remove(f"{SANDBOX_HOME}/{rel}", recursive=True)
        except FileNotFoundError:
            pass
    if instructions is not None and harness.instructions_file:
        await handle.fs.write(f"{SANDBOX_HOME}/{harness.instructions_file}",
                              instructions.encode("utf-8"))
    for rel, data in harness.home_files(CliOptions.parse(options)).items():
        await handle.fs.write(f"{SANDBOX_HOME}/{rel}", data)
    for rel, data in harness.seed_home_files().items():
        if not await handle.fs.exists(f"{SANDBOX_HOME}/{rel}"):
            await handle.fs.write(f"{SANDBOX_HOME}/{rel}", data)
    request = dataclasses.replace(request, options=options)
    if harness.output_schema is not None and not harness.native_output:
        if not host_tools:
            raise ConfigError(f"the {harness.name} harness gives a structured result through "
                              "the host tool submit_result: prepare the agent with "
                              "host_tools=True (the Runner does)")
        request = dataclasses.replace(request, prompt=(request.prompt or "")
                                      + submit_instructions())
    command = harness.build_command(request)
    bridge = harness.bridge_config(request)
    if bridge is not None and on_session_lost == "fail":
        bridge["on_session_lost"] = "fail"
    proxy = ModelProxy(upstream, budget=budget, idle_timeout=model_idle_timeout,
                       max_failures=harness.max_model_failures, token=secret)
    return PreparedAgent(harness=harness, handle=handle, command=command, thread_id=thread_id,
                         run_id=run_id, install=install, model_proxy=proxy,
                         model_socket=model_socket, proxy_token=secret,
                         egress_proxy=egress_proxy,
                         egress_socket=egress_socket, resumed=resumed, session_lost=lost,
                         own_net_dir=own_net,
                         host_tools=projection, redactor=redactor, bridge=bridge,
                         sessions=sessions)


def harness_unavailable(name: str) -> PrerequisiteMissing | None:
    """Why a run of harness ``name`` with its defaults could not start on this host (its
    agent CLI is not installed, its model key is not set), or ``None`` when it can. The
    ``command`` harness always can; ``acp`` can when any of its agents can."""
    configs: list[dict[str, Any]] = (
        [{"agent": agent} for agent in sorted(ACP_AGENTS)] if name == "acp" else [{}])
    first: PrerequisiteMissing | None = None
    for config in configs:
        try:
            harness = build_harness(name, config)
        except ConfigError:
            return None  # needs what a request brings (a command): nothing missing here
        if not isinstance(harness, CliHarness):
            return None
        try:
            agent_prerequisites(harness)
        except PrerequisiteMissing as exc:
            first = first or exc
            continue
        return None
    if name == "acp" and isinstance(first, AgentNotInstalled):
        return AgentNotInstalled(
            "no ACP agent is installed: run `corral agents install opencode` (or gemini-cli, "
            "claude-code)")
    return first
