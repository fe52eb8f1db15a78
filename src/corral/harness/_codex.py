"""Codex (``@openai/codex``), run as ``codex exec --json ... -`` with the prompt on stdin.

Model traffic: a custom model provider ``corral`` (Responses API, ``wire_api =
"responses"``; Codex ignores ``OPENAI_BASE_URL``) whose ``base_url`` is the in-sandbox
endpoint and whose key variable ``CORRAL_MODEL_KEY`` holds a placeholder. Update checks,
analytics and the plugin sync are off (the plugin sync would try the network). Codex's own
sandbox is bypassed (``--dangerously-bypass-approvals-and-sandbox``): it runs inside
corral's. Sessions live in ``~/.codex/sessions``; a later prompt continues with ``codex exec
resume <thread id>``.

Events → AG-UI:

* ``thread.started`` → ``CUSTOM corral.session`` ``{harness, sessionId}``;
* ``turn.started`` / ``turn.completed`` → ``STEP_STARTED`` / ``STEP_FINISHED`` (``turn``);
  ``turn.completed`` carries the usage for ``RUN_FINISHED``; ``turn.failed`` → the
  ``RUN_ERROR`` message;
* items: ``agent_message`` → text message, ``reasoning`` → ``REASONING_*``,
  ``command_execution`` → tool call ``shell`` (``{"command": ...}``; result: the output,
  then ``exit code N`` when non-zero), ``file_change`` → tool call ``apply_patch``,
  ``mcp_tool_call`` → tool call ``<server>.<tool>`` (the run's host tools, server
  ``corral``: the tool's own name), ``web_search`` → tool call
  ``web_search``; item type ``error`` (non-fatal warnings such as unknown model metadata)
  and everything else → ``CUSTOM codex.<...>``; top-level ``error`` events (reconnects)
  → ``CUSTOM codex.error``.

MCP servers (agent option ``mcp_servers``) become ``-c mcp_servers.<name>.*`` overrides
(see :func:`mcp_server_config`): the run's host-tools server ``corral`` is a streamable
HTTP server at the in-sandbox forwarder whose bearer token Codex reads from
``CORRAL_TOOLS_TOKEN`` (``bearer_token_env_var``), so the token is in the CLI's environment
only. Codex 0.171 offers a server's tools to the model in a Responses tool namespace
``mcp__<name>``; with ``--dangerously-bypass-approvals-and-sandbox`` it calls them without
asking (host tools have their own gate, ``approval=True``, in the MCP server).

Codex's ``turn.completed`` usage counts the whole session (a resumed thread includes the
earlier turns); the model proxy's per-run count is exact.

Policy mapping: only "allow everything" (no command rules, file writes allowed) can be
expressed for ``codex exec`` without an approval channel; network ``deny`` turns Codex's
web search off (the sandbox has no network either). Anything else raises
:class:`~corral._errors.ConfigError` at definition time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from ag_ui.core import BaseEvent, StepFinishedEvent, StepStartedEvent

from corral._errors import ConfigError
from corral._insandbox import command_gate as command_gate
from corral.harness._base import RunContext
from corral.tools._names import SERVER_NAME
from corral.harness._cli_base import (
    transcript_problem,
    GATE_TIMEOUT,
    CliHarness,
    CliOptions,
    JsonlTranslator,
    PolicyLike,
    allow_hosts,
    PolicyMapping,
    as_int,
    as_str,
    bash_gate_command,
    flatten_text,
    token_usage,
)
from corral.harness import _events as ev
from corral.net._model_proxy import ModelApi
from corral.tools._output import OUTPUT_CANDIDATE_EVENT

__all__ = ["CodexHarness", "CodexTranslator", "mcp_server_config"]

KEY_VAR = "CORRAL_MODEL_KEY"
OUTPUT_SCHEMA_FILE = ".codex/corral-output-schema.json"
"""Home-relative file holding the run's output schema (``--output-schema``)."""
HOST_TOOLS_SERVER = SERVER_NAME


def _toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid TOML basic string


class CodexHarness(CliHarness):
    """The Codex adapter (see the module docstring)."""

    name: ClassVar[str] = "codex"
    model_api: ClassVar[ModelApi] = "openai"
    native_output: ClassVar[bool] = True
    session_dirs: ClassVar[tuple[str, ...]] = (".codex/sessions",)
    instructions_file: ClassVar[str] = ".codex/AGENTS.md"
    # The gate needs --dangerously-bypass-hook-trust, which would also run user-level
    # hooks unreviewed: corral configures Codex through -c only, so these go.
    gated_home_files: ClassVar[tuple[str, ...]] = (".codex/hooks.json", ".codex/config.toml")

    def default_base_url(self) -> str:
        return "http://127.0.0.1:{corral.port.model}/v1"

    def map_policy(self, policy: PolicyLike | None) -> PolicyMapping:
        argv = ["--dangerously-bypass-approvals-and-sandbox"]
        enforced = [("default: allow -> --dangerously-bypass-approvals-and-sandbox (the "
                     "sandbox is the boundary)")]
        if policy is None:
            return PolicyMapping(self.name, tuple(argv), {}, tuple(enforced), bypass=True)
        problems: list[str] = []
        ruled = bool(policy.allow or policy.ask or policy.deny) or policy.default != "allow"
        if ruled and not self.permission_prompt:
            for kind in ("allow", "ask", "deny"):
                rules = getattr(policy, kind)
                if rules:
                    problems.append(f"{kind} rules {list(rules)}: codex exec has no "
                                    "per-command rules of its own; corral's command gate "
                                    "enforces them in a Runner run")
            if policy.default != "allow":
                problems.append(f"default: {policy.default}: codex exec runs every command "
                                "or none; corral's command gate enforces it in a Runner run")
        if policy.file_write != "allow":
            problems.append(f"file_write: {policy.file_write}: Codex's own sandbox cannot run "
                            "inside corral's; use file_write: allow")
        if problems:
            raise ConfigError("policy rules Codex cannot enforce: " + "; ".join(problems))
        if policy.network != "allow":
            argv += ["-c", 'web_search="disabled"']
            enforced.append('network: deny -> -c web_search="disabled", and the sandbox has '
                            "no network")
        elif allow_hosts(policy):
            argv += ["-c", 'web_search="disabled"']
            enforced.append(f"network: allow_hosts {list(allow_hosts(policy))} -> the sandbox "
                            "has no network; commands reach only those hosts through the "
                            'egress proxy; -c web_search="disabled" (it runs on the model '
                            "provider's servers)")
        if ruled:
            enforced.append("commands -> a PreToolUse hook on Bash (-c hooks.PreToolUse) "
                            "asks corral's policy on the run's MCP server about each command "
                            "(ask rules raise a corral approval; it fails closed)")
            return PolicyMapping(self.name, tuple(argv), {}, tuple(enforced), bypass=True,
                                 permission_prompt=True)
        return PolicyMapping(self.name, tuple(argv), {}, tuple(enforced), bypass=True)

    def cli_argv(self, opts: CliOptions) -> list[str]:
        base_url = opts.base_url or self.default_base_url()
        argv = ["exec"]
        if opts.resume:
            argv.append("resume")
        argv += ["--json", "--skip-git-repo-check", *self.policy_mapping.argv,
                 "--disable", "plugins"]
        config = {
            "model_provider": _toml_str("corral"),
            "model_providers.corral.name": _toml_str("corral"),
            "model_providers.corral.base_url": _toml_str(base_url),
            "model_providers.corral.wire_api": _toml_str("responses"),
            "model_providers.corral.env_key": _toml_str(KEY_VAR),
            "model_providers.corral.request_max_retries": str(opts.max_retries),
            "model_providers.corral.stream_max_retries": str(opts.max_retries),
            "check_for_update_on_startup": "false",
            "analytics.enabled": "false",
        }
        if opts.model:
            config["model"] = _toml_str(opts.model)
        for name, server in opts.mcp_servers.items():
            config.update(mcp_server_config(name, server))
        if self.policy_mapping.permission_prompt:
            if HOST_TOOLS_SERVER not in opts.mcp_servers:
                raise ConfigError("this Codex policy mapping asks corral's command gate, "
                                  "which needs the corral MCP server: prepare the agent with "
                                  "host_tools=True (the Runner does)")
            # The gate calls the decision tool itself; the model is not offered it.
            config[f"mcp_servers.{HOST_TOOLS_SERVER}.disabled_tools"] = json.dumps(
                [command_gate.TOOL])
            command = bash_gate_command(opts)
            config["hooks.PreToolUse"] = (
                '[{matcher = "Bash", hooks = [{type = "command", command = '
                f'{_toml_str(command)}, timeout = {GATE_TIMEOUT}}}]}}]')
            # corral wrote this hook (in argv, out of the agent's reach): no trust prompt.
            argv.append("--dangerously-bypass-hook-trust")
        for key, value in config.items():
            argv += ["-c", f"{key}={value}"]
        if self.output_schema is not None:
            # the in-sandbox entry puts the sandbox's $HOME in (see home_files)
            argv += ["--output-schema", "{corral.home}/" + OUTPUT_SCHEMA_FILE]
        argv += list(opts.extra_args)
        if opts.resume:
            argv.append(opts.resume)
        argv.append("-")  # the prompt comes on stdin
        return argv

    def cli_env(self, opts: CliOptions, base_url: str) -> dict[str, str]:
        return {KEY_VAR: opts.api_key}

    def home_files(self, opts: CliOptions) -> dict[str, bytes]:
        if self.output_schema is None:
            return {}
        return {OUTPUT_SCHEMA_FILE: json.dumps(self.output_schema).encode()}

    def session_id(self, obj: Mapping[str, Any]) -> str | None:
        if obj.get("type") == "thread.started" and isinstance(obj.get("thread_id"), str):
            sid: str = obj["thread_id"]
            return sid
        return None

    def session_problem(self, files: Mapping[str, bytes], session_id: str) -> str | None:
        """The rollout ``.codex/sessions/…/rollout-…-<thread id>.jsonl`` must be there
        with a readable line (else: "thread/resume failed")."""
        return transcript_problem(files, session_id, under=".codex/sessions/",
                                  named=f"-{session_id}.jsonl")

    def translator(self, ctx: RunContext, *, at_offset: int | None = None) -> CodexTranslator:
        if at_offset is not None:
            raise ConfigError("the codex translator resumes by replay, not by offset")
        return CodexTranslator(ctx, structured=self.output_schema is not None)


_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def mcp_server_config(name: str, server: Mapping[str, Any]) -> dict[str, str]:
    """``-c`` overrides (dotted key → TOML value) for MCP server ``name``.

    A ``url`` server is a streamable HTTP server. Its ``headers`` use Claude Code's form
    (values may hold ``${VAR}``, expanded by the CLI): Codex does not expand variables, so
    ``Authorization: Bearer ${VAR}`` becomes ``bearer_token_env_var = "VAR"``, a header that
    is exactly ``${VAR}`` becomes ``env_http_headers.<header> = "VAR"``, and a literal
    header ``http_headers.<header>``; either way the secret stays in the CLI's environment,
    out of argv. A ``bearer_token_env_var`` key is passed as is. Any other use of ``${...}``
    raises :class:`ConfigError`.
    """
    if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
        raise ConfigError(f"MCP server name {name!r}: Codex needs letters, digits, '_' or "
                          "'-' only")
    prefix = f"mcp_servers.{name}"
    config: dict[str, str] = {}
    if not isinstance(server.get("url"), str):
        config[f"{prefix}.command"] = _toml_str(server["command"])
        config[f"{prefix}.args"] = json.dumps(list(server.get("args") or []))
        env = server.get("env") or {}
        if env:
            config[f"{prefix}.env"] = "{" + ", ".join(
                f"{_toml_str(str(k))} = {_toml_str(str(v))}" for k, v in env.items()) + "}"
        return config
    config[f"{prefix}.url"] = _toml_str(server["url"])
    bearer = server.get("bearer_token_env_var")
    literal: dict[str, str] = {}
    from_env: dict[str, str] = {}
    for header, value in dict(server.get("headers") or {}).items():
        value = str(value)
        if not re.fullmatch(r"[A-Za-z0-9_-]+", str(header)):
            raise ConfigError(f"MCP server {name!r}: header name {header!r} must be letters, "
                              "digits, '_' or '-'")
        m = re.fullmatch(r"Bearer \$\{([A-Za-z_][A-Za-z0-9_]*)\}", value)
        if str(header).lower() == "authorization" and m and bearer is None:
            bearer = m.group(1)
        elif (m := _ENV_REF.fullmatch(value)) is not None:
            from_env[str(header)] = m.group(1)
        elif _ENV_REF.search(value) or "${" in value:
            raise ConfigError(f"MCP server {name!r}: header {header!r} mixes text and "
                              "${VAR}; Codex can only take a whole header from a variable "
                              "(or 'Bearer ${VAR}' for Authorization)")
        else:
            literal[str(header)] = value
    if bearer is not None:
        if not isinstance(bearer, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", bearer):
            raise ConfigError(f"MCP server {name!r}: bearer_token_env_var must be a "
                              "variable name")
        config[f"{prefix}.bearer_token_env_var"] = _toml_str(bearer)
    for header, var in from_env.items():
        config[f"{prefix}.env_http_headers.{header}"] = _toml_str(var)
    for header, value in literal.items():
        config[f"{prefix}.http_headers.{header}"] = _toml_str(value)
    return config


class CodexTranslator(JsonlTranslator):
    """``codex exec --json`` lines → AG-UI events (see the module docstring)."""

    harness: ClassVar[str] = "codex"
    resume_refusals: ClassVar[tuple[str, ...]] = ("thread/resume failed",)

    def __init__(self, ctx: RunContext, *, structured: bool = False) -> None:
        super().__init__(ctx)
        self.turns = 0
        self.in_turn = False
        self.structured = structured
        """The run asked for a structured result: the turn's last message is it (JSON)."""
        self.last_message: str | None = None

    def on_event(self, obj: dict[str, Any]) -> list[BaseEvent]:
        kind = obj.get("type")
        if kind == "thread.started":
            sid = as_str(obj.get("thread_id"))
            return self.session_event(sid) if sid else [self.custom("thread.started", obj)]
        if kind == "turn.started":
            self.turns += 1
            self.in_turn = True
            return [StepStartedEvent(step_name=f"turn-{self.turns}")]
        if kind == "turn.completed":
            usage = obj.get("usage")
            if isinstance(usage, dict):
                cached = as_int(usage.get("cached_input_tokens"))
                total_in = as_int(usage.get("input_tokens"))
                self.usage = [token_usage(
                    None, provider="openai",
                    input_tokens=(total_in - (cached or 0)) if total_in is not None else None,
                    output_tokens=as_int(usage.get("output_tokens")),
                    cached=cached,
                    cache_write=as_int(usage.get("cache_write_input_tokens")),
                    reasoning=as_int(usage.get("reasoning_output_tokens")),
                )]
            self.succeeded = True
            return [*self._candidate(), *self._end_turn()]
        if kind == "turn.failed":
            err = obj.get("error")
            msg = as_str(err.get("message")) if isinstance(err, dict) else None
            self.error_message = msg or "Codex reported a failed turn"
            self.error_code = "codex:turn.failed"
            return self._end_turn()
        if kind in ("item.started", "item.updated", "item.completed"):
            item = obj.get("item")
            if isinstance(item, dict):
                return self._item(kind, item)
        name = kind if isinstance(kind, str) and kind else "unknown"
        return [self.custom(name, obj)]

    def _candidate(self) -> list[BaseEvent]:
        """The turn's result (``--output-schema``: its final message, as JSON), for corral
        to validate (:mod:`corral.runs._output_end`)."""
        if not self.structured:
            return []
        text = self.last_message
        if text is None:
            return [ev.custom(OUTPUT_CANDIDATE_EVENT, {"error": "codex gave no final message"})]
        try:
            value = json.loads(text)
        except ValueError as exc:
            return [ev.custom(OUTPUT_CANDIDATE_EVENT,
                              {"error": f"the final message is not JSON ({exc})"})]
        return [ev.custom(OUTPUT_CANDIDATE_EVENT, {"value": value})]

    def _end_turn(self) -> list[BaseEvent]:
        if not self.in_turn:
            return []
        self.in_turn = False
        return [StepFinishedEvent(step_name=f"turn-{self.turns}")]

    def _tool_id(self, item: dict[str, Any]) -> str | None:
        item_id = as_str(item.get("id"))
        # Codex item ids restart in every run of a thread; the run id makes them unique.
        return f"{self.ctx.run_id}-{item_id}" if item_id else None

    def _item(self, kind: str, item: dict[str, Any]) -> list[BaseEvent]:
        itype = as_str(item.get("type")) or "unknown"
        done = kind == "item.completed"
        tool_id = self._tool_id(item)
        if itype == "agent_message" and done:
            text = as_str(item.get("text")) or ""
            self.last_message = text
            self.result = {"text": text, "sessionId": self.session} if self.session else {
                "text": text}
            return self.text(tool_id or self.id("m"), text)
        if itype == "reasoning" and done:
            return self.reasoning(tool_id or self.id("r"), as_str(item.get("text")) or "")
        if itype in ("command_execution", "file_change", "mcp_tool_call", "web_search") \
                and tool_id:
            name, args = self._tool_shape(itype, item)
            if not done:
                return self.tool_start(tool_id, name, args)
            return self.tool_result(tool_id, self._tool_output(itype, item), name=name,
                                    args=args)
        if itype == "error":
            return [self.custom("warning", item)]
        return [self.custom(f"{kind}.{itype}", item)]

    @staticmethod
    def _tool_shape(itype: str, item: dict[str, Any]) -> tuple[str, Any]:
        if itype == "command_execution":
            return "shell", {"command": item.get("command")}
        if itype == "file_change":
            return "apply_patch", {"changes": item.get("changes")}
        if itype == "mcp_tool_call":
            server, tool = as_str(item.get("server")) or "mcp", as_str(item.get("tool")) or "tool"
            # The run's host tools go by their own names; other servers' keep a prefix.
            return (tool if server == HOST_TOOLS_SERVER else f"{server}.{tool}"), \
                item.get("arguments")
        return "web_search", {"query": item.get("query")}

    @staticmethod
    def _tool_output(itype: str, item: dict[str, Any]) -> str:
        if itype == "command_execution":
            out = as_str(item.get("aggregated_output")) or ""
            code = item.get("exit_code")
            if isinstance(code, int) and code != 0:
                out += ("\n" if out and not out.endswith("\n") else "") + f"exit code {code}"
            return out
        if itype == "file_change":
            return as_str(item.get("status")) or json.dumps(item.get("changes"), default=str)
        if itype == "mcp_tool_call":
            if item.get("error") is not None:
                return flatten_text(item.get("error"))
            result = item.get("result")
            if isinstance(result, dict) and "content" in result:
                return flatten_text(result.get("content"))
            return flatten_text(result)
        return as_str(item.get("status")) or ""
