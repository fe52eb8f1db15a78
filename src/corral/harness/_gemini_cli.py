"""Gemini CLI (``@google/gemini-cli``), run as ``gemini --output-format stream-json
--approval-mode yolo`` with the prompt on stdin.

Configuration: ``~/.gemini/settings.json``, written before every run (see
:meth:`GeminiCliHarness.home_files`). It selects the ``gemini-api-key`` auth, turns
telemetry, usage statistics, auto-update and folder trust off, bounds the CLI's own
retries (``general.maxAttempts``) and lists the MCP servers (and, under command rules, the
command gate's hook). With folder trust off a repository's ``.gemini/settings.json``
applies too (``tools.exclude`` merges as a union, so it cannot take the policy's exclusions
back; under command rules it is checked first: see "Policy mapping").

Model traffic: ``GOOGLE_GEMINI_BASE_URL`` is the in-sandbox model endpoint and
``GEMINI_API_KEY`` a placeholder; the host proxy sends the real key as ``x-goog-api-key``.
Without ``model`` the CLI first makes a routing call (a non-streamed
``:generateContent``); the proxy forwards that too.

Events → AG-UI:

* ``init`` → ``CUSTOM corral.session`` ``{harness, sessionId, model}``;
* ``message`` (assistant, ``delta``) → one text message per run of deltas (it ends at the
  next tool call, result or the end of the run); the user's echo → ``CUSTOM
  gemini-cli.message``;
* ``tool_use`` / ``tool_result`` → tool call (its ``parameters`` as arguments) and its
  result (the output, or the error message when ``status`` is ``error``); MCP tools of the
  run's host-tools server ``corral`` go by their own names;
* ``error`` → ``CUSTOM gemini-cli.error`` (warnings and retried errors);
* ``result`` → ``RUN_FINISHED`` with the usage from ``stats`` when ``status`` is
  ``success``, else ``RUN_ERROR`` with the CLI's message.

Sessions live in ``~/.gemini/tmp/<project>/chats``; a later prompt continues with
``--resume <session id>``.

Policy mapping: with no command rules (default ``allow``, file writes allowed) every tool is
allowed (``--approval-mode yolo``; the sandbox is the boundary); network ``deny`` or an
egress allowlist also removes the tools that reach the web from the model provider's side
(``google_web_search``, ``web_fetch``). Command rules (``allow``/``ask``/``deny``, a default
other than ``allow``) in a run that serves corral's permission tool (the Runner's runs):
a ``BeforeTool`` hook on ``run_shell_command`` in the settings runs corral's command gate
(:mod:`corral._insandbox.command_gate`), which asks the policy about each command on the
run's MCP server (``ask`` waits for a corral approval that outlives the driver) and fails
closed. Without the permission tool, or with ``file_write`` other than ``allow``, the policy
raises :class:`~corral._errors.ConfigError` at definition time.

What the workspace cannot do to the gate (see docs/agents.md, "Gemini CLI"): gemini-cli
merges a repository's ``.gemini/settings.json`` over the user settings, takes the union of
``hooksConfig.disabled`` and concatenates ``hooks`` from every scope, so no settings file of
corral's (system settings included) could keep a repository from naming the gate disabled or
adding hooks of its own. Under command rules corral therefore reads the workspace's
``.gemini/settings.json`` before the run and refuses one that holds anything but display,
context and model preferences (:func:`check_workspace_settings`); and it pins the variables
a repository's ``.env`` could otherwise set in the CLI's process to untrust the folder, which
stops gemini-cli from running hooks (``GEMINI_CLI_TRUST_WORKSPACE``,
``GEMINI_RESTRICTED_MODE``: ``.env`` never overrides a variable that is set).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from ag_ui.core import BaseEvent

from corral._errors import ConfigError
from corral.harness import _events as ev
from corral.harness._base import RunContext
from corral.harness._cli_base import (
    transcript_problem,
    GATE_TIMEOUT,
    CliHarness,
    CliOptions,
    JsonlTranslator,
    PolicyLike,
    PolicyMapping,
    allow_hosts,
    as_int,
    beyond_allow_all,
    as_str,
    bash_gate_command,
    flatten_text,
    token_usage,
)
from corral.journal._reader import Exit, JournalItem
from corral.net._model_proxy import ModelApi
from corral._insandbox import command_gate
from corral.tools._names import SERVER_NAME

__all__ = ["GeminiCliHarness", "GeminiCliTranslator", "check_workspace_settings",
           "gemini_settings"]

SETTINGS_FILE = ".gemini/settings.json"
"""Home-relative: gemini-cli's user settings."""
WEB_TOOLS = ("google_web_search", "web_fetch")
"""Built-in tools that reach the web (from the model provider's side or the CLI's)."""
MAX_ATTEMPTS = 10
"""gemini-cli's ceiling for ``general.maxAttempts``."""
SHELL_TOOL = "run_shell_command"
GATE_HOOK = "corral-command-gate"
"""The gate hook's name (``hooksConfig.disabled`` names hooks by it)."""
WORKSPACE_SETTINGS = ".gemini/settings.json"
"""Workspace-relative: a repository's own gemini-cli settings."""
HARMLESS_SECTIONS = frozenset({"$schema", "ui", "accessibility", "output", "context",
                               "model"})
"""Top-level sections of a repository's settings that cannot run or unblock anything
(display, context files, the model's name). Anything else (``hooks``, ``hooksConfig``, ``tools`` with its ``discoveryCommand``,
``mcpServers``, ``security``, ``advanced``, ``experimental`` ...) is refused under command
rules."""


class GeminiCliHarness(CliHarness):
    """The Gemini CLI adapter (see the module docstring)."""

    name: ClassVar[str] = "gemini-cli"
    model_api: ClassVar[ModelApi] = "gemini"
    session_dirs: ClassVar[tuple[str, ...]] = (".gemini/tmp", ".gemini/history")
    instructions_file: ClassVar[str] = ".gemini/GEMINI.md"
    excluded_tools: tuple[str, ...] = ()
    """Built-in tools the policy removes (``tools.exclude``)."""
    # Extensions bring hooks and MCP servers of their own, which gemini-cli runs beside
    # corral's; a planted policy or trust file is no business of a gated run either.
    gated_home_files: ClassVar[tuple[str, ...]] = (
        ".gemini/extensions", ".gemini/policies", ".gemini/trustedFolders.json",
        ".gemini/trusted_hooks.json", ".gemini/system-defaults.json")

    def map_policy(self, policy: PolicyLike | None) -> PolicyMapping:
        enforced = ["default: allow -> --approval-mode yolo (the sandbox is the boundary)"]
        if policy is None:
            return PolicyMapping(self.name, (), {}, tuple(enforced), bypass=True)
        ruled = bool(policy.allow or policy.ask or policy.deny) or policy.default != "allow"
        problems = beyond_allow_all(policy)
        if self.permission_prompt:  # the gate enforces command rules; file writes not yet
            problems = [p for p in problems if p.startswith("file_write")]
        if problems:
            why = ("file writes go through gemini-cli's own tools, which corral does not gate "
                   "yet; use file_write: allow" if self.permission_prompt else
                   "corral's command gate enforces command rules in a Runner run")
            raise ConfigError("policy rules gemini-cli cannot enforce here: "
                              + "; ".join(problems) + f" ({why})")
        if policy.network != "allow" or allow_hosts(policy):
            self.excluded_tools = WEB_TOOLS
            enforced.append(f"network: {policy.network} -> tools.exclude {list(WEB_TOOLS)}, "
                            "and the sandbox has no network of its own")
        if ruled:
            enforced.append(f"commands -> a BeforeTool hook on {SHELL_TOOL} asks corral's "
                            "policy on the run's MCP server about each command (ask rules "
                            "raise a corral approval; it fails closed); the workspace's "
                            f"{WORKSPACE_SETTINGS} may hold display, context and model "
                            "settings only")
            return PolicyMapping(self.name, (), {}, tuple(enforced), bypass=True,
                                 permission_prompt=True)
        return PolicyMapping(self.name, (), {}, tuple(enforced), bypass=True)

    @property
    def guarded_workspace_files(self) -> tuple[str, ...]:
        """Workspace files read before the run and checked (:meth:`check_workspace_file`)."""
        return (WORKSPACE_SETTINGS,) if self.policy_mapping.permission_prompt else ()

    def check_workspace_file(self, rel: str, data: bytes) -> None:
        """Refuse a repository's settings that could loosen the command gate."""
        if rel == WORKSPACE_SETTINGS:
            check_workspace_settings(data)

    # -- configuration
    def settings(self, opts: CliOptions) -> dict[str, Any]:
        """The user settings for one run (see :func:`gemini_settings`), with the command
        gate's hook under command rules."""
        settings = gemini_settings(opts, exclude=self.excluded_tools)
        if self.policy_mapping.permission_prompt:
            if SERVER_NAME not in opts.mcp_servers:
                raise ConfigError("this gemini-cli policy mapping asks corral's command gate, "
                                  "which needs the corral MCP server: prepare the agent with "
                                  "host_tools=True (the Runner does)")
            # The gate calls the decision tool itself; the model is not offered it.
            settings["mcpServers"][SERVER_NAME]["excludeTools"] = [command_gate.TOOL]
            settings["hooksConfig"] = {"enabled": True}
            # a repository's .env is loaded into gemini-cli's process for a trusted folder:
            # GEMINI_CLI_HOME there would move the user settings (this hook) into it
            settings["advanced"] = {"ignoreLocalEnv": True}
            # gemini-cli's hook timeout is in ms; one that times out lets the command run
            settings["hooks"] = {"BeforeTool": [{"matcher": f"^{SHELL_TOOL}$", "hooks": [{
                "type": "command", "name": GATE_HOOK, "command": gate_command(opts),
                "timeout": GATE_TIMEOUT * 1000}]}]}
        return settings

    def home_files(self, opts: CliOptions) -> dict[str, bytes]:
        return {SETTINGS_FILE: json.dumps(self.settings(opts), sort_keys=True,
                                          indent=1).encode()}

    def cli_argv(self, opts: CliOptions) -> list[str]:
        argv = ["--output-format", "stream-json", "--approval-mode", "yolo"]
        if opts.model:
            argv += ["--model", opts.model]
        if opts.resume:
            argv += ["--resume", opts.resume]
        return [*argv, *opts.extra_args]

    def cli_env(self, opts: CliOptions, base_url: str) -> dict[str, str]:
        env = {
            "GOOGLE_GEMINI_BASE_URL": base_url,
            "GEMINI_API_KEY": opts.api_key,
            "GEMINI_TELEMETRY_ENABLED": "false",
        }
        if self.policy_mapping.permission_prompt:
            # Set, so a repository's .env (loaded into the CLI's process for a trusted
            # folder, never over a variable that is set) cannot untrust the folder mid-run:
            # gemini-cli runs no hook in an untrusted folder, and a hook that does not run
            # objects to nothing.
            env["GEMINI_CLI_TRUST_WORKSPACE"] = "true"
            env["GEMINI_RESTRICTED_MODE"] = "false"
        for name, server in opts.mcp_servers.items():
            if isinstance(server.get("url"), str) and "{corral.port." in server["url"]:
                env[url_var(name)] = server["url"]
        return env

    def session_id(self, obj: Mapping[str, Any]) -> str | None:
        if obj.get("type") == "init" and isinstance(obj.get("session_id"), str):
            sid: str = obj["session_id"]
            return sid
        return None

    def session_problem(self, files: Mapping[str, bytes], session_id: str) -> str | None:
        """A chat ``.gemini/tmp/<project>/chats/session-…-<id's first 8>.jsonl`` must be
        there with a readable line (else: "Error resuming session")."""
        return transcript_problem(files, session_id, under=".gemini/tmp/",
                                  named=f"-{session_id[:8]}.json")

    def translator(self, ctx: RunContext, *, at_offset: int | None = None
                   ) -> GeminiCliTranslator:
        if at_offset is not None:
            raise ConfigError("the gemini-cli translator resumes by replay, not by offset")
        return GeminiCliTranslator(ctx)


def url_var(server: str) -> str:
    """The variable carrying MCP server ``server``'s URL to the CLI."""
    return "CORRAL_MCP_URL_" + server.upper().replace("-", "_")


def gemini_settings(opts: CliOptions, *, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """gemini-cli settings for a run: API-key auth, nothing phoned home, bounded retries, and
    ``opts.mcp_servers`` (a ``url`` server is streamable HTTP, ``httpUrl``; header values
    keep their ``${VAR}`` references, which gemini-cli expands from its environment, so a
    token stays out of the file)."""
    servers: dict[str, Any] = {}
    for name, server in opts.mcp_servers.items():
        if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
            raise ConfigError(f"MCP server name {name!r}: gemini-cli needs letters, digits, "
                              "'_' or '-' only")
        if isinstance(server.get("url"), str):
            # A URL with a forwarder port comes through the environment, where the
            # in-sandbox entry fills the port in (it never rewrites files).
            url = f"${{{url_var(name)}}}" if "{corral.port." in server["url"] \
                else server["url"]
            entry: dict[str, Any] = {"httpUrl": url, "trust": True}
            headers = {str(k): str(v) for k, v in dict(server.get("headers") or {}).items()}
            if headers:
                entry["headers"] = headers
        else:
            entry = {"command": server["command"], "args": list(server.get("args") or []),
                     "trust": True}
            if server.get("env"):
                entry["env"] = {str(k): str(v) for k, v in dict(server["env"]).items()}
        servers[name] = entry
    settings: dict[str, Any] = {
        "security": {"auth": {"selectedType": "gemini-api-key"},
                     "folderTrust": {"enabled": False}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False,
                    "maxAttempts": min(opts.max_retries + 1, MAX_ATTEMPTS),
                    # corral keeps a thread's sessions (saved whole after each run). gemini
                    # 0.61's start-up clean-up (on by default: 30 days) would drop an idle
                    # thread's session, and it deletes every file of a session id when one
                    # of them has no conversation, which a load's own new file for that id
                    # has not (cleanupExpiredSessions)
                    "sessionRetention": {"enabled": False}},
        "mcpServers": servers,
    }
    if exclude:
        settings["tools"] = {"exclude": list(exclude)}
    return settings


def gate_command(opts: CliOptions) -> str:
    """The command gate's hook command. gemini-cli runs it through the shell with its own
    environment, where the in-sandbox entry has filled the forwarder's port into the MCP
    server's URL variable (:func:`url_var`); files are never rewritten."""
    url = opts.mcp_servers[SERVER_NAME]["url"]
    if "{corral.port." not in url:
        return bash_gate_command(opts)
    marker = "CORRAL_GATE_URL"  # shlex leaves it unquoted
    server = {**opts.mcp_servers[SERVER_NAME], "url": marker}
    command = bash_gate_command(dataclasses.replace(
        opts, mcp_servers={**opts.mcp_servers, SERVER_NAME: server}))
    return command.replace(marker, f'"${{{url_var(SERVER_NAME)}}}"', 1)


def check_workspace_settings(data: bytes) -> None:
    """Raise :class:`ConfigError` (one line) unless a repository's ``.gemini/settings.json``
    holds only :data:`HARMLESS_SECTIONS` (comments allowed, as gemini-cli allows them)."""
    try:
        text = _strip_json_comments(data.decode("utf-8"))
        settings = json.loads(text) if text.strip() else {}
    except (UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"the workspace's {WORKSPACE_SETTINGS} is not JSON corral can read "
                          f"({exc.__class__.__name__}); under command rules corral must know "
                          "what it asks of gemini-cli: fix or remove it") from None
    if not isinstance(settings, dict):
        raise ConfigError(f"the workspace's {WORKSPACE_SETTINGS} is not a JSON object; fix "
                          "or remove it")
    risky = sorted(k for k in settings if k not in HARMLESS_SECTIONS)
    if risky:
        raise ConfigError(
            f"the workspace's {WORKSPACE_SETTINGS} sets {', '.join(map(repr, risky))}, which "
            "could run commands outside or switch off corral's command gate (gemini-cli "
            "merges it over corral's settings); under command rules only "
            f"{', '.join(sorted(HARMLESS_SECTIONS - {'$schema'}))} may be set there: remove "
            "the rest, or run without command rules")


def _strip_json_comments(text: str) -> str:
    """``text`` without ``//`` and ``/* */`` comments outside strings."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                raise ValueError("unterminated comment")
            i = j + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def host_tool_name(name: str) -> str:
    """A host tool under its own name (gemini-cli may prefix MCP tools with their server)."""
    for prefix in (f"mcp_{SERVER_NAME}_", f"{SERVER_NAME}__"):
        if name.startswith(prefix) and len(name) > len(prefix):
            return name[len(prefix):]
    return name


class GeminiCliTranslator(JsonlTranslator):
    """``gemini --output-format stream-json`` lines → AG-UI events (see the module
    docstring)."""

    harness: ClassVar[str] = "gemini-cli"
    resume_refusals: ClassVar[tuple[str, ...]] = ("Error resuming session",)

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.open_text: str | None = None
        self.text_parts: list[str] = []
        self.tool_names: dict[str, tuple[str, Any]] = {}

    def feed(self, item: JournalItem) -> list[BaseEvent]:
        if isinstance(item, Exit) and not self.finished:
            return self._close_text() + super().feed(item)
        return super().feed(item)

    def _close_text(self) -> list[BaseEvent]:
        if self.open_text is None:
            return []
        out: list[BaseEvent] = [ev.text_end(self.open_text)]
        self.open_text = None
        return out

    def on_event(self, obj: dict[str, Any]) -> list[BaseEvent]:
        kind = obj.get("type")
        if kind == "message" and obj.get("role") == "assistant":
            return self._delta(as_str(obj.get("content")) or "")
        out = self._close_text()
        if kind == "init":
            sid = as_str(obj.get("session_id"))
            return out + (self.session_event(sid, model=as_str(obj.get("model"))) if sid
                          else [self.custom("init", obj)])
        if kind == "tool_use":
            tool_id = as_str(obj.get("tool_id")) or self.id("t")
            name = host_tool_name(as_str(obj.get("tool_name")) or "tool")
            args = obj.get("parameters")
            self.tool_names[tool_id] = (name, args)
            return out + self.tool_start(self._tid(tool_id), name, args)
        if kind == "tool_result":
            tool_id = as_str(obj.get("tool_id")) or self.id("t")
            name, args = self.tool_names.get(tool_id, ("tool", None))
            if obj.get("status") == "error":
                err = obj.get("error")
                content = (as_str(err.get("message")) if isinstance(err, dict) else None) \
                    or flatten_text(obj.get("output")) or "error"
            else:
                content = flatten_text(obj.get("output"))
            return out + self.tool_result(self._tid(tool_id), content, name=name, args=args)
        if kind == "result":
            return out + self._result(obj)
        name = kind if isinstance(kind, str) and kind else "unknown"
        return [*out, self.custom(name, obj)]

    def _tid(self, tool_id: str) -> str:
        # gemini-cli's tool ids carry a timestamp but may repeat across runs of a thread.
        return f"{self.ctx.run_id}-{tool_id}"

    def _delta(self, text: str) -> list[BaseEvent]:
        out: list[BaseEvent] = []
        if self.open_text is None:
            self.open_text = self.id("m")
            self.text_parts = []
            out.append(ev.text_start(self.open_text))
        if text:
            self.text_parts.append(text)
            out.append(ev.text_content(self.open_text, text))
        return out

    def _result(self, obj: dict[str, Any]) -> list[BaseEvent]:
        stats = obj.get("stats")
        if isinstance(stats, dict):
            cached = as_int(stats.get("cached"))
            total_in = as_int(stats.get("input_tokens"))
            self.usage = [token_usage(
                None, provider="gemini",
                input_tokens=(total_in - (cached or 0)) if total_in is not None else None,
                output_tokens=as_int(stats.get("output_tokens")), cached=cached)]
        if obj.get("status") == "success":
            self.succeeded = True
            text = "".join(self.text_parts)
            self.result = {"text": text, "sessionId": self.session} if self.session \
                else {"text": text}
            return []
        err = obj.get("error")
        msg = as_str(err.get("message")) if isinstance(err, dict) else None
        etype = as_str(err.get("type")) if isinstance(err, dict) else None
        self.error_message = msg or "gemini-cli reported an error"
        self.error_code = f"gemini-cli:{etype or 'error'}"
        return [self.custom("result", obj)]
