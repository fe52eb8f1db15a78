"""Claude Code (``@anthropic-ai/claude-code``), run as ``claude -p --output-format
stream-json --verbose`` with the prompt on stdin.

Model traffic: ``ANTHROPIC_BASE_URL`` points at the in-sandbox endpoint, ``ANTHROPIC_API_KEY``
is a placeholder. Telemetry, auto-update and error reporting are off
(``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC`` and friends); ``CLAUDE_CODE_MAX_RETRIES`` is
the ``max_retries`` option. Sessions live in ``~/.claude/projects``; a later prompt on the
thread continues with ``--resume <session id>``.

Events (one JSON object per line) → AG-UI:

* ``system``/``init`` → ``CUSTOM corral.session`` ``{harness, sessionId, model, cwd,
  tools, permissionMode, version}`` (once per session id); other ``system`` subtypes
  (``api_retry``, ``status``, …) → ``CUSTOM claude-code.system.<subtype>``;
* ``assistant``: each content block: ``text`` → ``TEXT_MESSAGE_START/CONTENT/END``,
  ``thinking`` → ``REASONING_*``, ``tool_use`` → ``TOOL_CALL_START/ARGS/END`` (the
  Anthropic tool id is the tool call id);
* ``user`` ``tool_result`` blocks → ``TOOL_CALL_RESULT``;
* ``result`` → remembered; at exit ``RUN_FINISHED`` (``result``: final text, session,
  turns, cost; ``usage``) or ``RUN_ERROR`` with Claude's own message when ``is_error``;
* ``stream_event`` (``--include-partial-messages``) and anything else → ``CUSTOM
  claude-code.<type>``.

Policy mapping (:meth:`ClaudeCodeHarness.map_policy`): with no policy (or default allow
and no rules) Claude runs with ``--permission-mode bypassPermissions`` (the sandbox is the
boundary). Otherwise ``--permission-mode dontAsk`` with ``--allowedTools``/
``--disallowedTools``: command patterns that are plain word prefixes map to
``Bash(<words>:*)`` / ``Bash(<words>)``, matched by Claude on each part of a compound
command; ``file_write: deny`` disallows Edit/Write/NotebookEdit; ``network: deny``
disallows WebFetch/WebSearch (the sandbox has no network either); with ``allow_hosts``,
WebSearch is disallowed (it runs on the provider's servers, beyond the egress proxy's
reach) and everything else goes through the proxy. ``ask`` rules and
patterns with wildcards inside words cannot be enforced by Claude and raise
:class:`~corral._errors.ConfigError` -- unless the run serves corral's permission prompt
tool (``permission_prompt=True``; the Runner does for Claude Code runs under a policy):
then ``--permission-mode default --permission-prompt-tool
mcp__corral__permission_prompt`` and every Bash command is decided by
:meth:`corral.policy._policy.Policy.evaluate` live (:mod:`corral.tools._permission`),
through the prompt tool and, for the commands Claude Code would run unasked, a
``PreToolUse`` hook given in ``--settings`` (:mod:`corral._insandbox.command_gate`).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from typing import Any, ClassVar

from ag_ui.core import BaseEvent

from corral._errors import ConfigError
from corral.harness._base import RunContext
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
    policy_words,
    token_usage,
)
from corral.harness import _events as ev
from corral.net._model_proxy import ModelApi
from corral.tools._output import DEFAULT_OUTPUT_RETRIES, OUTPUT_CANDIDATE_EVENT

__all__ = ["ClaudeCodeHarness", "ClaudeCodeTranslator"]

READ_TOOLS = ("Read", "Glob", "Grep", "LS", "TodoWrite", "Task", "Agent", "ToolSearch", "Skill")
WRITE_TOOLS = ("Edit", "Write", "NotebookEdit", "MultiEdit")
NET_TOOLS = ("WebFetch", "WebSearch")
SERVER_NET_TOOL = "WebSearch"
"""Runs on the model provider's servers, so no allowlist of ours can confine it."""
PROMPT_TOOL = "mcp__corral__permission_prompt"
"""Claude Code's name for :data:`corral.tools._permission.PERMISSION_TOOL`."""
_ALLOWLIST_ENFORCED = ("network: allow_hosts {} -> the sandbox has no network; commands and "
                       "WebFetch reach only those hosts through the egress proxy; "
                       "--disallowedTools WebSearch (it runs on the model provider's servers)")


def _bash_rule(pattern: str) -> str | None:
    words = policy_words(pattern)
    if words is None:
        return None
    if words[-1] == "*" and len(words) > 1:
        return f"Bash({' '.join(words[:-1])}:*)"
    if words == ["*"]:
        return "Bash"
    return f"Bash({' '.join(words)})"


def first_start_config(version: str) -> bytes:
    """A ``~/.claude.json`` holding what Claude Code writes there on its first start in a
    fresh home (``version``'s first-start fields and finished migrations, as 2.1.332
    writes them; no ``machineID``: the CLI makes its own).

    Why: every sandbox home starts empty, and the first start then rewrites the file
    several times from concurrent tasks, while the ACP adapter's ``claude auth status``
    does the same in another process. The writers contend for the file's lock
    (``~/.claude.json.lock``) and the loser retries after a backoff of ~300 ms, on the
    start-up path (``strace``: ``mkdir`` of the lock fails with ``EEXIST``, then the CLI
    idles in a timer for 200-350 ms; in roughly half of the runs). With the file there,
    the start has none of these writes to make (later writes still take the lock, but
    were not seen to stall the CLI). A CLI of another version runs its own missing
    migrations as usual."""
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")
    return json.dumps({
        "firstStartTime": now.replace("+00:00", "Z"),
        "firstStartVersion": version,
        "opusProMigrationComplete": True,
        "seenNotifications": {},
        "hasResetAutoModeOptInForDefaultOffer": True,
        "migrationVersion": 15,
    }, indent=2).encode()


def claude_env(opts: CliOptions, base_url: str) -> dict[str, str]:
    """Claude Code's environment for a run through corral's model proxy (placeholder key,
    no traffic but the model's, the CLI's own retries bounded); the ACP adapter's too."""
    return {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": opts.api_key,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_MAX_RETRIES": str(opts.max_retries),
    }


class ClaudeCodeHarness(CliHarness):
    """The Claude Code adapter (see the module docstring)."""

    name: ClassVar[str] = "claude-code"
    model_api: ClassVar[ModelApi] = "anthropic"
    native_output: ClassVar[bool] = True
    session_dirs: ClassVar[tuple[str, ...]] = (".claude/projects",)
    instructions_file: ClassVar[str] = ".claude/CLAUDE.md"

    def map_policy(self, policy: PolicyLike | None) -> PolicyMapping:
        if policy is None or (policy.default == "allow" and not policy.allow
                              and not policy.ask and not policy.deny
                              and policy.file_write == "allow"):
            enforced = [("default: allow -> --permission-mode bypassPermissions (the sandbox "
                         "is the boundary)")]
            disallowed: list[str] = []
            if policy is not None:  # what it would allow is allowed here anyway
                _map_network(policy, [], disallowed, enforced)
            argv = ["--permission-mode", "bypassPermissions"]
            if disallowed:
                argv += ["--disallowedTools", *disallowed]
            return PolicyMapping(self.name, tuple(argv), {"IS_SANDBOX": "1"}, tuple(enforced),
                                 bypass=True)
        if self.permission_prompt:
            return self._prompt_mapping(policy)
        problems: list[str] = []
        enforced = []
        allowed: list[str] = list(READ_TOOLS)
        disallowed = []
        if policy.ask:
            problems.append(f"ask rules {list(policy.ask)}: Claude Code has no approval channel "
                            "in corral yet; use allow or deny")
        if policy.default == "ask":
            problems.append("default: ask: Claude Code has no approval channel in corral yet; "
                            "use default 'allow' or 'deny'")
        for pattern in policy.deny:
            rule = _bash_rule(pattern)
            if rule is None:
                problems.append(f"deny {pattern!r}: Claude Code matches plain word prefixes "
                                "only (like 'rm -rf *')")
            else:
                disallowed.append(rule)
                enforced.append(f"deny {pattern!r} -> --disallowedTools {rule}")
        if policy.default == "allow":
            allowed.append("Bash")
            enforced.append("default: allow -> --allowedTools Bash")
        else:
            for pattern in policy.allow:
                rule = _bash_rule(pattern)
                if rule is None:
                    problems.append(f"allow {pattern!r}: Claude Code matches plain word "
                                    "prefixes only (like 'pytest *')")
                else:
                    allowed.append(rule)
                    enforced.append(f"allow {pattern!r} -> --allowedTools {rule}")
            enforced.append("default: deny -> --permission-mode dontAsk (unlisted commands "
                            "are refused)")
        if policy.file_write == "allow":
            allowed += WRITE_TOOLS
        elif policy.file_write == "deny":
            if policy.default == "allow":
                problems.append("file_write: deny with default: allow: Claude Code cannot stop "
                                "allowed shell commands from writing files; use default: deny")
            disallowed += WRITE_TOOLS
            enforced.append("file_write: deny -> --disallowedTools Edit Write NotebookEdit "
                            "MultiEdit; shell redirections need approval and are refused")
        else:
            problems.append("file_write: ask: no approval channel yet; use allow or deny")
        _map_network(policy, allowed, disallowed, enforced)
        if problems:
            raise ConfigError("policy rules Claude Code cannot enforce: " + "; ".join(problems))
        argv = ["--permission-mode", "dontAsk", "--allowedTools", *allowed]
        if disallowed:
            argv += ["--disallowedTools", *disallowed]
        return PolicyMapping(self.name, tuple(argv), {}, tuple(enforced))

    def _prompt_mapping(self, policy: PolicyLike) -> PolicyMapping:
        """Every Bash command (and whatever else no fixed rule settles) goes to corral's
        permission prompt tool, which evaluates the policy live (ask → a corral approval)."""
        enforced = [f"commands -> {PROMPT_TOOL} (corral evaluates the policy on each "
                    "command; ask rules raise a corral approval)",
                    "commands Claude Code deems read-only -> the same decision through a "
                    "PreToolUse hook on Bash (--settings; it fails closed)"]
        allowed: list[str] = [*READ_TOOLS, "mcp__corral"]
        disallowed: list[str] = []
        # Claude Code runs commands it deems read-only (echo, ls, ...) without asking the
        # prompt tool: the Bash gate hook (cli_argv) asks corral about those too, and deny
        # rules it can match are given to it as well.
        for pattern in policy.deny:
            rule = _bash_rule(pattern)
            if rule is not None:
                disallowed.append(rule)
                enforced.append(f"deny {pattern!r} -> --disallowedTools {rule}")
        if policy.file_write == "allow":
            allowed += WRITE_TOOLS
        elif policy.file_write == "deny":
            disallowed += WRITE_TOOLS
            enforced.append("file_write: deny -> --disallowedTools Edit Write NotebookEdit "
                            "MultiEdit")
        else:
            enforced.append(f"file_write: ask -> {PROMPT_TOOL} (a corral approval)")
        _map_network(policy, allowed, disallowed, enforced)
        # "default" mode: what the lists do not settle is asked of the prompt tool.
        argv = ["--permission-mode", "default", "--permission-prompt-tool", PROMPT_TOOL,
                "--allowedTools", *allowed]
        if disallowed:
            argv += ["--disallowedTools", *disallowed]
        return PolicyMapping(self.name, tuple(argv), {}, tuple(enforced),
                             permission_prompt=True)

    def cli_argv(self, opts: CliOptions) -> list[str]:
        if self.policy_mapping.permission_prompt and "corral" not in opts.mcp_servers:
            raise ConfigError("this Claude Code policy mapping asks corral's permission "
                              "prompt tool, which needs the corral MCP server: prepare the "
                              "agent with host_tools=True (the Runner does)")
        argv = ["-p", "--output-format", "stream-json", "--verbose",
                *self.policy_mapping.argv]
        if self.policy is not None:
            # Under a policy no settings file is read: a repository's (or the agent's own)
            # .claude/settings*.json could widen permissions or turn hooks off.
            argv += ["--setting-sources", ""]
        if ("corral" in opts.mcp_servers and "--allowedTools" in argv
                and not self.policy_mapping.permission_prompt):
            # Under a policy only listed tools run; host tools have their own gate
            # (approval=True), so the server's tools are allowed as a whole.
            argv.insert(argv.index("--allowedTools") + 1, "mcp__corral")
        if opts.model:
            argv += ["--model", opts.model]
        if opts.resume:
            argv += ["--resume", opts.resume]
        if self.policy_mapping.permission_prompt:
            argv += ["--settings", json.dumps(bash_gate_settings(opts))]
        if opts.mcp_servers:
            servers = {}
            for name, s in opts.mcp_servers.items():
                if isinstance(s.get("url"), str):
                    servers[name] = {"type": s.get("type", "http"), "url": s["url"],
                                     "headers": dict(s.get("headers") or {})}
                else:
                    servers[name] = {"command": s["command"], "args": list(s.get("args") or []),
                                     "env": dict(s.get("env") or {})}
            argv += ["--mcp-config", json.dumps({"mcpServers": servers}), "--strict-mcp-config"]
        if self.output_schema is not None:
            # Claude Code's structured output: a StructuredOutput tool it validates itself,
            # answering the model with the mismatch (bounded: MAX_STRUCTURED_OUTPUT_RETRIES)
            argv += ["--json-schema", json.dumps(self.output_schema)]
        argv += list(opts.extra_args)
        return argv

    def cli_env(self, opts: CliOptions, base_url: str) -> dict[str, str]:
        env = self._base_env(opts, base_url)
        if self.output_schema is not None:
            env["MAX_STRUCTURED_OUTPUT_RETRIES"] = str(DEFAULT_OUTPUT_RETRIES)
        if "corral" in opts.mcp_servers:
            # Host tools are offered to the model directly; with tool search on, Claude
            # Code hides MCP tools behind a ToolSearch round trip.
            env["ENABLE_TOOL_SEARCH"] = "false"
        return env

    def _base_env(self, opts: CliOptions, base_url: str) -> dict[str, str]:
        return claude_env(opts, base_url)

    def session_id(self, obj: Mapping[str, Any]) -> str | None:
        if obj.get("type") in ("system", "result") and isinstance(obj.get("session_id"), str):
            sid: str = obj["session_id"]
            return sid
        return None

    def session_problem(self, files: Mapping[str, bytes], session_id: str) -> str | None:
        """The transcript ``.claude/projects/<cwd>/<session id>.jsonl`` must be there with
        a readable line (else: "No conversation found with session ID")."""
        return transcript_problem(files, session_id, under=".claude/projects/",
                                  named=f"{session_id}.jsonl")

    def translator(self, ctx: RunContext, *, at_offset: int | None = None
                   ) -> ClaudeCodeTranslator:
        if at_offset is not None:
            raise ConfigError("the claude-code translator resumes by replay, not by offset")
        return ClaudeCodeTranslator(ctx)


HOST_TOOL_PREFIX = "mcp__corral__"
"""How Claude Code names the tools of corral's own MCP server ``corral`` (host tools)."""


def host_tool_name(name: str | None) -> str:
    """The event name of a tool call: a host tool under its own name (Claude Code calls it
    ``mcp__corral__<name>``); every other tool, other MCP servers' included, as named."""
    if not name:
        return "tool"
    if name.startswith(HOST_TOOL_PREFIX) and len(name) > len(HOST_TOOL_PREFIX):
        return name[len(HOST_TOOL_PREFIX):]
    return name


class ClaudeCodeTranslator(JsonlTranslator):
    """stream-json lines → AG-UI events (see the module docstring)."""

    harness: ClassVar[str] = "claude-code"
    resume_refusals: ClassVar[tuple[str, ...]] = ("No conversation found with session ID",)

    def on_event(self, obj: dict[str, Any]) -> list[BaseEvent]:
        kind = obj.get("type")
        if kind == "system":
            return self._system(obj)
        if kind == "assistant":
            return self._assistant(obj)
        if kind == "user":
            return self._user(obj)
        if kind == "result":
            return self._result(obj)
        name = kind if isinstance(kind, str) and kind else "unknown"
        return [self.custom(name, obj)]

    def _system(self, obj: dict[str, Any]) -> list[BaseEvent]:
        subtype = as_str(obj.get("subtype")) or "unknown"
        sid = as_str(obj.get("session_id"))
        if subtype == "init" and sid:
            tools = obj.get("tools")
            return self.session_event(
                sid,
                model=as_str(obj.get("model")),
                cwd=as_str(obj.get("cwd")),
                tools=tools if isinstance(tools, list) else None,
                permissionMode=as_str(obj.get("permissionMode")),
                version=as_str(obj.get("claude_code_version")),
            )
        return [self.custom(f"system.{subtype}", obj)]

    def _assistant(self, obj: dict[str, Any]) -> list[BaseEvent]:
        message = obj.get("message")
        if not isinstance(message, dict) or not isinstance(message.get("content"), list):
            return [self.custom("assistant", obj)]
        out: list[BaseEvent] = []
        parent = as_str(message.get("id"))
        if isinstance(obj.get("error"), str) or message.get("model") == "<synthetic>":
            # A synthetic message carrying an API error: its text is Claude's error message.
            text = flatten_text(message.get("content")).strip()
            if text:
                self.error_message = text
                self.error_code = f"claude-code:{obj.get('error') or 'api_error'}"
        for i, block in enumerate(message["content"]):
            if not isinstance(block, dict):
                out.append(self.custom("assistant.block", block))
                continue
            btype = block.get("type")
            if btype == "text":
                out += self.text(self.id("m", i), as_str(block.get("text")) or "")
            elif btype in ("thinking", "redacted_thinking"):
                out += self.reasoning(self.id("r", i), as_str(block.get("thinking")) or "")
            elif btype in ("tool_use", "server_tool_use", "mcp_tool_use"):
                tool_id = as_str(block.get("id")) or self.id("t", i)
                out += self.tool_start(tool_id, host_tool_name(as_str(block.get("name"))),
                                       block.get("input", {}), parent=parent)
            else:
                out.append(self.custom("assistant.block", block))
        return out

    def _user(self, obj: dict[str, Any]) -> list[BaseEvent]:
        message = obj.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            return [self.custom("user", obj)]
        out: list[BaseEvent] = []
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                tool_id = as_str(block.get("tool_use_id"))
                if not tool_id:
                    out.append(self.custom("user.block", block))
                    continue
                text = flatten_text(block.get("content"))
                out += self.tool_result(tool_id, text)
            else:
                out.append(self.custom("user.block", block))
        return out

    def _result(self, obj: dict[str, Any]) -> list[BaseEvent]:
        out: list[BaseEvent] = []
        sid = as_str(obj.get("session_id"))
        if sid:
            out += self.session_event(sid)
        usage = obj.get("usage")
        if isinstance(usage, dict):
            model_usage = obj.get("modelUsage")
            model = next(iter(model_usage), None) if isinstance(model_usage, dict) else None
            self.usage = [token_usage(
                model if isinstance(model, str) else None,
                provider="anthropic",
                input_tokens=as_int(usage.get("input_tokens")),
                output_tokens=as_int(usage.get("output_tokens")),
                cached=as_int(usage.get("cache_read_input_tokens")),
                cache_write=as_int(usage.get("cache_creation_input_tokens")),
            )]
        text = as_str(obj.get("result"))
        if obj.get("is_error") is True or (obj.get("subtype") not in (None, "success")):
            errors = obj.get("errors")
            detail = text or (flatten_text(errors) if errors else "")
            reason = as_str(obj.get("terminal_reason")) or as_str(obj.get("subtype")) or "error"
            self.error_message = detail or self.error_message or f"Claude Code failed ({reason})"
            self.error_code = f"claude-code:{reason}"
            denials = obj.get("permission_denials")
            if denials:
                out.append(self.custom("permission_denials", denials))
            return out
        self.succeeded = True
        self.error_message = None
        if "structured_output" in obj:
            # corral validates it again and logs it as corral.output (runs._output_end)
            out.append(ev.custom(OUTPUT_CANDIDATE_EVENT, {"value": obj["structured_output"]}))
        self.result = {k: v for k, v in {
            "text": text,
            "sessionId": sid,
            "numTurns": as_int(obj.get("num_turns")),
            "durationMs": as_int(obj.get("duration_ms")),
            "costUsd": obj.get("total_cost_usd") if isinstance(
                obj.get("total_cost_usd"), (int, float)) else None,
            "stopReason": as_str(obj.get("stop_reason")),
        }.items() if v is not None}
        denials = obj.get("permission_denials")
        if denials:
            out.append(self.custom("permission_denials", denials))
        return out


def _map_network(
    policy: PolicyLike, allowed: list[str], disallowed: list[str], enforced: list[str]
) -> None:
    """Claude Code's web tools under the policy's network rule (shared by both mappings)."""
    if policy.network != "allow":
        disallowed += NET_TOOLS
        enforced.append("network: deny -> --disallowedTools WebFetch WebSearch, and the "
                        "sandbox has no network")
    elif allow_hosts(policy):
        allowed.append("WebFetch")
        disallowed.append(SERVER_NET_TOOL)
        enforced.append(_ALLOWLIST_ENFORCED.format(list(allow_hosts(policy))))
    else:
        allowed += NET_TOOLS


def bash_gate_settings(opts: CliOptions) -> dict[str, Any]:
    """Claude Code settings (for ``--settings``) with a PreToolUse hook on Bash that asks
    corral's policy about every command, the read-only ones Claude Code would otherwise run
    unasked included (:mod:`corral._insandbox.command_gate`; it fails closed). The hook waits
    as long as an approval takes: the host side always answers (a timeout denies)."""
    return {"hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [
        {"type": "command", "command": bash_gate_command(opts), "timeout": GATE_TIMEOUT}]}]}}

