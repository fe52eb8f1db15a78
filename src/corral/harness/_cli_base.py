"""What every agent-CLI adapter shares: options, argv/env building, prompt delivery,
policy mapping results, session bookkeeping, and the JSON-lines translator skeleton.

An adapter (:mod:`corral.harness._claude_code`, :mod:`corral.harness._codex`) subclasses
:class:`CliHarness` and :class:`JsonlTranslator`. The harness builds the *inner* CLI
command; :func:`corral.agents._prepare.prepare_agent` wraps it with the in-sandbox entry
(:mod:`corral._insandbox.entry`) and starts the host-side proxies.

``AgentRequest.options`` understood by every CLI harness (all optional):

``model`` (str), ``resume`` (the CLI's session id to continue), ``base_url`` (the model
endpoint as the CLI sees it; default ``http://127.0.0.1:{corral.port.model}``, filled in
by the entry), ``proxy_token`` (the run's token, set by ``prepare_agent``: the API key the
CLI sends to the model proxy and the password of its egress proxy URL; the host proxies
refuse requests without it), ``api_key`` (default: ``proxy_token``, else a placeholder;
the host proxy swaps it for the real key),
``bin`` (the CLI's path; default: the pinned install under ``/opt/corral/agents``),
``forward`` (forwarders for the entry: a list of ``{"name","port","unix"}``; when set the
command is wrapped with the entry), ``timeout`` (seconds; the entry stops the CLI after
it), ``egress`` (bool: set ``HTTP(S)_PROXY`` to the ``egress`` forwarder), ``python``
(the sandbox's Python for the entry, default ``/usr/bin/python3``), ``max_retries``
(the CLI's own model retries, default 2), ``mcp_servers`` (``{name: {"command": str,
"args": [...], "env": {...}}}`` or ``{name: {"url": str, "headers": {...}}}``; header
values may name variables as ``${VAR}``), ``extra_args`` (list of str), ``env`` (extra
environment).

Translation (see :mod:`corral.harness._base`): state is rebuilt by replay
(``resume = "replay"``); ids come from the run id, journal offsets and the CLI's own ids;
lines that are not JSON objects become ``RAW`` events and unknown JSON event types become
``CUSTOM`` events named ``<harness>.<type>`` — nothing is dropped and no input makes the
translator raise.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from pydantic import field_validator

from ag_ui.core import (
    BaseEvent,
    ReasoningEndEvent,
    ReasoningMessageContentEvent,
    ReasoningMessageEndEvent,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
    RunErrorEvent,
    RunFinishedEvent,
)
from ag_ui.core import TokenUsage as AguiTokenUsage

from corral._errors import ConfigError
from corral.harness import _events as ev
from corral.harness._base import SESSION_LOST_EVENT as SESSION_LOST_EVENT
from corral.harness._base import AgentCommand, AgentRequest, RunContext
from corral.harness._config import HarnessConfig
from corral.harness._packages import AGENTS_MOUNT, KNOWN_AGENTS, AgentPackage, package_for
from corral._insandbox import command_gate as command_gate
from corral._insandbox import entry as sandbox_entry
from corral.net._model_proxy import PLACEHOLDER_KEY, ModelApi
from corral.tools._output import check_output_schema
from corral.journal._reader import Exit, JournalItem, Line
from corral.sandbox._contracts import signal_name
from corral.policy._policy import Policy

__all__ = [
    "SESSION_EVENT",
    "SESSION_LOST_EVENT",
    "SESSION_LOST_CODE",
    "CliHarness",
    "CliOptions",
    "JsonlTranslator",
    "PolicyLike",
    "PolicyMapping",
    "beyond_allow_all",
    "entry_argv",
    "transcript_problem",
]

SESSION_EVENT = "corral.session"
"""CUSTOM event carrying the CLI's session id: ``{"harness", "sessionId", ...}``."""
SESSION_LOST_CODE = "session_lost"
"""The error code of a run that ended because the thread's saved session could not be
continued (``on_session_lost="fail"``, or the agent CLI refused it)."""
STDERR_CHARS = 1000
NO_RESULT = "(no result: the agent stopped before the tool call finished)"


# ---------------------------------------------------------------- policy


@runtime_checkable
class PolicyLike(Protocol):
    """The parts of :class:`corral.policy._policy.Policy` a harness maps (structural)."""

    @property
    def allow(self) -> tuple[str, ...]: ...

    @property
    def ask(self) -> tuple[str, ...]: ...

    @property
    def deny(self) -> tuple[str, ...]: ...

    @property
    def default(self) -> str: ...

    @property
    def file_write(self) -> str: ...

    @property
    def network(self) -> str: ...


def allow_hosts(policy: PolicyLike | None) -> tuple[str, ...]:
    """The policy's egress allowlist (``()`` for policies without one: direct network when
    ``network`` is ``allow``). Read leniently so other :class:`PolicyLike` shapes work."""
    hosts = getattr(policy, "allow_hosts", None) or ()
    return tuple(str(h) for h in hosts)


def beyond_allow_all(policy: PolicyLike) -> list[str]:
    """What a policy asks beyond "allow everything" (command rules, a default or file-write
    rule other than ``allow``), one phrase each: for harnesses that can enforce nothing
    else and must refuse the rest at definition time."""
    problems = [f"{kind} rules {list(rules)}" for kind in ("allow", "ask", "deny")
                if (rules := getattr(policy, kind))]
    if policy.default != "allow":
        problems.append(f"default: {policy.default}")
    if policy.file_write != "allow":
        problems.append(f"file_write: {policy.file_write}")
    return problems


@dataclass(frozen=True, slots=True)
class PolicyMapping:
    """How a harness enforces a policy: CLI flags and config, and a report per rule."""

    harness: str
    argv: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    enforced: tuple[str, ...] = ()
    """One line per rule: ``"<rule> -> <how>"``."""
    bypass: bool = False
    """Whether the CLI runs with its own permission checks off (the sandbox is the
    boundary; no command rules apply)."""
    permission_prompt: bool = False
    """Whether the CLI asks corral's permission prompt tool (served by the run's MCP server
    ``corral``, :mod:`corral.tools._permission`), which decides with the policy live."""

    def report(self) -> str:
        """A human-readable report of what is enforced and how."""
        return "\n".join([f"{self.harness} enforces:", *(f"  {e}" for e in self.enforced)])


def policy_words(pattern: str) -> list[str] | None:
    """A policy pattern's words when it is a plain prefix pattern (``git status``,
    ``pytest *``): literal words, optionally ending with a bare ``*``. ``None`` otherwise
    (globs inside words, quotes, operators)."""
    words = pattern.split()
    if not words:
        return None
    body = words[:-1] if words[-1] == "*" and len(words) > 1 else words
    for w in body:
        if any(c in w for c in "*?[]{}'\"\\$`|&;<>()"):
            return None
    return words


# ---------------------------------------------------------------- options


_OPTION_KEYS = frozenset({
    "model", "resume", "base_url", "api_key", "proxy_token", "bin", "forward", "timeout",
    "egress", "python",
    "max_retries", "mcp_servers", "extra_args", "env", "argv", "gate_script",
    # the acp harness's own (its AcpConfig; the run spec keeps them)
    "agent", "agent_command",
})  # fmt: skip


SANDBOX_PYTHON = "/usr/bin/python3"
"""The sandbox's Python, which runs corral's in-sandbox scripts (entry, gate, redaction)."""


@dataclass(frozen=True, slots=True)
class CliOptions:
    """Typed form of ``AgentRequest.options`` for CLI harnesses (see module docstring)."""

    model: str | None = None
    resume: str | None = None
    base_url: str | None = None
    api_key: str = PLACEHOLDER_KEY
    proxy_token: str | None = field(default=None, repr=False)
    """The run's token (see the module docstring)."""
    bin: str | None = None
    forward: tuple[Mapping[str, Any], ...] | None = None
    timeout: float | None = None
    egress: bool = False
    python: str = SANDBOX_PYTHON
    max_retries: int = 2
    mcp_servers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    gate_script: str | None = None
    """The command gate's script as the sandbox sees it (read-only); ``None``: inlined."""
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> CliOptions:
        unknown = set(options) - _OPTION_KEYS
        if unknown:
            raise ConfigError(
                f"unknown agent option(s) {sorted(unknown)}; known: {sorted(_OPTION_KEYS)}"
            )

        def opt_str(key: str) -> str | None:
            v = options.get(key)
            if v is None:
                return None
            if not isinstance(v, str) or not v or "\0" in v:
                raise ConfigError(f"agent option {key!r} must be a non-empty string")
            return v

        timeout = options.get("timeout")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0
        ):
            raise ConfigError("agent option 'timeout' must be a positive number of seconds")
        retries = options.get("max_retries", 2)
        if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 20:
            raise ConfigError("agent option 'max_retries' must be an integer from 0 to 20")
        forward = options.get("forward")
        if forward is not None:
            if not isinstance(forward, (list, tuple)) or not all(
                isinstance(f, Mapping) and isinstance(f.get("name"), str)
                and isinstance(f.get("unix"), str) and isinstance(f.get("port", 0), int)
                for f in forward
            ):
                raise ConfigError("agent option 'forward' must be a list of "
                                  "{'name': str, 'port': int, 'unix': str}")
            forward = tuple(forward)
        mcp = options.get("mcp_servers") or {}
        if not isinstance(mcp, Mapping) or not all(
            isinstance(k, str) and k and isinstance(v, Mapping) for k, v in mcp.items()
        ):
            raise ConfigError("agent option 'mcp_servers' must map names to server configs")
        for name, server in mcp.items():
            if not isinstance(server.get("command"), str) and not isinstance(server.get("url"), str):
                raise ConfigError(f"MCP server {name!r} needs a 'command' (str) or a 'url'")
        extra = options.get("extra_args") or ()
        if not isinstance(extra, (list, tuple)) or not all(isinstance(a, str) for a in extra):
            raise ConfigError("agent option 'extra_args' must be a list of strings")
        env = options.get("env") or {}
        if not isinstance(env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise ConfigError("agent option 'env' must map strings to strings")
        token = opt_str("proxy_token")
        if token is not None and not all(c.isalnum() or c in "-_" for c in token):
            # it goes into a proxy URL's userinfo as is
            raise ConfigError("agent option 'proxy_token' must be URL-safe base64")
        return cls(
            model=opt_str("model"),
            resume=opt_str("resume"),
            base_url=opt_str("base_url"),
            api_key=opt_str("api_key") or token or PLACEHOLDER_KEY,
            proxy_token=token,
            bin=opt_str("bin"),
            forward=forward,
            timeout=float(timeout) if timeout is not None else None,
            egress=bool(options.get("egress", False)),
            python=opt_str("python") or SANDBOX_PYTHON,
            max_retries=retries,
            mcp_servers=dict(mcp),
            gate_script=opt_str("gate_script"),
            extra_args=tuple(extra),
            env=dict(env),
        )


GATE_TIMEOUT = 86400
"""Seconds a CLI lets the command gate run: longer than any approval wait, because a hook
that times out counts as a non-blocking error and the command would run unchecked."""


def bash_gate_command(opts: CliOptions) -> str:
    """The shell command of the command gate hook (:mod:`corral._insandbox.command_gate`) for
    a run whose corral MCP server is ``opts.mcp_servers["corral"]``: the sandbox's Python
    runs the gate from ``opts.gate_script`` (a read-only file, see
    :func:`corral.agents._prepare.prepare_agent`), else from its source inlined (base64);
    either way nothing the agent can write is involved."""
    url = opts.mcp_servers["corral"]["url"]
    # how long it asks again while no driver answers: the run's own time at most
    args = shlex.quote(url) + (f" {opts.timeout:g}" if opts.timeout is not None else "")
    if opts.gate_script:
        # A file in the sandbox's read-only socket directory: a short command (the CLI
        # quotes it back to the model in every refusal).
        return f"{shlex.quote(opts.python)} -I -S {shlex.quote(opts.gate_script)} {args}"
    source = base64.b64encode(Path(command_gate.__file__).read_bytes()).decode()
    return (f"{shlex.quote(opts.python)} -I -S -c "
            f"'import base64;exec(base64.b64decode(\"{source}\"))' {args}")


def egress_env(opts: CliOptions) -> dict[str, str]:
    """The proxy variables of a CLI with ``egress``: the ``egress`` forwarder, with the
    run's token as the password its clients send (``Proxy-Authorization: Basic``)."""
    if not opts.egress:
        return {}
    auth = f"corral:{opts.proxy_token}@" if opts.proxy_token else ""
    proxy = "http://" + auth + "127.0.0.1:{corral.port.egress}"
    return {"HTTP_PROXY": proxy, "HTTPS_PROXY": proxy, "http_proxy": proxy,
            "https_proxy": proxy, "ALL_PROXY": proxy,
            # the sandbox's own loopback: the model endpoint, never the host's
            "NO_PROXY": "127.0.0.1,localhost,::1", "no_proxy": "127.0.0.1,localhost,::1"}


def entry_argv(python: str, command: Sequence[str], *,
               forward: Sequence[Mapping[str, Any]], announce: bool = False) -> list[str]:
    """Wrap ``command`` with the in-sandbox entry (the model/egress forwarders).
    ``announce``: the entry first prints the ports it bound as one stdout line (for the
    ACP bridge, which reads the agent's stdout)."""
    source = Path(sandbox_entry.__file__).read_text()
    config: dict[str, Any] = {"forward": [dict(f) for f in forward]}
    if announce:
        config["announce"] = True
    return [python, "-I", "-S", "-c", source, json.dumps(config, separators=(",", ":")), "--",
            *command]


# ---------------------------------------------------------------- configuration


class CliConfig(HarnessConfig):
    """What an agent-CLI harness is built from (the rest of a run's harness configuration
    are its options, :class:`CliOptions`, checked when the command is built)."""

    version: str | None = None
    """The agent CLI's version (default: the pinned one)."""
    policy: Any = None
    """The policy the CLI enforces: a :class:`~corral.policy._policy.Policy` or its
    ``to_dict()`` form."""
    permission_prompt: bool = False
    """The CLI asks corral (on the run's MCP server) before acting."""

    @field_validator("policy", mode="before")
    @classmethod
    def _policy(cls, policy: Any) -> PolicyLike | None:
        if isinstance(policy, Mapping):
            try:
                return Policy(**dict(policy))
            except TypeError as exc:
                raise ConfigError(f"bad policy in the run spec: {exc}") from None
        if policy is not None and not isinstance(policy, PolicyLike):
            raise ConfigError("'policy' must be a Policy or a mapping")
        return policy

    @field_validator("permission_prompt", mode="before")
    @classmethod
    def _prompt(cls, value: Any) -> bool:
        return value is True


# ---------------------------------------------------------------- harness base


class CliHarness:
    """Base of agent-CLI harnesses. Subclasses set the class attributes and implement
    :meth:`cli_argv`, :meth:`cli_env`, :meth:`map_policy` and :meth:`translator`."""

    name: ClassVar[str] = ""
    config_model: ClassVar[type[HarnessConfig]] = CliConfig
    needs_agent_runtime: ClassVar[Literal[True]] = True  # harness._base.NeedsAgentRuntime
    model_api: ClassVar[ModelApi] = "anthropic"
    session_dirs: ClassVar[tuple[str, ...]] = ()
    """Home-relative directories holding the CLI's sessions (saved for resume)."""
    instructions_file: ClassVar[str] = ""
    """Home-relative file the CLI reads global instructions from."""
    gated_home_files: ClassVar[tuple[str, ...]] = ()
    """Home-relative files removed before a run under corral's command gate: CLI
    configuration (hooks above all) something in the sandbox may have planted for it."""
    cleared_home_files: ClassVar[tuple[str, ...]] = ()
    """Home-relative files removed before every run: CLI configuration that would run
    code outside the CLI's permission checks (plugins, local MCP servers) if something in
    the sandbox planted it."""

    @property
    def guarded_workspace_files(self) -> tuple[str, ...]:
        """Workdir-relative files read before the run and given to
        :meth:`check_workspace_file` (a repository's own CLI configuration that could loosen
        the policy's enforcement). None by default."""
        return ()

    def check_workspace_file(self, rel: str, data: bytes) -> None:
        """Raise :class:`~corral._errors.ConfigError` if the workspace's ``rel`` (one of
        :attr:`guarded_workspace_files`) would loosen the policy's enforcement."""
    resume: Literal["offset", "replay"] = "replay"
    session_markers: ClassVar[tuple[bytes, ...]] = (b"session_id", b"thread_id")
    """Bytes an output line carrying the session id contains (a cheap filter before
    :meth:`session_id` parses a line)."""
    native_output: ClassVar[bool] = False
    """The CLI returns a structured result its own way (:meth:`use_output_schema`); else
    the agent gives it through the host tool ``submit_result``
    (:mod:`corral.tools._output`)."""
    output_schema: dict[str, Any] | None = None
    """The run's output schema (a checked JSON Schema), or ``None``."""
    max_model_failures: ClassVar[int | None] = None
    """Model requests that may fail in a row (upstream unreachable, timed out, 5xx) before
    the model proxy refuses the run's further requests with a 403: for CLIs that would
    otherwise retry a dead endpoint forever. ``None``: no limit."""

    def upstream_api(self) -> ModelApi:
        """The model API this harness's runs call (the proxy's upstream)."""
        return self.model_api

    def __init__(self, *, version: str | None = None, policy: PolicyLike | None = None,
                 permission_prompt: bool = False) -> None:
        """``permission_prompt``: the run serves corral's permission prompt tool (a Runner
        run with host tools), so a harness that can ask it enforces the policy live."""
        self.package: AgentPackage = package_for(self.name)
        self.version = version or self.package.version
        self.policy = policy
        self.permission_prompt = permission_prompt
        # Definition time: an unenforceable rule raises here, not when the agent runs.
        self.policy_mapping = self.map_policy(policy)

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> CliHarness:
        """Build from a run's harness configuration, validated by :attr:`config_model`
        (what the registry does, :func:`corral.harness._registry.build_harness`)."""
        return cls(**cls.config_model.factory_kwargs(cls.name, spec))

    def use_output_schema(self, schema: Mapping[str, Any]) -> None:
        """Ask the CLI for a result matching ``schema`` (checked with
        :func:`corral.tools._output.check_output_schema`)."""
        self.output_schema = check_output_schema(schema)

    # -- for subclasses
    def map_policy(self, policy: PolicyLike | None) -> PolicyMapping:
        """Map a policy onto the CLI's permission system; raise :class:`ConfigError`
        listing every rule the CLI cannot enforce."""
        raise NotImplementedError

    def cli_argv(self, opts: CliOptions) -> list[str]:
        """The CLI's arguments (after the executable)."""
        raise NotImplementedError

    def cli_env(self, opts: CliOptions, base_url: str) -> dict[str, str]:
        """The CLI's environment (model endpoint, placeholder key, no telemetry)."""
        raise NotImplementedError

    def session_id(self, obj: Mapping[str, Any]) -> str | None:
        """The CLI's session id if this output event carries it."""
        raise NotImplementedError

    def session_problem(self, files: Mapping[str, bytes], session_id: str) -> str | None:
        """Why the saved session ``session_id`` (its files: home-relative path → bytes)
        cannot be resumed, checked before the CLI starts (its transcript is missing or
        holds nothing the CLI could read), or ``None`` when it looks whole. Only what
        the CLI certainly refuses: anything else is the CLI's to decide. None by
        default."""
        return None

    def home_files(self, opts: CliOptions) -> dict[str, bytes]:
        """Files (home-relative path → content) written into the sandbox home before each
        run (the CLI's configuration, for CLIs that take it from a file only)."""
        return {}

    def seed_home_files(self) -> dict[str, bytes]:
        """Files (home-relative path → content) written into the sandbox home before a run
        only where no such file is yet: state the CLI would create on its first start in
        an empty home, and keeps to itself after (a later run on the thread finds the
        CLI's own)."""
        return {}

    def translator(self, ctx: RunContext, *, at_offset: int | None = None) -> JsonlTranslator:
        raise NotImplementedError

    # -- shared
    @property
    def default_bin(self) -> str:
        """The CLI's path inside an isolated sandbox (the agents root is bound there)."""
        return self.bin_under(f"{AGENTS_MOUNT}/{self.package.name}/{self.version}")

    def bin_under(self, install_dir: str) -> str:
        """The CLI's path in an install directory (``<dir>/node_modules/.bin/<bin>``)."""
        return f"{install_dir}/node_modules/.bin/{KNOWN_AGENTS[self.package.name].bin}"

    @property
    def bridged(self) -> bool:
        """Whether the agent is driven by corral's host-side ACP bridge (see
        :meth:`bridge_config`): the bridge runs next to the journal supervisor, on the host."""
        return False

    def bridge_config(self, request: AgentRequest) -> dict[str, Any] | None:
        """For a harness whose agent is driven by a host-side bridge (``acp``): the
        bridge's part of its configuration for this request (see
        :mod:`corral._insandbox.acp_client`); ``None``: the CLI runs on its own."""
        return None

    def default_base_url(self) -> str:
        return "http://127.0.0.1:{corral.port.model}"

    def build_command(self, request: AgentRequest) -> AgentCommand:
        """The agent command: the CLI (wrapped with the in-sandbox entry when
        ``options["forward"]`` is set), the prompt on stdin."""
        opts = CliOptions.parse(request.options)
        if request.prompt is None or not request.prompt.strip():
            raise ConfigError(f"the {self.name} harness needs a non-empty prompt")
        argv = [opts.bin or self.default_bin, *self.cli_argv(opts)]
        base_url = opts.base_url or self.default_base_url()
        env = {"TERM": "dumb", "NO_COLOR": "1"}
        env.update(self.cli_env(opts, base_url))
        env.update(self.policy_mapping.env)
        env.update(egress_env(opts))
        env.update(request.env)
        env.update(opts.env)
        if opts.forward is not None:
            argv = entry_argv(opts.python, argv, forward=opts.forward)
        elif "{corral.port." in base_url:
            raise ConfigError(
                f"the {self.name} harness needs a model endpoint: run it through "
                "corral.agents._prepare.prepare_agent, or pass options base_url=..."
            )
        return AgentCommand(argv=argv, env=env, cwd=request.workdir,
                            stdin=request.prompt.encode("utf-8"), timeout=opts.timeout)


# ---------------------------------------------------------------- translator base


def token_usage(model: str | None = None, *, input_tokens: int | None = None,
                output_tokens: int | None = None, cached: int | None = None,
                cache_write: int | None = None, reasoning: int | None = None,
                provider: str | None = None) -> AguiTokenUsage:
    total = None
    if input_tokens is not None or output_tokens is not None:
        total = (input_tokens or 0) + (output_tokens or 0) + (cached or 0) + (cache_write or 0)
    return AguiTokenUsage(provider=provider, model=model, input_tokens=input_tokens,
                          output_tokens=output_tokens, total_tokens=total,
                          reasoning_tokens=reasoning, cached_input_tokens=cached,
                          cache_write_input_tokens=cache_write)


def as_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def as_str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def flatten_text(content: Any) -> str:
    """Text of a tool result / message content (string or list of blocks)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and isinstance(block.get("text"), str):
                parts.append(block["text"])
            elif isinstance(block, dict):
                parts.append(json.dumps(block, sort_keys=True))
        return "\n".join(parts)
    return json.dumps(content, sort_keys=True, default=str)


class JsonlTranslator:
    """Skeleton of a translator for a CLI that prints one JSON object per line.

    Subclasses implement :meth:`on_event` and may override :meth:`terminal`. Helpers keep
    track of open tool calls so that every ``TOOL_CALL_START`` gets an end and a result,
    at the latest when the run ends.
    """

    harness: ClassVar[str] = ""
    resume_refusals: ClassVar[tuple[str, ...]] = ()
    """What the CLI says (in its error or on stderr) when it refuses the session it was
    asked to resume: a run that fails saying one of these, while resuming, ends with
    "the saved … session … could not be resumed" (:meth:`terminal`)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.finished = False
        self.session: str | None = None
        self.lost_reason: str | None = None
        """Why the session the run was to resume was not (a subclass that learns it
        sets it before the new session's id comes); see :meth:`session_event`."""
        self.open_tools: dict[str, str] = {}
        """tool_call_id -> name, started but without a result yet."""
        self.done_tools: set[str] = set()
        self.error_message: str | None = None
        self.error_code: str | None = None
        self.succeeded = False
        self.result: Any = None
        self.usage: list[AguiTokenUsage] | None = None
        self._offset = 0

    # -- protocol
    def start(self) -> list[BaseEvent]:
        return [ev.run_started(self.ctx.thread_id, self.ctx.run_id)]

    def feed(self, item: JournalItem) -> list[BaseEvent]:
        if self.finished:
            return []
        if isinstance(item, Exit):
            self.finished = True
            out = self.close_tools()
            out.append(self.terminal(item))
            return out
        return self._line(item)

    def _line(self, line: Line) -> list[BaseEvent]:
        self._offset = line.start_offset
        text = line.data.decode("utf-8", "replace")
        if not text.strip():
            return []
        try:
            obj = json.loads(text)
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            return [ev.raw({"line": text, "offset": line.start_offset}, self.harness)]
        try:
            return self.on_event(obj)
        except Exception as exc:  # noqa: BLE001 - hostile output must never stop a run
            return [ev.raw({"line": text, "offset": line.start_offset,
                            "translatorError": f"{exc.__class__.__name__}: {exc}"},
                           self.harness)]

    # -- for subclasses
    def on_event(self, obj: dict[str, Any]) -> list[BaseEvent]:
        raise NotImplementedError

    def id(self, kind: str, index: int = 0) -> str:
        """A deterministic id for something that starts on the current line."""
        suffix = f"-{index}" if index else ""
        return f"{self.ctx.run_id}-{kind}{self._offset}{suffix}"

    def custom(self, name: str, value: Any) -> BaseEvent:
        return ev.custom(f"{self.harness}.{name}", value)

    def session_event(self, session_id: str, **extra: Any) -> list[BaseEvent]:
        """``CUSTOM corral.session`` the first time the run reports ``session_id``; when
        the run was to resume another session (``ctx.resumed_session``) and this is the
        first session it reports, ``CUSTOM corral.session_lost`` before it: the agent
        began a new conversation."""
        if session_id == self.session:
            return []
        first = self.session is None
        self.session = session_id
        out: list[BaseEvent] = []
        expected = self.ctx.resumed_session
        if first and expected and session_id != expected:
            out.append(ev.custom(SESSION_LOST_EVENT, {
                "harness": self.harness, "expected": expected, "sessionId": session_id,
                "reason": self.lost_reason or "the agent began a new session instead of "
                "resuming the saved one"}))
        value = {"harness": self.harness, "sessionId": session_id}
        value.update({k: v for k, v in extra.items() if v is not None})
        out.append(ev.custom(SESSION_EVENT, value))
        return out

    def text(self, message_id: str, text: str) -> list[BaseEvent]:
        out: list[BaseEvent] = [ev.text_start(message_id)]
        if text:
            out.append(ev.text_content(message_id, text))
        out.append(ev.text_end(message_id))
        return out

    def reasoning(self, message_id: str, text: str) -> list[BaseEvent]:
        out: list[BaseEvent] = [ReasoningStartEvent(message_id=message_id),
                                ReasoningMessageStartEvent(message_id=message_id,
                                                           role="reasoning")]
        if text:
            out.append(ReasoningMessageContentEvent(message_id=message_id, delta=text))
        out += [ReasoningMessageEndEvent(message_id=message_id),
                ReasoningEndEvent(message_id=message_id)]
        return out

    def tool_start(self, tool_id: str, name: str, args: Any = None, *,
                   parent: str | None = None) -> list[BaseEvent]:
        """START (+ ARGS) + END for a new tool call; nothing if it was seen already."""
        if tool_id in self.open_tools or tool_id in self.done_tools:
            return []
        self.open_tools[tool_id] = name
        out: list[BaseEvent] = [ev.tool_call_start(tool_id, name or "tool", parent)]
        if args is not None:
            delta = args if isinstance(args, str) else json.dumps(args, sort_keys=True)
            if delta:
                out.append(ev.tool_call_args(tool_id, delta))
        out.append(ev.tool_call_end(tool_id))
        return out

    def tool_result(self, tool_id: str, content: str, *, name: str = "tool",
                    args: Any = None) -> list[BaseEvent]:
        """The result of a tool call (started here first if it never was)."""
        if tool_id in self.done_tools:
            return []
        out = self.tool_start(tool_id, name, args) if tool_id not in self.open_tools else []
        out.append(ev.tool_call_result(f"{tool_id}-result", tool_id, content))
        self.open_tools.pop(tool_id, None)
        self.done_tools.add(tool_id)
        return out

    def close_tools(self) -> list[BaseEvent]:
        out: list[BaseEvent] = []
        for tool_id in list(self.open_tools):
            out += self.tool_result(tool_id, NO_RESULT)
        return out

    def terminal(self, exit: Exit) -> BaseEvent:
        """RUN_FINISHED when the CLI reported success and exited 0, else RUN_ERROR with the
        CLI's own message (or the exit status and the tail of stderr)."""
        ok_exit = exit.code == 0 and exit.signal is None
        if self.succeeded and ok_exit and self.error_message is None:
            return RunFinishedEvent(thread_id=self.ctx.thread_id, run_id=self.ctx.run_id,
                                    result=self.result, usage=self.usage)
        meta: dict[str, Any] = {"exitCode": exit.code,
                                "signal": signal_name(exit.signal) if exit.signal else None}
        stderr = exit.stderr_tail.decode("utf-8", "replace").strip()[-STDERR_CHARS:]
        if self.error_message:
            message = self.error_message
            code = self.error_code or f"{self.harness}:error"
        elif exit.signal is not None:
            message = f"{self.harness} was killed by {signal_name(exit.signal)}"
            code = f"signal:{signal_name(exit.signal)}"
        elif exit.code == 124 and "timeout" in stderr:
            message = f"{self.harness} ran longer than its timeout and was stopped"
            code = "timeout"
        elif ok_exit:
            message = f"{self.harness} exited without reporting a result"
            code = f"{self.harness}:no-result"
        else:
            message = f"{self.harness} exited with code {exit.code}"
            code = f"exit:{exit.code}"
        if stderr and not self.error_message:
            message += ": " + stderr
        elif stderr:
            meta["stderr"] = stderr
        refused = self._refused(message, stderr)
        if refused:
            meta["agentCode"] = code
            message, code = refused, SESSION_LOST_CODE
        return RunErrorEvent(message=message, code=code, metadata=meta, usage=self.usage)

    def _refused(self, message: str, stderr: str) -> str | None:
        """The error of a run whose CLI refused the session it was to resume (it said
        one of :attr:`resume_refusals`), naming that session, else ``None``."""
        expected = self.ctx.resumed_session
        if not expected or self.error_code == SESSION_LOST_CODE:
            return None
        said = f"{message}\n{stderr}"
        if not any(r in said for r in self.resume_refusals):
            return None
        words = message.split(": ", 1)[1] if message.startswith(f"{self.harness} exited") \
            and ": " in message else message
        words = " ".join(_ANSI.sub("", words).split())
        return (f"the saved {self.harness} session {expected} could not be resumed: "
                f"{words[:STDERR_CHARS]}")


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def transcript_problem(files: Mapping[str, bytes], session_id: str, *, under: str,
                       named: str) -> str | None:
    """For :meth:`CliHarness.session_problem` of a CLI keeping a session as a JSON-lines
    transcript: why ``files`` hold no usable transcript of ``session_id`` (a file under
    ``under`` whose name contains ``named``), or ``None``. Usable: at least one line is a
    JSON object (a CLI reads what it can of a damaged transcript; one without any line
    it can read, it refuses)."""
    found = [p for p in files if p.startswith(under) and named in p.rsplit("/", 1)[-1]]
    if not found:
        return f"its transcript (…{named}…) is not among the saved files"
    for path in found:
        for line in files[path].splitlines():
            try:
                if isinstance(json.loads(line), dict):
                    return None
            except ValueError:
                continue
    return f"its transcript {found[0].rsplit('/', 1)[-1]} holds no line the CLI can read"
