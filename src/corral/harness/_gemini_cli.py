"""Gemini CLI (``@google/gemini-cli``), run as ``gemini --output-format stream-json
--approval-mode yolo`` with the prompt on stdin.

Configuration: ``~/.gemini/settings.json``, written before every run (see
:meth:`GeminiCliHarness.home_files`). It selects the ``gemini-api-key`` auth, turns
telemetry, usage statistics, auto-update and folder trust off, bounds the CLI's own
retries (``general.maxAttempts``) and lists the MCP servers. (A *system* settings file
would be out of the agent's reach, but gemini-cli 0.61 skips one whose directory is not
owned by uid 0, which nothing in a user-namespace sandbox is.) With folder trust off a
repository's ``.gemini/settings.json`` applies too; it runs inside the sandbox like the
agent, corral gives gemini-cli no command rules to loosen, and ``tools.exclude`` merges as a
union, so a repository cannot take the policy's exclusions back.

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

Policy mapping: only "allow everything" (no command rules, file writes allowed) is
expressed (``--approval-mode yolo``; the sandbox is the boundary); network ``deny`` or an
egress allowlist also removes the tools that reach the web from the model provider's side
(``google_web_search``, ``web_fetch``). Command rules and a non-``allow`` default raise
:class:`~corral._errors.ConfigError` at definition time. gemini-cli 0.61 has ``BeforeTool``
hooks that could carry corral's command gate, but a repository's ``.gemini/settings.json``
outranks the user settings and can switch hooks off (``hooksConfig.enabled``,
``hooksConfig.disabled``); only system settings outrank it, and gemini-cli reads those only
from a directory owned by uid 0, which nothing in a user-namespace sandbox is. A gate the
workspace can turn off would be a silently unenforced policy, so none is offered.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from ag_ui.core import BaseEvent

from corral._errors import ConfigError
from corral.harness import _events as ev
from corral.harness._base import RunContext
from corral.harness._cli_base import (
    CliHarness,
    CliOptions,
    JsonlTranslator,
    PolicyLike,
    PolicyMapping,
    allow_hosts,
    as_int,
    beyond_allow_all,
    as_str,
    flatten_text,
    token_usage,
)
from corral.journal._reader import Exit, JournalItem
from corral.net._model_proxy import ModelApi
from corral.tools._names import SERVER_NAME

__all__ = ["GeminiCliHarness", "GeminiCliTranslator", "gemini_settings"]

SETTINGS_FILE = ".gemini/settings.json"
"""Home-relative: gemini-cli's user settings."""
WEB_TOOLS = ("google_web_search", "web_fetch")
"""Built-in tools that reach the web (from the model provider's side or the CLI's)."""
MAX_ATTEMPTS = 10
"""gemini-cli's ceiling for ``general.maxAttempts``."""


class GeminiCliHarness(CliHarness):
    """The Gemini CLI adapter (see the module docstring)."""

    name: ClassVar[str] = "gemini-cli"
    model_api: ClassVar[ModelApi] = "gemini"
    session_dirs: ClassVar[tuple[str, ...]] = (".gemini/tmp", ".gemini/history")
    instructions_file: ClassVar[str] = ".gemini/GEMINI.md"
    excluded_tools: tuple[str, ...] = ()
    """Built-in tools the policy removes (``tools.exclude``)."""

    def map_policy(self, policy: PolicyLike | None) -> PolicyMapping:
        enforced = ["default: allow -> --approval-mode yolo (the sandbox is the boundary)"]
        if policy is None:
            return PolicyMapping(self.name, (), {}, tuple(enforced), bypass=True)
        problems = beyond_allow_all(policy)
        if problems:
            raise ConfigError(
                "policy rules gemini-cli cannot enforce yet (corral runs it with every tool "
                "allowed): " + "; ".join(problems) + "; use harness claude-code, codex or acp "
                "(--agent claude or opencode) for command rules, or drop them")
        if policy.network != "allow" or allow_hosts(policy):
            self.excluded_tools = WEB_TOOLS
            enforced.append(f"network: {policy.network} -> tools.exclude {list(WEB_TOOLS)}, "
                            "and the sandbox has no network of its own")
        return PolicyMapping(self.name, (), {}, tuple(enforced), bypass=True)

    # -- configuration
    def settings(self, opts: CliOptions) -> dict[str, Any]:
        """The user settings for one run (see :func:`gemini_settings`)."""
        return gemini_settings(opts, exclude=self.excluded_tools)

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
        for name, server in opts.mcp_servers.items():
            if isinstance(server.get("url"), str) and "{corral.port." in server["url"]:
                env[url_var(name)] = server["url"]
        return env

    def session_id(self, obj: Mapping[str, Any]) -> str | None:
        if obj.get("type") == "init" and isinstance(obj.get("session_id"), str):
            sid: str = obj["session_id"]
            return sid
        return None

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
                    "maxAttempts": min(opts.max_retries + 1, MAX_ATTEMPTS)},
        "mcpServers": servers,
    }
    if exclude:
        settings["tools"] = {"exclude": list(exclude)}
    return settings


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
