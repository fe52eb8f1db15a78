"""The ACP agents corral knows how to start (``corral run --harness acp --agent NAME``).

A profile (:class:`AcpAgent` subclass, registered in :data:`ACP_AGENTS` by name) says, for
one agent that speaks the Agent Client Protocol on stdio:

* ``package`` / ``bin`` / ``args``: the install that holds it (a :data:`KNOWN_AGENTS`
  name, installed by ``corral agents install <package>``), the executable under its
  ``node_modules/.bin`` and the arguments that start ACP mode (``opencode acp``);
* ``mode``: the ACP session mode set (``session/set_mode``) before the prompt, when the
  policy depends on it (``None``: none);
* ``session_dirs`` / ``cleared_home_files`` / ``instructions_file``: as for the CLI
  harnesses (sessions saved for resume; configuration removed before every run);
* :meth:`AcpAgent.map_policy`: how corral's policy is enforced, or
  :class:`~corral._errors.ConfigError` at definition time when it cannot be. An ACP agent
  asks (``session/request_permission``) only about what *it* deems risky, so answering
  those requests alone enforces nothing: a profile must configure the agent so every
  command is asked about, or refuse command rules;
* :meth:`AcpAgent.env` / :meth:`AcpAgent.home_files`: the agent's configuration (model
  endpoint = the in-sandbox forwarder to corral's model proxy, a placeholder key);
* :meth:`AcpAgent.upstream_api`: which API the model proxy speaks for a model.

* :meth:`AcpAgent.session_params` / ``command_in_title``: extra ``session/new`` /
  ``session/load`` parameters (the Claude adapter's ``_meta`` with corral's command gate),
  and whether ``execute`` calls carry their command only as the title (gemini);
  ``args_in_content``: other calls carry their arguments only as their content's JSON text
  before they run (gemini).

The profile object is stateless apart from what :meth:`map_policy` decides (kept on the
harness as ``AcpPolicy``); :class:`corral.harness._acp.AcpHarness` calls, in this order,
``check_model(model)`` and ``map_policy(policy, prompt)`` once at definition time, then per
run ``env(...)``, ``home_files(...)`` and ``session_params(...)``. Adding an agent:
subclass :class:`AcpAgent`, set the class attributes, implement ``upstream_api``,
``map_policy`` and ``env`` (and the others as needed), add an instance to
:data:`ACP_AGENTS`. The bridge answers permission requests from corral's policy only when
``AcpPolicy.ask_corral`` (else it allows them all: no policy), mapping the call's ACP
``kind`` (execute → ``Bash`` with its command; edit/delete/move → ``Edit``; fetch →
``WebFetch``; read/search/think and corral's own host tools → allowed; other → the policy's
default).

``--agent-command 'CMD …'``: :class:`CommandAgent`, a shell-split argv run as it is. corral
cannot know whether such an agent asks before every command, so only "no policy" (the
sandbox is the boundary) is accepted; command rules are refused at definition time.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from corral._errors import ConfigError
from corral.harness._cli_base import (
    CliOptions,
    PolicyLike,
    PolicyMapping,
    allow_hosts,
    beyond_allow_all,
)
from corral.harness._claude_code import bash_gate_settings, claude_env, first_start_config
from corral.harness._gemini_cli import SETTINGS_FILE as GEMINI_SETTINGS_FILE
from corral.harness._gemini_cli import WEB_TOOLS as GEMINI_WEB_TOOLS
from corral.harness._gemini_cli import WORKSPACE_SETTINGS as GEMINI_WORKSPACE_SETTINGS
from corral.harness._gemini_cli import check_workspace_settings, gemini_settings
from corral.harness._opencode import ENV as OPENCODE_ENV
from corral.harness._opencode import DEFAULT_MODEL as OPENCODE_DEFAULT_MODEL
from corral.harness._opencode import opencode_config, opencode_session_problem, split_model
from corral.net._model_proxy import ModelApi

__all__ = ["ACP_AGENTS", "AcpAgent", "AcpPolicy", "ClaudeAcp", "CommandAgent", "GeminiAcp",
           "OpencodeAcp", "agent_profile"]


@dataclass(frozen=True, slots=True)
class AcpPolicy:
    """What :meth:`AcpAgent.map_policy` decided: the report, whether permission requests
    are put to corral's policy (``ask_corral``; else every request is allowed: no policy),
    and agent-specific settings for :meth:`AcpAgent.env` (``settings``)."""

    mapping: PolicyMapping
    ask_corral: bool = False
    settings: Mapping[str, Any] = field(default_factory=dict)


class AcpAgent:
    """An ACP agent profile (see the module docstring)."""

    name: ClassVar[str] = ""
    package: ClassVar[str | None] = None
    """The :data:`corral.harness._packages.KNOWN_AGENTS` install holding the agent."""
    bin: ClassVar[str] = ""
    bin_dir: ClassVar[str] = "node_modules/.bin"
    """Where ``bin`` is, relative to the install directory (a companion's prefix for the
    Claude adapter)."""
    args: ClassVar[tuple[str, ...]] = ()
    mode: ClassVar[str | None] = None
    session_dirs: ClassVar[tuple[str, ...]] = ()
    cleared_home_files: ClassVar[tuple[str, ...]] = ()
    instructions_file: ClassVar[str] = ""
    default_model: ClassVar[str | None] = None
    max_model_failures: ClassVar[int | None] = None
    base_url_suffix: ClassVar[str] = ""
    """Appended to the in-sandbox model endpoint (``/v1`` for opencode's providers)."""
    command_in_title: ClassVar[bool] = False
    """The agent reports an ``execute`` call's command only as its title (gemini): the
    bridge asks the policy about the title, the translator shows it as the command."""
    finished_on: ClassVar[frozenset[str]] = frozenset()
    """``session/prompt`` stop reasons besides ``end_turn`` by which this agent ends a turn
    of its own accord (the run finishes, with a ``CUSTOM acp.stopped`` event naming it)."""
    args_in_content: ClassVar[bool] = False
    """The agent reports a (non-``execute``) call's arguments only as the JSON text of its
    first content block before it runs (gemini): the translator reads them from there."""

    def session_params(self, opts: CliOptions, policy: AcpPolicy) -> dict[str, Any]:
        """More ``session/new`` / ``session/load`` parameters (e.g. the Claude adapter's
        ``_meta``). ``{corral.port.NAME}`` is filled in with the in-sandbox port and
        ``${CORRAL_TOOLS_TOKEN}`` on the wire only (the journal keeps the reference)."""
        return {}

    def argv(self, bin_path: str) -> list[str]:
        """The agent's argv, given its executable's path."""
        return [bin_path, *self.args]

    def session_problem(self, files: Mapping[str, bytes], session_id: str) -> str | None:
        """Why the agent certainly cannot even start with the saved session (see
        :meth:`corral.harness._cli_base.CliHarness.session_problem`); ``None`` by default:
        an agent that cannot load a session says so and the bridge goes on."""
        return None

    def check_model(self, model: str | None) -> None:
        """Raise :class:`ConfigError` for a model this agent cannot use."""

    def guarded_workspace_files(self, policy: AcpPolicy) -> tuple[str, ...]:
        """Workdir-relative files checked before the run (see
        :attr:`corral.harness._cli_base.CliHarness.guarded_workspace_files`)."""
        return ()

    def check_workspace_file(self, rel: str, data: bytes) -> None:
        """Raise :class:`ConfigError` if the workspace's ``rel`` would loosen the policy."""

    def bin_env(self, bin_path: str) -> dict[str, str]:
        """Environment that depends on where the executable is (default: none)."""
        return {}


    def upstream_api(self, model: str | None) -> ModelApi:
        raise NotImplementedError

    def map_policy(self, policy: PolicyLike | None, prompt: bool) -> AcpPolicy:
        """``prompt``: the run serves corral's permission prompt tool (its policy is set
        and the host tools are wired), which the bridge asks."""
        raise NotImplementedError

    def env(self, model: str | None, base_url: str, opts: CliOptions,
            policy: AcpPolicy) -> dict[str, str]:
        raise NotImplementedError

    def home_files(self, model: str | None, base_url: str, opts: CliOptions,
                   policy: AcpPolicy) -> dict[str, bytes]:
        return {}

    def seed_home_files(self, version: str) -> dict[str, bytes]:
        """Home files written only where none is yet (see
        :meth:`corral.harness._cli_base.CliHarness.seed_home_files`); ``version`` is the
        install's."""
        return {}


class OpencodeAcp(AcpAgent):
    """``opencode acp`` (opencode-ai). Configured as the opencode harness is
    (:mod:`corral.harness._opencode`: ``OPENCODE_CONFIG_CONTENT`` in its environment,
    project configuration and plugins off, ``~/.config/opencode`` cleared), with
    ``permission.bash = "ask"`` for *every* command under a policy, so each one reaches
    ``session/request_permission`` and corral's policy decides it live (allow, deny, or a
    corral approval for ask). File edits: ``allow``/``deny`` from ``file_write`` directly,
    ``ask`` through corral; web fetches: ``deny`` without network, else asked."""

    name = "opencode"
    package = "opencode"
    bin = "opencode"
    args = ("acp",)
    session_dirs = (".local/share/opencode",)
    cleared_home_files = (".config/opencode", ".opencode")
    instructions_file = ".config/opencode/AGENTS.md"
    default_model = OPENCODE_DEFAULT_MODEL
    max_model_failures = 3

    def session_problem(self, files: Mapping[str, bytes], session_id: str) -> str | None:
        """A database opencode cannot open stops it before it answers ACP at all."""
        return opencode_session_problem(files, session_id)
    base_url_suffix = "/v1"

    def check_model(self, model: str | None) -> None:
        split_model(model or OPENCODE_DEFAULT_MODEL)

    def upstream_api(self, model: str | None) -> ModelApi:
        provider = split_model(model or OPENCODE_DEFAULT_MODEL)[0]
        return "openai" if provider == "openai" else "anthropic"

    def map_policy(self, policy: PolicyLike | None, prompt: bool) -> AcpPolicy:
        allow_all = {"bash": "allow", "edit": "allow", "webfetch": "allow",
                     "external_directory": "allow"}
        if policy is None:
            return AcpPolicy(PolicyMapping("acp:opencode", enforced=(
                "default: allow -> permission bash/edit: allow (the sandbox is the "
                "boundary)",), bypass=True), settings={"permission": allow_all})
        if not prompt:
            raise ConfigError("acp --agent opencode enforces a policy through corral's "
                              "permission prompt, which this run does not serve (give the "
                              "run host tools, as the Runner does)")
        problems: list[str] = []
        if policy.file_write == "deny" and policy.default == "allow":
            problems.append("file_write: deny with default: allow: opencode cannot stop "
                            "allowed shell commands from writing files; use default: deny")
        if problems:
            raise ConfigError("policy rules opencode cannot enforce: " + "; ".join(problems))
        edit = {"allow": "allow", "deny": "deny"}.get(policy.file_write, "ask")
        webfetch = "deny" if policy.network != "allow" or allow_hosts(policy) else "ask"
        permission = {"bash": "ask", "edit": edit, "webfetch": webfetch,
                      "external_directory": "allow"}
        enforced = (
            "every command -> permission.bash = 'ask' -> corral's policy decides each "
            "(allow, deny, ask -> a corral approval)",
            f"file_write: {policy.file_write} -> permission.edit = {edit!r}",
            f"network -> permission.webfetch = {webfetch!r}",
        )
        return AcpPolicy(PolicyMapping("acp:opencode", enforced=enforced,
                                       permission_prompt=True),
                         ask_corral=True, settings={"permission": permission})

    def env(self, model: str | None, base_url: str, opts: CliOptions,
            policy: AcpPolicy) -> dict[str, str]:
        # Host tools come through ACP's session/new mcpServers, not opencode's config.
        config = opencode_config(model or OPENCODE_DEFAULT_MODEL, base_url, opts.api_key,
                                 policy.settings["permission"], {})
        # A refused permission otherwise ends opencode's turn: the model must be told and
        # go on, as with every other harness.
        config["experimental"] = {"continue_loop_on_deny": True}
        return {**OPENCODE_ENV,
                "OPENCODE_CONFIG_CONTENT": json.dumps(config, separators=(",", ":"))}


GEMINI_POLICY_FILE = ".gemini/policies/corral.toml"
"""Home-relative: corral's rules in gemini's policy engine (user tier) under command rules."""
GEMINI_ASK_POLICY = "".join(
    f'[[rule]]\ntoolName = "{tool}"\n{pattern}decision = "ask_user"\npriority = {prio}\n\n'
    for tool in ("run_shell_command", "write_file", "replace")
    for pattern, prio in (('argsPattern = "."\n', 999), ("", 998)))
"""Every shell command and file edit asks (``session/request_permission``): corral's policy
answers. Priority 999 in the user tier outranks the default and workspace tiers and the
settings' allowed tools and trusted MCP servers. The ``argsPattern`` matters: gemini 0.61
turns a matched rule's ``ask_user`` into ``allow`` for "known safe" shell commands (``echo``,
``ls``: ``applyShellHeuristics``) unless the rule has an ``argsPattern`` or a
``commandPrefix``; the rule without one (priority 998) covers a call with no arguments."""

GEMINI_RENAME_SESSIONS = (
    'for f in "$HOME"/.gemini/tmp/*/chats/session-[0-9]*.json*; do '
    '[ -f "$f" ] || continue; t="${f%/session-*}/session-r${f##*/session-}"; '
    'while [ -e "$t" ]; do t="${t%/session-*}/session-r${t##*/session-}"; done; '
    'mv "$f" "$t"; done; '
    'exec "$@"')
"""``sh -c`` before ``gemini --acp``: ``session-<date>-<id8>.jsonl`` → ``session-r<date>-<id8>
.jsonl`` (see :meth:`GeminiAcp.argv`), never over an existing file: another ``r`` until the
name is free (a load within the minute of an earlier one leaves a second file of the same
name and id beside the restored one: gemini 0.61's ``initializeSessionConfig`` starts one
for the loaded session, holding only the session context)."""


class GeminiAcp(AcpAgent):
    """``gemini --acp`` (@google/gemini-cli, the ``gemini-cli`` install), configured as the
    gemini-cli harness is (:func:`corral.harness._gemini_cli.gemini_settings` in
    ``~/.gemini/settings.json``: API-key auth against the model proxy, nothing phoned home,
    bounded retries; the model as ``model.name``; host tools come as ``session/new``
    ``mcpServers``, not from the file).

    Policy: with no command rules, "allow everything" (every permission request allowed; the
    sandbox is the boundary); network ``deny`` or an egress allowlist also drops the web
    tools (``tools.exclude``). Under command rules (a run serving corral's permission
    prompt) every shell command and file edit is put to corral's policy, through gemini's
    own policy engine: ``~/.gemini/policies/corral.toml`` (user tier, priority 999, above
    anything a workspace's ``.gemini/policies`` or the default rules can say) makes
    ``run_shell_command``, ``write_file`` and ``replace`` ``ask_user``, so each one reaches
    ``session/request_permission`` (its "known safe" shell commands too), and the bridge
    answers from corral's policy (ask → a corral approval). The command is the call's
    ``title``: gemini 0.61's shell invocation gives its full ``command`` as the display
    title (``getDisplayTitle``). Its ``BeforeTool`` hooks would not help: in ACP mode
    gemini runs a tool's ``execute`` directly, without the scheduler that fires hooks.

    What the workspace cannot do: its ``.gemini/settings.json`` is refused unless it holds
    display, context and model settings only (as for ``--harness gemini-cli``:
    :func:`corral.harness._gemini_cli.check_workspace_settings`); ``advanced.ignoreLocalEnv``
    keeps a repository's ``.env`` out of gemini's process (``GEMINI_CLI_HOME`` there would
    move the user policies into the repository); ``~/.gemini/{extensions,policies,
    trustedFolders.json,trusted_hooks.json,system-defaults.json}`` are removed first.
    ``file_write: deny`` needs ``default: deny`` (allowed commands could write files).
    """

    name = "gemini"
    package = "gemini-cli"
    bin = "gemini"
    args = ("--acp",)
    session_dirs = (".gemini/tmp", ".gemini/history")
    # read at start-up and writable by the agent: policies (rules above corral's),
    # extensions (MCP servers, hooks), the trusted-folders list
    cleared_home_files = (".gemini/policies", ".gemini/extensions",
                          ".gemini/trustedFolders.json", ".gemini/trusted_hooks.json",
                          ".gemini/system-defaults.json")
    instructions_file = ".gemini/GEMINI.md"
    # gemini 0.61's shell invocation reports its full command as the title (getDisplayTitle;
    # its description, getDescription, is the model's text for long commands)
    command_in_title = True
    # ...and an MCP tool's arguments only as the JSON text of the call's content before it
    # runs (its invocation's getExplanation; no rawInput)
    args_in_content = True
    # gemini 0.61 answers max_turn_requests when its loop detection stops the turn
    # (LoopDetected, or MaxSessionTurns when recovering from a loop runs out of turns;
    # corral sets no maxSessionTurns): its own headless mode (--harness gemini-cli) ends
    # such a run successfully with a warning, and so does corral
    finished_on = frozenset({"max_turn_requests"})

    def argv(self, bin_path: str) -> list[str]:
        # gemini 0.61 records a session in chats/session-<start minute>-<id8>.jsonl, and a
        # process loading it opens session-<current minute>-<id8>.jsonl afresh: within the
        # session's first minute that is the same file, wiped before it is read ("No
        # previous sessions found"). Restored files get a name no new one can have first
        # (gemini finds sessions by the id inside any session-*.json[l]).
        return ["/bin/sh", "-c", GEMINI_RENAME_SESSIONS, "gemini-acp", bin_path, *self.args]

    def upstream_api(self, model: str | None) -> ModelApi:
        return "gemini"

    def map_policy(self, policy: PolicyLike | None, prompt: bool) -> AcpPolicy:
        enforced = ["default: allow -> every permission request allowed (the sandbox is the "
                    "boundary)"]
        if policy is None:
            return AcpPolicy(PolicyMapping("acp:gemini", enforced=tuple(enforced),
                                           bypass=True), settings={"exclude": ()})
        exclude: tuple[str, ...] = ()
        network: list[str] = []
        if policy.network != "allow" or allow_hosts(policy):
            exclude = GEMINI_WEB_TOOLS
            network.append(f"network: {policy.network} -> tools.exclude {list(exclude)}, "
                           "and the sandbox has no network of its own")
        if not beyond_allow_all(policy):
            return AcpPolicy(PolicyMapping("acp:gemini", enforced=(*enforced, *network),
                                           bypass=True), settings={"exclude": exclude})
        if not prompt:
            raise ConfigError("acp --agent gemini enforces command rules through corral's "
                              "permission prompt, which this run does not serve (give the "
                              "run host tools, as the Runner does)")
        if policy.file_write == "deny" and policy.default == "allow":
            raise ConfigError("policy rules acp --agent gemini cannot enforce: file_write: "
                              "deny with default: allow: allowed shell commands can still "
                              "write files; use default: deny")
        gated = (
            "every run_shell_command -> ask_user in gemini's policy engine "
            f"(~/{GEMINI_POLICY_FILE}, user tier, priority 999) -> session/request_permission "
            "with the full command as its title -> corral's policy decides each (allow, deny, "
            "ask -> a corral approval)",
            f"file_write: {policy.file_write} -> write_file/replace ask_user, corral's policy "
            "answers",
            f"the workspace's {GEMINI_WORKSPACE_SETTINGS} may hold display, context and model "
            "settings only; advanced.ignoreLocalEnv (no repository .env)",
        )
        return AcpPolicy(PolicyMapping("acp:gemini", enforced=(*gated, *network),
                                       permission_prompt=True),
                         ask_corral=True, settings={"exclude": exclude, "gated": True})

    def gated(self, policy: AcpPolicy) -> bool:
        """Whether command rules are put to corral (the policy file, the workspace check)."""
        return bool(policy.settings.get("gated"))

    def guarded_workspace_files(self, policy: AcpPolicy) -> tuple[str, ...]:
        return (GEMINI_WORKSPACE_SETTINGS,) if self.gated(policy) else ()

    def check_workspace_file(self, rel: str, data: bytes) -> None:
        if rel == GEMINI_WORKSPACE_SETTINGS:
            check_workspace_settings(data)

    def env(self, model: str | None, base_url: str, opts: CliOptions,
            policy: AcpPolicy) -> dict[str, str]:
        return {"GOOGLE_GEMINI_BASE_URL": base_url, "GEMINI_API_KEY": opts.api_key,
                "GEMINI_TELEMETRY_ENABLED": "false"}

    def home_files(self, model: str | None, base_url: str, opts: CliOptions,
                   policy: AcpPolicy) -> dict[str, bytes]:
        settings = gemini_settings(dataclasses.replace(opts, mcp_servers={}),
                                   exclude=tuple(policy.settings.get("exclude") or ()))
        if model:
            settings["model"] = {"name": model}
        files: dict[str, bytes] = {}
        if self.gated(policy):
            # a repository's .env would be loaded into gemini's process (GEMINI_CLI_HOME
            # there moves the user settings and policies into the repository)
            settings["advanced"] = {"ignoreLocalEnv": True}
            files[GEMINI_POLICY_FILE] = GEMINI_ASK_POLICY.encode()
        # node-pty's output reaches ACP as a terminal snapshot, which gemini's ACP mode
        # drops (tool results ""); its child_process shell reports the output as text
        settings.setdefault("tools", {})["shell"] = {"enableInteractiveShell": False}
        files[GEMINI_SETTINGS_FILE] = json.dumps(settings, sort_keys=True, indent=1).encode()
        return files


CLAUDE_ADAPTER_DIR = "acp/node_modules/.bin"
"""The Claude ACP adapter's executable directory in a ``claude-code`` install (its
companion prefix, :data:`corral.harness._packages.CLAUDE_ACP`)."""


class ClaudeAcp(AcpAgent):
    """The Claude Code ACP adapter (npm ``@agentclientprotocol/claude-agent-acp``, installed
    beside Claude Code by ``corral agents install claude-code``), running the install's
    Claude Code CLI (``CLAUDE_CODE_EXECUTABLE``) against the model proxy like the
    claude-code harness (``ANTHROPIC_BASE_URL``, a placeholder key, ``ENABLE_TOOL_SEARCH=
    false`` so host tools are offered directly).

    Mode ``default`` (the adapter starts in ``auto``, where a classifier decides and nothing
    is asked). Under a policy, every Bash command goes through corral's command gate
    (:mod:`corral._insandbox.command_gate`, a ``PreToolUse`` hook, as for the claude-code
    harness), given in ``session/new``'s ``_meta.claudeCode.options.settings`` together
    with ``settingSources: []`` (no user, project or local settings file is read: a
    repository's ``.claude/settings.json`` could otherwise turn hooks off with
    ``disableAllHooks``) and ``strictMcpConfig`` (no ``.mcp.json`` servers). The gate asks
    corral's policy with the exact command, read-only ones included (Claude Code would run
    ``echo`` or ``ls`` unasked); file edits and other tools reach corral as
    ``session/request_permission``.

    An empty sandbox home gets a ``~/.claude.json`` holding what the CLI's first start
    would write (:func:`corral.harness._claude_code.first_start_config`), which otherwise
    cost the session's start a lock retry of ~300 ms in about half of the runs."""

    name = "claude"
    package = "claude-code"
    bin = "claude-agent-acp"
    bin_dir = CLAUDE_ADAPTER_DIR
    mode = "default"
    session_dirs = (".claude/projects",)
    cleared_home_files = (".claude/settings.json", ".claude/settings.local.json")
    instructions_file = ".claude/CLAUDE.md"

    def upstream_api(self, model: str | None) -> ModelApi:
        return "anthropic"

    def bin_env(self, bin_path: str) -> dict[str, str]:
        suffix = f"/{CLAUDE_ADAPTER_DIR}/{self.bin}"
        if not bin_path.endswith(suffix):
            return {}  # an adapter from elsewhere: it finds its own CLI
        return {"CLAUDE_CODE_EXECUTABLE":
                bin_path[: -len(suffix)] + "/node_modules/.bin/claude"}

    def map_policy(self, policy: PolicyLike | None, prompt: bool) -> AcpPolicy:
        if policy is None:
            return AcpPolicy(PolicyMapping("acp:claude", enforced=(
                "default: allow -> every permission request allowed (the sandbox is the "
                "boundary)",), bypass=True))
        if not prompt:
            raise ConfigError("acp --agent claude enforces a policy through corral's "
                              "permission prompt, which this run does not serve (give the "
                              "run host tools, as the Runner does)")
        if policy.file_write == "deny" and policy.default == "allow":
            raise ConfigError("policy rules acp --agent claude cannot enforce: file_write: "
                              "deny with default: allow: allowed shell commands can still "
                              "write files; use default: deny")
        enforced = (
            "every Bash command -> corral's command gate (PreToolUse hook in session/new "
            "_meta, settingSources: []) -> corral's policy decides each (allow, deny, ask "
            "-> a corral approval)",
            f"file_write: {policy.file_write} -> mode 'default': edits are asked, corral's "
            "policy answers",
            f"network: {policy.network} -> web tools are asked, corral's policy answers",
        )
        return AcpPolicy(PolicyMapping("acp:claude", enforced=enforced,
                                       permission_prompt=True), ask_corral=True)

    def session_params(self, opts: CliOptions, policy: AcpPolicy) -> dict[str, Any]:
        if not policy.ask_corral:
            return {}
        if "corral" not in opts.mcp_servers:
            raise ConfigError("acp --agent claude under a policy needs the run's corral MCP "
                              "server (its command gate asks it)")
        return {"_meta": {"claudeCode": {"options": {
            "settingSources": [], "strictMcpConfig": True,
            "settings": bash_gate_settings(opts)}}}}

    def seed_home_files(self, version: str) -> dict[str, bytes]:
        # Claude Code's first start in an empty home rewrites ~/.claude.json from
        # concurrent tasks (and the adapter's `claude auth status`): lock retries of ~300 ms
        # on the session's start-up path (see first_start_config)
        return {".claude.json": first_start_config(version)}

    def env(self, model: str | None, base_url: str, opts: CliOptions,
            policy: AcpPolicy) -> dict[str, str]:
        env = {
            **claude_env(opts, base_url),
            "ENABLE_TOOL_SEARCH": "false",
            # the adapter's follow-up suggestion is one more model call after every turn
            "CLAUDE_CODE_ENABLE_PROMPT_SUGGESTION": "false",
        }
        if model:
            env["ANTHROPIC_MODEL"] = model
        return env


class CommandAgent(AcpAgent):
    """Any ACP agent, from ``--agent-command 'CMD …'`` (see the module docstring). Its
    model endpoint: ``ANTHROPIC_BASE_URL`` / ``OPENAI_BASE_URL`` (from ``--model
    anthropic/…`` or ``openai/…``, default anthropic) with a placeholder key."""

    name = "command"

    def __init__(self, command: str) -> None:
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise ConfigError(f"--agent-command {command!r}: {exc}") from None
        if not argv or "\0" in command:
            raise ConfigError("--agent-command needs a command, e.g. --agent-command "
                              "'my-agent --acp'")
        self.command = command
        self.command_argv = argv

    def argv(self, bin_path: str) -> list[str]:
        return list(self.command_argv)

    def upstream_api(self, model: str | None) -> ModelApi:
        return "openai" if (model or "").startswith("openai/") else "anthropic"

    def map_policy(self, policy: PolicyLike | None, prompt: bool) -> AcpPolicy:
        if policy is not None:
            raise ConfigError(
                "--agent-command: corral cannot know whether this agent asks before every "
                "command, so it cannot enforce a sandbox policy for it; remove the [policy] "
                "(the sandbox is the boundary) or use --agent opencode")
        return AcpPolicy(PolicyMapping("acp:command", enforced=(
            "no policy: every permission request is allowed (the sandbox is the "
            "boundary)",), bypass=True))

    def env(self, model: str | None, base_url: str, opts: CliOptions,
            policy: AcpPolicy) -> dict[str, str]:
        if self.upstream_api(model) == "openai":
            return {"OPENAI_BASE_URL": base_url + "/v1", "OPENAI_API_KEY": opts.api_key}
        return {"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": opts.api_key}


ACP_AGENTS: dict[str, AcpAgent] = {a.name: a for a in (OpencodeAcp(), GeminiAcp(),
                                                      ClaudeAcp())}
"""Known ACP agents by ``--agent`` name."""


def agent_profile(agent: str | None, command: str | None) -> AcpAgent:
    """The profile for ``--agent NAME`` or ``--agent-command CMD`` (exactly one)."""
    if (agent is None) == (command is None):
        raise ConfigError("the acp harness needs --agent NAME (one of "
                          f"{', '.join(sorted(ACP_AGENTS))}) or --agent-command 'CMD ...'")
    if command is not None:
        return CommandAgent(command)
    assert agent is not None
    profile = ACP_AGENTS.get(agent)
    if profile is None:
        raise ConfigError(f"unknown ACP agent {agent!r}: choose one of "
                          f"{', '.join(sorted(ACP_AGENTS))}, or give --agent-command 'CMD ...'")
    return profile
