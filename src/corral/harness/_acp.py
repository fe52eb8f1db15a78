"""``--harness acp``: any Agent Client Protocol agent, driven durably by a host-side bridge.

``corral run --harness acp --agent opencode|… [--model M] "PROMPT"`` (or ``--agent-command
'CMD …'``). The agent (a profile of :mod:`corral.harness._acp_agents`) runs in the sandbox
behind the in-sandbox entry, like any agent CLI (model proxy, egress, host tools, sessions:
:func:`corral.agents._prepare.prepare_agent`). What differs is who talks to it: the ACP
bridge (:mod:`corral._insandbox.acp_client`) runs on the host as the journal supervisor's
child, outside the sandbox and outliving the driver, and writes every protocol message to
the journal. :meth:`AcpHarness.bridge_config` is the harness's part of the bridge's
configuration; ``PreparedAgent.agent_spec`` adds the sandbox's host command and the
permission channel.

``AgentRequest.options``: those of every CLI harness (:mod:`corral.harness._cli_base`) plus
``agent`` / ``agent_command`` (read when the harness is built: :class:`AcpConfig`,
so the run spec keeps them for a successor host).

Journal → AG-UI (:class:`AcpTranslator`, pure; state rebuilt by replay):

* ``session/update`` ``agent_message_chunk`` → one text message per run of chunks,
  ``agent_thought_chunk`` → ``REASONING_*``; ``tool_call`` / ``tool_call_update`` →
  ``TOOL_CALL_START`` (+ ``ARGS`` from ``rawInput`` once known; for gemini, an
  ``execute`` call's title and another call's JSON content before it runs) and, when the call is
  ``completed`` or ``failed``, ``TOOL_CALL_END`` + ``TOOL_CALL_RESULT`` (its text content,
  else ``rawOutput``); ``execute`` tools are named ``shell`` with ``{"command": ...}``,
  the run's host tools go by their own names, others by their ACP kind; any other update
  (``plan``, ``available_commands_update``, …) → ``CUSTOM acp.<type>``. Updates between
  a ``session/load`` or ``session/resume`` and the prompt (replayed history, the agent's
  own announcements) are not events of this run.
* ``session/request_permission`` for a call not yet announced opens its
  ``TOOL_CALL_START``; a refusal (the bridge's ``permission`` note) is that call's result
  (``denied: …``).
* the ``session/new`` result (or the ``session/resume`` / ``session/load`` request that
  succeeded) →
  ``CUSTOM corral.session`` ``{harness: "acp", sessionId, agent}`` (resume on the thread).
* the ``session/prompt`` response: ``stopReason`` ``end_turn`` → ``RUN_FINISHED`` (so does
  one the profile names in ``finished_on``, after ``CUSTOM acp.stopped``: gemini's
  ``max_turn_requests``, its loop detection); any other stop reason or an error →
  ``RUN_ERROR``; the exit without one → ``RUN_ERROR`` (exit
  status, signal, timeout). Every tool call gets a result.
* the bridge's notes (``resume-failed``, ``no-load-session``, ``oversized-line``, …) → ``CUSTOM acp.note``;
  lines that are not JSON → ``RAW``.

Ids: ``<run id>-<ACP toolCallId>`` for tool calls, ``<run id>-m<journal offset>`` for
messages.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar, Final

from ag_ui.core import (
    BaseEvent,
    ReasoningEndEvent,
    ReasoningMessageContentEvent,
    ReasoningMessageEndEvent,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
)

from pydantic import ValidationInfo, field_validator

from corral._errors import ConfigError
from corral.harness import _events as ev
from corral.harness._acp_agents import AcpAgent, agent_profile
from corral.harness._opencode import OPENCODE_REFUSALS
from corral.harness._base import AgentCommand, AgentRequest, RunContext
from corral.harness._config import HarnessConfig
from corral.harness._cli_base import (
    SESSION_LOST_CODE,
    CliConfig,
    CliHarness,
    NO_RESULT,
    CliOptions,
    JsonlTranslator,
    PolicyLike,
    as_int,
    as_str,
    egress_env,
    entry_argv,
    flatten_text,
    token_usage,
)
from corral.harness._packages import AGENTS_MOUNT, package_for
from corral.journal._reader import Exit, JournalItem
from corral.net._model_proxy import ModelApi
from corral.tools._names import SERVER_NAME

__all__ = ["AcpHarness", "AcpTranslator", "OpencodeAcpTranslator", "acp_mcp_servers"]

_SESSION_STATE = frozenset({"available_commands_update", "usage_update",
                            "config_option_update", "current_mode_update"})
"""Session-state updates that are no event of a run (agents send them when they like, so
two runs of one script would differ; usage comes with the prompt's result)."""
_ACP_KEYS = ("agent", "agent_command")
_KIND_NAMES = {"execute": "shell", "edit": "edit", "delete": "delete", "move": "move",
               "read": "read", "search": "search", "fetch": "fetch", "think": "think"}
DENIED = "denied: "
_HOST_TOOL = re.compile(rf"^(?:{SERVER_NAME}_|mcp__{SERVER_NAME}__|mcp_{SERVER_NAME}_)"
                        rf"([A-Za-z0-9_.-]+)$|^([A-Za-z0-9_.-]+) \({SERVER_NAME} MCP Server\)$")
"""The run's host tools as opencode (``corral_x``), Claude (``mcp__corral__x``) and gemini
(``mcp_corral_x``, title ``x (corral MCP Server)``) name them."""


def acp_mcp_servers(servers: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The ``mcp_servers`` option in ACP's ``session/new`` form (header values keep their
    ``${VAR}`` references: the bridge fills them in on the wire, never in the journal)."""
    out: list[dict[str, Any]] = []
    for name, server in servers.items():
        if isinstance(server.get("url"), str):
            out.append({"type": "http", "name": name, "url": server["url"],
                        "headers": [{"name": str(k), "value": str(v)} for k, v in
                                    dict(server.get("headers") or {}).items()]})
        else:
            out.append({"name": name, "command": str(server["command"]),
                        "args": [str(a) for a in server.get("args") or []],
                        "env": [{"name": str(k), "value": str(v)} for k, v in
                                dict(server.get("env") or {}).items()]})
    return out


class AcpConfig(CliConfig):
    """What the acp harness is built from: :class:`CliConfig` plus the ACP agent
    (``agent`` or ``agent_command``) and the run's ``model``."""

    agent: str | None = None
    agent_command: str | None = None
    model: str | None = None

    @field_validator("agent", "agent_command", "model", mode="before")
    @classmethod
    def _text(cls, value: Any, info: ValidationInfo) -> str | None:
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigError(f"acp: {info.field_name!r} must be a non-empty string")
        return value


class AcpHarness(CliHarness):
    """The ACP harness (see the module docstring)."""

    name: ClassVar[str] = "acp"
    config_model: ClassVar[type[HarnessConfig]] = AcpConfig
    session_markers: ClassVar[tuple[bytes, ...]] = (b'"sessionId"',)

    def __init__(self, *, agent: str | None = None, agent_command: str | None = None,
                 model: str | None = None, version: str | None = None,
                 policy: PolicyLike | None = None, permission_prompt: bool = False) -> None:
        self.profile: AcpAgent = agent_profile(agent, agent_command)
        self.agent = agent
        self.agent_command = agent_command
        self.profile.check_model(model)
        self.model = model or self.profile.default_model
        self.package = package_for(self.profile.package or "opencode")
        self.version = version or self.package.version
        self.policy = policy
        self.permission_prompt = permission_prompt
        # CliHarness's class-level settings, per profile here: instance attributes shadow
        # them (set through vars(): they are ClassVars for the one-CLI harnesses)
        vars(self).update(session_dirs=self.profile.session_dirs,
                          cleared_home_files=self.profile.cleared_home_files,
                          instructions_file=self.profile.instructions_file,
                          max_model_failures=self.profile.max_model_failures)
        # Definition time: an unenforceable rule raises here.
        self.acp_policy = self.profile.map_policy(policy, permission_prompt)
        self.policy_mapping = self.acp_policy.mapping

    @property
    def bridged(self) -> bool:
        """Always: the agent is driven by corral's host-side ACP bridge."""
        return True

    @property
    def needs_install(self) -> bool:
        """Whether the agent comes from a corral install (not ``--agent-command``)."""
        return self.profile.package is not None

    def upstream_api(self) -> ModelApi:
        return self.profile.upstream_api(self.model)

    @property
    def guarded_workspace_files(self) -> tuple[str, ...]:
        """The profile's (gemini's ``.gemini/settings.json`` under command rules)."""
        return self.profile.guarded_workspace_files(self.acp_policy)

    def check_workspace_file(self, rel: str, data: bytes) -> None:
        self.profile.check_workspace_file(rel, data)

    def bin_under(self, install_dir: str) -> str:
        return f"{install_dir}/{self.profile.bin_dir}/{self.profile.bin}"

    @property
    def default_bin(self) -> str:
        return self.bin_under(f"{AGENTS_MOUNT}/{self.package.name}/{self.version}")

    def map_policy(self, policy: PolicyLike | None) -> Any:  # pragma: no cover - see __init__
        raise NotImplementedError

    def session_problem(self, files: Mapping[str, bytes], session_id: str) -> str | None:
        return self.profile.session_problem(files, session_id)

    def session_id(self, obj: Mapping[str, Any]) -> str | None:
        """The ACP session id a journal line carries (a ``session/new`` result, or the
        request that loads or prompts a session)."""
        msg = obj.get("msg")
        if not isinstance(msg, Mapping):
            return None
        if obj.get("acp") == "recv" and isinstance(msg.get("result"), Mapping):
            return as_str(msg["result"].get("sessionId")) or None
        if obj.get("acp") == "send" and msg.get("method") == "session/prompt" and \
                isinstance(msg.get("params"), Mapping):
            return as_str(msg["params"].get("sessionId")) or None
        return None

    def _options(self, request: AgentRequest) -> CliOptions:
        return CliOptions.parse({k: v for k, v in request.options.items()
                                 if k not in _ACP_KEYS})

    def _base_url(self, opts: CliOptions) -> str:
        return (opts.base_url or "http://127.0.0.1:{corral.port.model}") + \
            self.profile.base_url_suffix

    def home_files(self, opts: CliOptions) -> dict[str, bytes]:
        return self.profile.home_files(self.model, self._base_url(opts), opts,
                                       self.acp_policy)

    def seed_home_files(self) -> dict[str, bytes]:
        return self.profile.seed_home_files(self.version)

    def build_command(self, request: AgentRequest) -> AgentCommand:
        """The agent in the sandbox (wrapped with the entry, which announces its ports to
        the bridge); the prompt is the bridge's (see :meth:`bridge_config`)."""
        opts = self._options(request)
        if request.prompt is None or not request.prompt.strip():
            raise ConfigError("the acp harness needs a non-empty prompt")
        if opts.model and opts.model != self.model:
            raise ConfigError(f"acp: the model is chosen when the harness is built "
                              f"({self.model}), not per request ({opts.model})")
        bin_path = opts.bin or self.default_bin
        argv = self.profile.argv(bin_path)
        env = {"TERM": "dumb", "NO_COLOR": "1", **self.profile.bin_env(bin_path)}
        env.update(self.profile.env(self.model, self._base_url(opts), opts, self.acp_policy))
        env.update(egress_env(opts))
        env.update(request.env)
        env.update(opts.env)
        if opts.forward is None:
            raise ConfigError("the acp harness runs through corral.agents._prepare."
                              "prepare_agent (the model endpoint and the bridge)")
        argv = entry_argv(opts.python, argv, forward=opts.forward, announce=True)
        return AgentCommand(argv=argv, env=env, cwd=request.workdir,
                            stdin=request.prompt.encode("utf-8"), timeout=opts.timeout)

    def bridge_config(self, request: AgentRequest) -> dict[str, Any]:
        """The bridge's part: prompt, session cwd, ``mcpServers``, resume, mode."""
        opts = self._options(request)
        return {
            "prompt": request.prompt or "",
            "workdir": request.workdir,
            "mcp_servers": acp_mcp_servers(opts.mcp_servers),
            "resume": opts.resume,
            "mode": self.profile.mode,
            "ask_corral": self.acp_policy.ask_corral,
            "command_in_title": self.profile.command_in_title,
            "session_params": self.profile.session_params(opts, self.acp_policy),
        }

    def translator(self, ctx: RunContext, *, at_offset: int | None = None) -> AcpTranslator:
        if at_offset is not None:
            raise ConfigError("the acp translator resumes by replay, not by offset")
        return AcpTranslator(ctx, agent=self.agent or "command",
                             command_in_title=self.profile.command_in_title,
                             args_in_content=self.profile.args_in_content,
                             finished_on=self.profile.finished_on)


class _Tool:
    __slots__ = ("args", "id", "name")

    def __init__(self, tool_id: str, name: str) -> None:
        self.id = tool_id
        self.name = name
        self.args: Any = None
        """The latest ``rawInput`` (agents fill it in over several updates): sent as the
        call's ``TOOL_CALL_ARGS`` when it ends."""


_REOPEN_FAILURES: Final = {
    "resume-failed": "the agent refused session/resume",
    "no-load-session": "the agent cannot load a session",
    "load-failed": "the agent refused session/load",
}
"""The bridge's notes on reopening the thread's session: why it was lost, if it was."""


class AcpTranslator(JsonlTranslator):
    """Bridge journal lines → AG-UI events (see the module docstring)."""

    harness: ClassVar[str] = "acp"
    resume_refusals: ClassVar[tuple[str, ...]] = OPENCODE_REFUSALS
    last_message_result: ClassVar[bool] = False
    """The result's text is the turn's last text message (else all of the turn's text)."""

    def __init__(self, ctx: RunContext, agent: str = "command",
                 command_in_title: bool = False, args_in_content: bool = False,
                 finished_on: frozenset[str] = frozenset()) -> None:
        super().__init__(ctx)
        self.agent = agent
        self.requests: dict[int, str] = {}
        """Our request ids → their methods."""
        self.loading: str | None = None
        self.replaying = False
        """Between ``session/load`` and ``session/prompt``: updates replay history."""
        self.command_in_title = command_in_title
        self.args_in_content = args_in_content
        self.finished_on = finished_on
        """Stop reasons besides ``end_turn`` that end the run as finished (after a
        ``CUSTOM acp.stopped`` naming it): the agent's own way of ending a turn."""
        self.message: str | None = None
        self.thought: str | None = None
        self.text_parts: list[str] = []
        self.last_text: list[str] = []
        """The latest text message's chunks."""
        self.tools: dict[str, _Tool] = {}

    # -- lines
    def on_event(self, obj: dict[str, Any]) -> list[BaseEvent]:
        kind = obj.get("acp")
        msg = obj.get("msg")
        if kind == "note":
            return self._note(obj)
        if not isinstance(msg, dict):
            return [self.custom("unknown", obj)]
        if kind == "send":
            return self._sent(msg)
        if kind == "recv":
            return self._received(msg)
        return [self.custom("unknown", obj)]

    def _sent(self, msg: dict[str, Any]) -> list[BaseEvent]:
        method, mid = msg.get("method"), msg.get("id")
        if isinstance(method, str) and isinstance(mid, int) and not isinstance(mid, bool):
            self.requests[mid] = method
            params = msg.get("params") if isinstance(msg.get("params"), dict) else {}
            assert isinstance(params, dict)
            if method in ("session/load", "session/resume"):
                self.loading = as_str(params.get("sessionId"))
                self.replaying = True
            elif method == "session/prompt":
                # (gemini streams some of the loaded history after the load's result)
                self.replaying = False
        return []

    def _received(self, msg: dict[str, Any]) -> list[BaseEvent]:
        method = msg.get("method")
        params = msg.get("params") if isinstance(msg.get("params"), dict) else {}
        assert isinstance(params, dict)
        if isinstance(method, str):
            if method == "session/update":
                update = params.get("update")
                if self.replaying or not isinstance(update, dict):
                    return []  # history replayed by session/load: not this run's events
                return self._update(update)
            if method == "session/request_permission":
                tc = params.get("toolCall")
                return self._tool(tc, announce_only=True) if isinstance(tc, dict) else []
            return [self.custom("request", {"method": method})]
        mid = msg.get("id")
        method = self.requests.pop(mid, None) \
            if isinstance(mid, int) and not isinstance(mid, bool) else None
        result = msg.get("result")
        error = msg.get("error")
        if method in ("session/load", "session/resume"):
            loaded, self.loading = self.loading, None
            if isinstance(result, dict) or result is None and error is None:
                self.replaying = True
                return self._session(loaded)
            return []
        if method == "session/new":
            if isinstance(result, dict):
                return self._session(as_str(result.get("sessionId")))
            self._fail(error, "the agent could not start a session")
            return []
        if method == "session/set_mode" and error is not None:
            self._fail(error, "the agent refused the session mode")
            return []
        if method == "initialize":
            if isinstance(result, dict):
                return [self.custom("initialize", {k: result.get(k) for k in (
                    "protocolVersion", "agentInfo", "agentCapabilities")})]
            self._fail(error, "the agent refused to initialize")
            return []
        if method == "session/prompt":
            out = self._close_text()
            if isinstance(result, dict):
                reason = result.get("stopReason")
                self._usage(result.get("usage"), result.get("_meta"))
                if reason == "end_turn" or reason in self.finished_on:
                    if reason != "end_turn":  # the turn ended, not as the model chose
                        out.append(self.custom("stopped", {"stopReason": reason}))
                    self.succeeded = True
                    text = "".join(self.last_text if self.last_message_result
                                   else self.text_parts)
                    self.result = {"text": text, "sessionId": self.session} \
                        if self.session else {"text": text}
                else:
                    name = reason if isinstance(reason, str) else "unknown"
                    self.error_message = f"the agent stopped: {name[:100]}"
                    self.error_code = "cancelled" if name == "cancelled" else f"acp:{name[:100]}"
            else:
                # the Claude adapter says why only in the turn's last text (e.g. the model
                # proxy's "token budget … used up" behind "Authentication required")
                said = "".join(self.last_text).strip()
                self._fail(error, "the agent failed the prompt", said[:500])
            return out
        return []

    def _usage(self, usage: Any, meta: Any = None) -> None:
        quota = meta.get("quota") if isinstance(meta, dict) else None
        tokens = quota.get("token_count") if isinstance(quota, dict) else None
        if not isinstance(usage, dict) and isinstance(tokens, dict):  # gemini's
            usage = {"inputTokens": tokens.get("input_tokens"),
                     "outputTokens": tokens.get("output_tokens")}
        if isinstance(usage, dict):
            self.usage = [token_usage(None, input_tokens=as_int(usage.get("inputTokens")),
                                      output_tokens=as_int(usage.get("outputTokens")),
                                      cached=as_int(usage.get("cachedReadTokens")),
                                      cache_write=as_int(usage.get("cachedWriteTokens")),
                                      reasoning=as_int(usage.get("thoughtTokens")))]

    def _session(self, sid: str | None) -> list[BaseEvent]:
        return self.session_event(sid, agent=self.agent) if sid else []

    def _fail(self, error: Any, default: str, said: str = "") -> None:
        message = as_str(error.get("message")) if isinstance(error, dict) else None
        if self.error_message is None:
            self.error_message = f"{default}: {message}" if message else default
            if said and said not in self.error_message:
                self.error_message += f" ({said})"
            self.error_code = "acp:error"

    def _note(self, obj: dict[str, Any]) -> list[BaseEvent]:
        event = obj.get("event")
        if event == "permission" and obj.get("allowed") is False:
            call = as_str(obj.get("toolCallId"))
            if call:
                reason = as_str(obj.get("reason")) or "refused"
                return self._result(call, DENIED + reason)
            return []
        if event == "not-json-rpc":
            return [ev.raw({"line": obj.get("line"), "offset": self._offset}, "acp")]
        if event == "cancelled" and self.error_message is None:
            self.error_message = "the run was cancelled"
            self.error_code = "cancelled"
        if event in _REOPEN_FAILURES:
            said = _REOPEN_FAILURES[event]
            self.lost_reason = (f"{self.lost_reason}; {said}" if self.lost_reason else said)
        if event == "session-lost" and self.error_message is None:
            expected = self.ctx.resumed_session or as_str(obj.get("sessionId")) or "?"
            why = self.lost_reason or "the agent did not reopen it"
            self.error_message = (f"the saved {self.agent} session {expected} could not be "
                                  f"resumed ({why}) and on_session_lost is \"fail\"")
            self.error_code = SESSION_LOST_CODE
        if event in ("bridge-error", "mode-refused") and self.error_message is None:
            self.error_message = f"acp bridge: {event}: {obj.get('error') or obj.get('modeId')}"
            self.error_code = f"acp:{event}"
        if event in ("permission", "ports"):
            return []  # (ports: the in-sandbox forwarders' numbers, for the bridge only)
        return [self.custom("note", {k: v for k, v in obj.items() if k != "acp"})]

    # -- session/update
    def _update(self, update: dict[str, Any]) -> list[BaseEvent]:
        kind = update.get("sessionUpdate")
        if kind == "agent_message_chunk":
            return self._chunk(update.get("content"), thought=False)
        if kind == "agent_thought_chunk":
            return self._chunk(update.get("content"), thought=True)
        if kind in ("tool_call", "tool_call_update"):
            return self._close_text() + self._tool(update)
        if kind in _SESSION_STATE:
            return self._close_text()  # as any other update: the text so far is a message
        name = kind if isinstance(kind, str) and kind else "unknown"
        return [*self._close_text(), self.custom(name[:100], update)]

    def _chunk(self, content: Any, *, thought: bool) -> list[BaseEvent]:
        text = content.get("text") if isinstance(content, dict) else None
        if not isinstance(text, str):
            return [self.custom("content", content)] if content is not None else []
        out: list[BaseEvent] = []
        if thought:
            out += self._close_message()
            if self.thought is None:
                self.thought = self.id("r")
                out += [ReasoningStartEvent(message_id=self.thought),
                        ReasoningMessageStartEvent(message_id=self.thought, role="reasoning")]
            if text:
                out.append(ReasoningMessageContentEvent(message_id=self.thought, delta=text))
            return out
        out += self._close_thought()
        if self.message is None:
            self.message = self.id("m")
            self.last_text = []
            out.append(ev.text_start(self.message))
        if text:
            self.text_parts.append(text)
            self.last_text.append(text)
            out.append(ev.text_content(self.message, text))
        return out

    def _close_message(self) -> list[BaseEvent]:
        if self.message is None:
            return []
        mid, self.message = self.message, None
        return [ev.text_end(mid)]

    def _close_thought(self) -> list[BaseEvent]:
        if self.thought is None:
            return []
        rid, self.thought = self.thought, None
        return [ReasoningMessageEndEvent(message_id=rid), ReasoningEndEvent(message_id=rid)]

    def _close_text(self) -> list[BaseEvent]:
        return self._close_message() + self._close_thought()

    # -- tools
    def _tool(self, tc: dict[str, Any], *, announce_only: bool = False) -> list[BaseEvent]:
        call = as_str(tc.get("toolCallId"))
        if not call:
            return [self.custom("tool_call", tc)]
        if call in self.done_tools:
            return []
        out: list[BaseEvent] = []
        tool = self.tools.get(call)
        if tool is None:
            tool = _Tool(f"{self.ctx.run_id}-{call[:200]}", _tool_name(tc))
            self.tools[call] = tool
            self.open_tools[call] = tool.name
            out.append(ev.tool_call_start(tool.id, tool.name))
        args = _tool_args(tc, tool.name, self.command_in_title, self.args_in_content)
        if args is not None:
            tool.args = args
        status = tc.get("status")
        if not announce_only and status in ("completed", "failed"):
            text = _result_text(tc)
            if status == "failed" and not text:
                text = "failed"
            out += self._result(call, text)
        return out

    def _result(self, call: str, content: str) -> list[BaseEvent]:
        if call in self.done_tools:
            return []
        out: list[BaseEvent] = []
        tool = self.tools.get(call)
        if tool is None:
            tool = _Tool(f"{self.ctx.run_id}-{call[:200]}", "tool")
            self.tools[call] = tool
            out.append(ev.tool_call_start(tool.id, tool.name))
        if tool.args is not None:
            out.append(ev.tool_call_args(tool.id, json.dumps(tool.args, sort_keys=True)))
        out += [ev.tool_call_end(tool.id),
                ev.tool_call_result(f"{tool.id}-result", tool.id, content)]
        self.open_tools.pop(call, None)
        self.done_tools.add(call)
        return out

    def close_tools(self) -> list[BaseEvent]:
        out: list[BaseEvent] = []
        for call in list(self.open_tools):
            out += self._result(call, NO_RESULT)
        return out

    def feed(self, item: JournalItem) -> list[BaseEvent]:
        if isinstance(item, Exit) and not self.finished:
            return self._close_text() + super().feed(item)
        return super().feed(item)


def _tool_name(tc: Mapping[str, Any]) -> str:
    """A host tool's own name (however the agent spells the ``corral`` server's tools),
    else the ACP kind's (never a title: that is free text, often the command)."""
    meta = tc.get("_meta") if isinstance(tc.get("_meta"), dict) else {}
    claude = meta.get("claudeCode") if isinstance(meta, dict) else None
    for name in (tc.get("name"), claude.get("toolName") if isinstance(claude, dict) else None,
                 tc.get("title")):
        m = _HOST_TOOL.match(name) if isinstance(name, str) else None
        if m:
            return (m.group(1) or m.group(2))[:100]
    kind = tc.get("kind")
    return _KIND_NAMES.get(kind, "tool") if isinstance(kind, str) else "tool"


def _tool_args(tc: Mapping[str, Any], name: str, command_in_title: bool,
               args_in_content: bool = False) -> Any:
    raw = tc.get("rawInput")
    if name == "shell" and command_in_title and not isinstance(raw, dict):
        title = as_str(tc.get("title"))
        return {"command": title} if title else None
    if args_in_content and not isinstance(raw, dict) and name != "shell" \
            and tc.get("status") not in ("completed", "failed"):
        return _args_from_content(tc.get("content"))
    if not isinstance(raw, dict) or not raw:
        return None
    if name == "shell":
        command = raw.get("command")
        if isinstance(command, list):
            command = " ".join(str(a) for a in command)
        return {"command": command} if isinstance(command, str) else None
    return raw


def _args_from_content(content: Any) -> dict[str, Any] | None:
    """The arguments an agent gives only as the JSON text of a call's first content block
    before it runs (gemini 0.61's ``getExplanation`` of an MCP tool: its arguments as JSON,
    or ``[Payload omitted due to length …]`` past 500 characters, which gives none)."""
    block = content[0] if isinstance(content, list) and content else None
    inner = block.get("content") if isinstance(block, dict) and \
        block.get("type") == "content" else None
    text = inner.get("text") if isinstance(inner, dict) else None
    if not isinstance(text, str) or not text.startswith("{"):
        return None
    try:
        args = json.loads(text)
    except ValueError:
        return None
    return args if isinstance(args, dict) else None


def _result_text(tc: Mapping[str, Any]) -> str:
    raw = tc.get("rawOutput")
    if isinstance(raw, str):
        return raw  # the Claude adapter's plain output (its content wraps it in markdown)
    parts: list[str] = []
    for block in tc.get("content") or [] if isinstance(tc.get("content"), list) else []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "content":
            parts.append(flatten_text([block.get("content")]))
        elif block.get("type") == "diff":
            parts.append(f"edited {block.get('path')}")
    if parts:
        return "\n".join(parts)
    if isinstance(raw, dict) and isinstance(raw.get("output"), str):
        return str(raw["output"])
    return flatten_text(raw) if raw is not None else ""


class OpencodeAcpTranslator(AcpTranslator):
    """``--harness opencode`` routed through ``opencode acp`` (its policy needs approvals:
    :func:`corral.harness._opencode.acp_reasons`): the ACP translation, with the session
    event of an ``opencode`` run (``{harness: "opencode", sessionId}``) and its result (the
    turn's last text message, as ``opencode run``'s translator gives it)."""

    harness: ClassVar[str] = "opencode"
    last_message_result: ClassVar[bool] = True

    def _session(self, sid: str | None) -> list[BaseEvent]:
        return self.session_event(sid) if sid else []
