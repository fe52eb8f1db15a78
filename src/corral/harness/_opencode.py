"""opencode (``opencode-ai``), run as ``opencode run --format json -m PROVIDER/MODEL`` with
the prompt on stdin.

Model traffic: ``--model provider/model`` picks the upstream API. ``anthropic/*`` calls
Anthropic Messages (``/v1/messages``), ``openai/*`` the OpenAI Responses API
(``/v1/responses``); the host proxy for that API adds the real key. The configuration
comes in ``OPENCODE_CONFIG_CONTENT`` (in the CLI's environment, out of the agent's reach;
it outranks any ``opencode.json`` planted in the home, and project configuration is off
with ``OPENCODE_DISABLE_PROJECT_CONFIG``; external plugins, which would run code outside
its permission checks, are off with ``OPENCODE_PURE``, and ``~/.config/opencode`` is removed
before every run, since its local MCP servers would too): the provider's ``options.baseURL`` is the
in-sandbox forwarder, its ``apiKey`` a placeholder, and the model is declared in the
provider's ``models`` (the models catalogue is never fetched). Autoupdate, sharing, LSP
downloads, default plugins and Claude Code compatibility are off.

opencode retries a failing model endpoint forever, silently; the harness asks the model
proxy to refuse a run's requests after :attr:`OpencodeHarness.max_model_failures`
failures in a row (a 403, which opencode does not retry), so a dead or hanging endpoint
ends the run with ``RUN_ERROR``.

Events (``--format json``) → AG-UI:

* the first event's ``sessionID`` → ``CUSTOM corral.session`` ``{harness, sessionId}``;
* ``step_start`` / ``step_finish`` → ``STEP_STARTED`` / ``STEP_FINISHED`` (``step-N``);
  ``step_finish`` tokens add up to the usage of ``RUN_FINISHED``; a ``step_finish`` with
  reason ``stop`` is the run's success;
* ``text`` → a text message, ``reasoning`` → ``REASONING_*``;
* ``tool_use`` (one event per finished call) → a tool call and its result (the output,
  or the error for refused and failed calls); ``bash`` is the tool ``shell``
  (``{"command": ...}``), host tools (opencode names them ``corral_<tool>``) go by their
  own names;
* ``error`` → the ``RUN_ERROR`` message; anything else → ``CUSTOM opencode.<type>``.

Policy mapping (opencode's own ``permission`` configuration, last matching rule wins):
``bash`` gets ``"*"`` → the default, then each allow pattern, then each deny pattern
(deny wins); file writes → ``edit``; network ``deny`` (or an egress allowlist) →
``webfetch: deny``; ``external_directory`` is ``allow`` (the sandbox confines paths; its
default, ask, would reject every command naming a path outside the workspace).

**Ask rules** (and ``default: ask``, ``file_write: ask``, or a pattern that is not a plain
word prefix, which opencode's wildcards cannot express): ``opencode run`` has no approval
channel (it rejects every ask itself), so such a run is *routed* through ``opencode acp``,
the same binary in the same sandbox, driven by corral's host-side ACP bridge exactly as
``--harness acp --agent opencode`` is (:class:`corral.harness._acp_agents.OpencodeAcp`:
``permission.bash = "ask"`` for every command, each permission request decided live by
corral's policy, ask → a corral approval). The run stays an ``opencode`` run: its record,
its saved session (the same opencode session ids and sqlite store: ``session/load``
continues a session ``opencode run`` began, and back), structured output (the host tool
``submit_result``), usage (the model proxy), cancel and takeover (the bridge outlives the
driver under the supervisor). What differs are the events (the ACP translator's:
:mod:`corral.harness._acp`, text streamed in chunks, no ``STEP_*``, tools named by their
ACP kind, a refused call's result ``denied: …``; ``RUN_FINISHED``'s usage is what
``opencode acp`` reports, its last model call's tokens, while the record's usage is the
model proxy's in both modes) and the providers: the bridge runs on
the host next to the supervisor, so a provider whose supervisor lives in the sandbox
(docker) refuses such a policy at start, in one line. The decision is a pure function of
the policy (:func:`acp_reasons`), so a successor host rebuilds the same harness.

Sessions live in sqlite under ``~/.local/share/opencode``; a later prompt continues with
``opencode run -s <session id>`` (routed: ``session/load``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final

from ag_ui.core import BaseEvent, StepFinishedEvent, StepStartedEvent
from pydantic import field_validator

from corral._errors import ConfigError
from corral.harness._base import AgentCommand, AgentRequest, RunContext
from corral.harness._config import HarnessConfig
from corral.harness._cli_base import (
    CliConfig,
    CliHarness,
    CliOptions,
    JsonlTranslator,
    PolicyLike,
    PolicyMapping,
    allow_hosts,
    as_int,
    as_str,
    policy_words,
    token_usage,
)
from corral.net._model_proxy import ModelApi
from corral.tools._names import SERVER_NAME

if TYPE_CHECKING:
    from corral.harness._acp import AcpHarness, AcpTranslator

__all__ = ["DEFAULT_MODEL", "OpencodeHarness", "OpencodeTranslator", "acp_reasons",
           "opencode_config"]

DEFAULT_MODEL = "anthropic/claude-sonnet-4-5"
_PROVIDERS: dict[str, ModelApi] = {"anthropic": "anthropic", "openai": "openai"}
_MODEL = re.compile(r"^([a-z]+)/([A-Za-z0-9][A-Za-z0-9._:@-]{0,127})$")
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
MODEL_LIMITS = {"context": 200000, "output": 8192}
"""Declared for the model (the catalogue is not fetched); ``output`` is opencode's
``max_tokens``, low enough for every current model."""

ENV = {
    # Plugins are code opencode runs as it starts, outside its permission checks: ones
    # planted in the sandbox home (by an earlier run's agent) would bypass the policy.
    "OPENCODE_PURE": "1",
    "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_CLAUDE_CODE": "1",
    "OPENCODE_DISABLE_EMBEDDED_WEB_UI": "1",
}


def split_model(model: str) -> tuple[str, str]:
    """``provider/model`` → ``(provider, model)``; :class:`ConfigError` for anything else."""
    m = _MODEL.match(model)
    if m is None or m.group(1) not in _PROVIDERS:
        raise ConfigError(f"opencode model {model!r}: give provider/model with provider "
                          f"{' or '.join(sorted(_PROVIDERS))} (like {DEFAULT_MODEL})")
    return m.group(1), m.group(2)


class OpencodeConfig(CliConfig):
    """What the opencode harness is built from: :class:`CliConfig` plus the run's
    ``model`` (``provider/model``)."""

    model: str | None = None

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, model: Any) -> str | None:
        if model is not None and not isinstance(model, str):
            raise ConfigError("opencode: 'model' must be a string like " + DEFAULT_MODEL)
        return model


def acp_reasons(policy: PolicyLike | None) -> list[str]:
    """What of ``policy`` ``opencode run`` cannot enforce and ``opencode acp`` can (corral's
    policy answering each permission request), one phrase each: ask rules, ``default:
    ask``, ``file_write: ask``, patterns that are not plain word prefixes. Non-empty: the
    run goes through ``opencode acp`` (see the module docstring)."""
    if policy is None:
        return []
    reasons: list[str] = []
    if policy.ask:
        reasons.append(f"ask rules {list(policy.ask)}")
    if policy.default == "ask":
        reasons.append("default: ask")
    if policy.file_write == "ask":
        reasons.append("file_write: ask")
    odd = [p for kind in ("allow", "deny") for p in getattr(policy, kind)
           if policy_words(p) is None]
    if odd:
        reasons.append(f"patterns {odd} (not plain word prefixes)")
    return reasons


class OpencodeHarness(CliHarness):
    """The opencode adapter (see the module docstring)."""

    name: ClassVar[str] = "opencode"
    config_model: ClassVar[type[HarnessConfig]] = OpencodeConfig
    session_dirs: ClassVar[tuple[str, ...]] = (".local/share/opencode",)
    instructions_file: ClassVar[str] = ".config/opencode/AGENTS.md"
    max_model_failures: ClassVar[int | None] = 3
    session_markers: ClassVar[tuple[bytes, ...]] = (b"sessionID",)
    # opencode's global configuration can start commands of its own (local MCP servers)
    # that no permission rule checks; corral's comes in the environment instead.
    cleared_home_files: ClassVar[tuple[str, ...]] = (".config/opencode", ".opencode")

    acp: AcpHarness | None = None
    """The ``opencode acp`` harness this run goes through when its policy needs approvals
    (:func:`acp_reasons`); ``None``: ``opencode run``."""

    def __init__(self, *, version: str | None = None, policy: PolicyLike | None = None,
                 permission_prompt: bool = False, model: str | None = None) -> None:
        self.model = model or DEFAULT_MODEL
        split_model(self.model)  # a bad model is refused here, not at the first run
        super().__init__(version=version, policy=policy, permission_prompt=permission_prompt)

    @property
    def bridged(self) -> bool:
        """Routed through ``opencode acp`` (its policy needs approvals)."""
        return self.acp is not None

    @property
    def provider(self) -> str:
        """The model's provider (``anthropic`` of ``anthropic/claude-sonnet-4-5``)."""
        return split_model(self.model)[0]

    def upstream_api(self) -> ModelApi:
        return _PROVIDERS[self.provider]

    def default_base_url(self) -> str:
        return "http://127.0.0.1:{corral.port.model}/v1"

    def map_policy(self, policy: PolicyLike | None) -> PolicyMapping:
        self.acp = None
        vars(self).pop("session_markers", None)
        self.permission: dict[str, Any] = {"bash": "allow", "edit": "allow",
                                           "webfetch": "allow", "external_directory": "allow"}
        if policy is None:
            return PolicyMapping(self.name, (), {}, ("default: allow -> permission bash/edit: "
                                                     "allow (the sandbox is the boundary)",),
                                 bypass=True)
        reasons = acp_reasons(policy)
        if reasons:
            return self._route(policy, reasons)
        problems: list[str] = []
        enforced: list[str] = []
        bash: dict[str, str] = {"*": policy.default}
        enforced.append(f"default: {policy.default} -> permission.bash['*'] = "
                        f"{policy.default!r}")
        for kind in ("allow", "deny"):
            for pattern in getattr(policy, kind):
                words = policy_words(pattern)
                assert words is not None  # (acp_reasons routes the others)
                rule = " ".join(words)
                bash[rule] = kind
                enforced.append(f"{kind} {pattern!r} -> permission.bash[{rule!r}] = {kind!r}")
        if policy.file_write == "allow":
            edit = "allow"
        else:
            if policy.default == "allow":
                problems.append("file_write: deny with default: allow: opencode cannot stop "
                                "allowed shell commands from writing files; use default: deny")
            edit = "deny"
            enforced.append("file_write: deny -> permission.edit = 'deny'")
        webfetch = "allow"
        if policy.network != "allow" or allow_hosts(policy):
            webfetch = "deny"
            enforced.append("network -> permission.webfetch = 'deny' (the sandbox has no "
                            "network of its own)")
        if problems:
            raise ConfigError("policy rules opencode cannot enforce: " + "; ".join(problems))
        # Paths are confined by the sandbox, not opencode: its default (ask) would reject
        # any command that names a path outside the workspace.
        self.permission = {"bash": bash, "edit": edit, "webfetch": webfetch,
                           "external_directory": "allow"}
        return PolicyMapping(self.name, (), {}, tuple(enforced))

    def _route(self, policy: PolicyLike, reasons: list[str]) -> PolicyMapping:
        """Through ``opencode acp`` (see the module docstring)."""
        from corral.harness._acp import AcpHarness  # (it imports this module)

        if not self.permission_prompt:
            raise ConfigError(
                f"opencode: {'; '.join(reasons)} are answered through `opencode acp` and "
                "corral's permission prompt, which this run does not serve (give the run "
                "host tools, as the Runner does)")
        self.acp = AcpHarness(agent="opencode", model=self.model, version=self.version,
                              policy=policy, permission_prompt=True)
        # the bridge's journal lines, not opencode run's, carry the session id
        vars(self)["session_markers"] = self.acp.session_markers
        via = (f"{'; '.join(reasons)} -> runs as `opencode acp` under corral's ACP bridge "
               "(opencode run has no approval channel)")
        return PolicyMapping(self.name, enforced=(via, *self.acp.policy_mapping.enforced),
                             permission_prompt=True)

    def build_command(self, request: AgentRequest) -> AgentCommand:
        if self.acp is not None:
            return self.acp.build_command(request)
        return super().build_command(request)

    def bridge_config(self, request: AgentRequest) -> dict[str, Any] | None:
        return self.acp.bridge_config(request) if self.acp is not None else None

    def home_files(self, opts: CliOptions) -> dict[str, bytes]:
        return self.acp.home_files(opts) if self.acp is not None else {}

    def seed_home_files(self) -> dict[str, bytes]:
        return self.acp.seed_home_files() if self.acp is not None else {}

    def cli_argv(self, opts: CliOptions) -> list[str]:
        argv = ["run", "--format", "json", "-m", self._model(opts)]
        if opts.resume:
            argv += ["-s", opts.resume]
        return [*argv, *opts.extra_args]

    def _model(self, opts: CliOptions) -> str:
        model = opts.model or self.model
        if split_model(model)[0] != self.provider:
            raise ConfigError(f"opencode model {model!r}: this run's model proxy speaks the "
                              f"{self.upstream_api()} API (model {self.model}); pass the "
                              "model when the harness is built")
        return model

    def cli_env(self, opts: CliOptions, base_url: str) -> dict[str, str]:
        config = opencode_config(self._model(opts), base_url, opts.api_key,
                                 self.permission, opts.mcp_servers)
        return {**ENV, "OPENCODE_CONFIG_CONTENT": json.dumps(config, separators=(",", ":"))}

    def session_id(self, obj: Mapping[str, Any]) -> str | None:
        if self.acp is not None:
            return self.acp.session_id(obj)
        sid = obj.get("sessionID")
        return sid if isinstance(sid, str) and sid else None

    def session_problem(self, files: Mapping[str, bytes], session_id: str) -> str | None:
        return opencode_session_problem(files, session_id)

    def translator(self, ctx: RunContext, *, at_offset: int | None = None
                   ) -> OpencodeTranslator | AcpTranslator:
        if at_offset is not None:
            raise ConfigError("the opencode translator resumes by replay, not by offset")
        if self.acp is not None:
            # start-up cost (~6 ms of an opencode run's start): only `opencode acp` needs it
            from corral.harness._acp import OpencodeAcpTranslator

            return OpencodeAcpTranslator(ctx, agent="opencode")
        return OpencodeTranslator(ctx)


def opencode_config(model: str, base_url: str, api_key: str, permission: Mapping[str, Any],
                    mcp_servers: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The configuration given in ``OPENCODE_CONFIG_CONTENT`` (see the module docstring).

    MCP servers: a ``url`` server becomes a ``remote`` one; header values written
    ``${VAR}`` (Claude Code's form) become opencode's ``{env:VAR}``, so a secret stays in
    the CLI's environment. A ``command`` server becomes a ``local`` one."""
    provider, name = split_model(model)
    config: dict[str, Any] = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {provider: {
            "options": {"baseURL": base_url, "apiKey": api_key},
            "models": {name: {"name": name, "tool_call": True, "limit": dict(MODEL_LIMITS)}},
        }},
        "model": model,
        "small_model": model,
        "permission": dict(permission),
        "autoupdate": False,
        "share": "disabled",
    }
    mcp: dict[str, Any] = {}
    for server_name, server in mcp_servers.items():
        if isinstance(server.get("url"), str):
            headers = {str(k): _ENV_REF.sub(lambda m: "{env:" + m.group(1) + "}", str(v))
                       for k, v in dict(server.get("headers") or {}).items()}
            mcp[server_name] = {"type": "remote", "url": server["url"], "enabled": True,
                                "headers": headers}
        else:
            mcp[server_name] = {"type": "local", "enabled": True,
                                "command": [server["command"], *map(str, server.get("args")
                                                                    or [])],
                                "environment": {str(k): str(v) for k, v in
                                                dict(server.get("env") or {}).items()}}
    if mcp:
        config["mcp"] = mcp
    return config


OPENCODE_REFUSALS: Final = ("Session not found", "file is not a database")
"""What opencode says when it cannot resume the session it was given."""
OPENCODE_DB = ".local/share/opencode/opencode.db"


def opencode_session_problem(files: Mapping[str, bytes], session_id: str) -> str | None:
    """Why opencode certainly cannot resume ``session_id`` from the saved ``files``: its
    database is missing, is not SQLite, or never mentions the session (a SQLite database
    stores text as it is, in the file or its write-ahead log); else ``None``."""
    db = files.get(OPENCODE_DB)
    if db is None:
        return "its database (opencode.db) is not among the saved files"
    if not db.startswith(b"SQLite format 3\x00"):
        return "its database (opencode.db) is not a SQLite database"
    wal = files.get(OPENCODE_DB + "-wal", b"")
    if session_id.encode() not in db and session_id.encode() not in wal:
        return "its database (opencode.db) does not hold the session"
    return None


class OpencodeTranslator(JsonlTranslator):
    """``opencode run --format json`` lines → AG-UI events (see the module docstring)."""

    harness: ClassVar[str] = "opencode"
    resume_refusals: ClassVar[tuple[str, ...]] = OPENCODE_REFUSALS

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.steps = 0
        self.in_step = False
        self.tokens = {"input": 0, "output": 0, "reasoning": 0, "read": 0, "write": 0}

    def on_event(self, obj: dict[str, Any]) -> list[BaseEvent]:
        out: list[BaseEvent] = []
        sid = as_str(obj.get("sessionID"))
        if sid:
            out += self.session_event(sid)
        kind = obj.get("type")
        part = obj.get("part") if isinstance(obj.get("part"), dict) else {}
        assert isinstance(part, dict)
        if kind == "step_start":
            out += self._end_step()
            self.steps += 1
            self.in_step = True
            self.succeeded = False
            out.append(StepStartedEvent(step_name=f"step-{self.steps}"))
        elif kind == "step_finish":
            self._add_tokens(part.get("tokens"))
            if part.get("reason") == "stop":
                self.succeeded = True
            out += self._end_step()
        elif kind == "text":
            text = as_str(part.get("text")) or ""
            self.result = {"text": text, "sessionId": self.session} if self.session else {
                "text": text}
            out += self.text(self._part_id(part, "m"), text)
        elif kind == "reasoning":
            out += self.reasoning(self._part_id(part, "r"), as_str(part.get("text")) or "")
        elif kind == "tool_use":
            out += self._tool(part)
        elif kind == "error":
            err = obj.get("error")
            data = err.get("data") if isinstance(err, dict) else None
            msg = as_str(data.get("message")) if isinstance(data, dict) else None
            name = as_str(err.get("name")) if isinstance(err, dict) else None
            self.error_message = msg or "opencode reported an error"
            self.error_code = f"opencode:{name or 'error'}"
        else:
            out.append(self.custom(kind if isinstance(kind, str) and kind else "unknown",
                                   obj))
        return out

    def _part_id(self, part: Mapping[str, Any], kind: str) -> str:
        pid = as_str(part.get("id"))
        return f"{self.ctx.run_id}-{pid}" if pid else self.id(kind)

    def _end_step(self) -> list[BaseEvent]:
        if not self.in_step:
            return []
        self.in_step = False
        return [StepFinishedEvent(step_name=f"step-{self.steps}")]

    def _add_tokens(self, tokens: Any) -> None:
        if not isinstance(tokens, dict):
            return
        cache = tokens.get("cache") if isinstance(tokens.get("cache"), dict) else {}
        assert isinstance(cache, dict)
        for key, value in (("input", tokens.get("input")), ("output", tokens.get("output")),
                           ("reasoning", tokens.get("reasoning")), ("read", cache.get("read")),
                           ("write", cache.get("write"))):
            self.tokens[key] += as_int(value) or 0
        self.usage = [token_usage(None, input_tokens=self.tokens["input"],
                                  output_tokens=self.tokens["output"],
                                  cached=self.tokens["read"], cache_write=self.tokens["write"],
                                  reasoning=self.tokens["reasoning"])]

    def _tool(self, part: Mapping[str, Any]) -> list[BaseEvent]:
        call = as_str(part.get("callID")) or as_str(part.get("id"))
        tool_id = f"{self.ctx.run_id}-{call}" if call else self.id("t")
        state = part.get("state") if isinstance(part.get("state"), dict) else {}
        assert isinstance(state, dict)
        tool = as_str(part.get("tool")) or "tool"
        args = state.get("input")
        if tool == "bash":
            name = "shell"
            args = {"command": args.get("command")} if isinstance(args, dict) else args
        elif tool.startswith(f"{SERVER_NAME}_"):
            name = tool[len(SERVER_NAME) + 1:]
        else:
            name = tool
        status = state.get("status")
        if status == "completed":
            output = as_str(state.get("output")) or ""
            meta = state.get("metadata")
            code = meta.get("exit") if isinstance(meta, dict) else None
            if isinstance(code, int) and code != 0:
                output += ("\n" if output and not output.endswith("\n") else "") + \
                    f"exit code {code}"
            return self.tool_result(tool_id, output, name=name, args=args)
        if status == "error":
            return self.tool_result(tool_id, as_str(state.get("error")) or "error",
                                    name=name, args=args)
        return self.tool_start(tool_id, name, args)
