"""Claude Code's permission prompt tool, served by the run's MCP server ``corral``.

Claude Code is started with ``--permission-prompt-tool mcp__corral__permission_prompt``
when a run has a sandbox policy and the host tools are wired: every tool use its own
rules do not settle (Bash always; write tools when ``file_write`` is ``ask``) is sent
here as ``{"tool_name", "input", "tool_use_id"}`` and decided live by the policy:

* ``Bash``: :meth:`corral.policy._policy.Policy.evaluate` on ``input.command``;
* ``Edit``/``Write``/``MultiEdit``/``NotebookEdit``: the policy's ``file_write``;
* ``WebFetch``/``WebSearch``: the policy's ``network``; read-only tools: allowed;
  anything else: the policy's ``default``.

``allow`` answers ``{"behavior": "allow", "updatedInput": <input>}``; ``deny`` answers
``{"behavior": "deny", "message": ...}`` naming the rule and logs ``CUSTOM
corral.policy_denied`` ``{tool, toolCallId, rule, reason}`` (so a refusal is in the run's
events even from a CLI that logs nothing for a call its hook refused: codex); ``ask``
raises a corral approval (``CUSTOM corral.approval_request``, answered with ``corral
approve``) and allows or denies on the answer (no answer in time denies).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from corral._log import library_logger
from corral.policy._policy import Decision, Policy
from corral.tools._core import ToolContext
from corral.tools._remote import ApprovalGate

__all__ = ["PERMISSION_TOOL", "POLICY_DENIED_EVENT", "PermissionPromptTool"]

log = library_logger(__name__)

PERMISSION_TOOL = "permission_prompt"
"""The tool's name on the ``corral`` server (Claude Code: ``mcp__corral__permission_prompt``)."""

POLICY_DENIED_EVENT = "corral.policy_denied"
"""The CUSTOM event logged for each tool use the policy refused."""

WRITE_TOOLS = frozenset({"Edit", "Write", "MultiEdit", "NotebookEdit"})
NET_TOOLS = frozenset({"WebFetch", "WebSearch"})
READ_TOOLS = frozenset({"Read", "Glob", "Grep", "LS", "TodoWrite", "Task", "Agent",
                        "ToolSearch", "Skill", "BashOutput", "KillShell"})


class PermissionPromptTool:
    """A :class:`corral.tools._core.ToolLike` deciding Claude Code's permission prompts with
    ``policy``; ``approvals`` holds ``ask`` decisions for a human (``None``: denied);
    ``on_denied`` receives the :data:`POLICY_DENIED_EVENT` value of each refusal."""

    name = PERMISSION_TOOL
    description = ("Internal to corral: Claude Code's permission check against the sandbox "
                   "policy. Not for direct use; it runs nothing.")
    approval = False  # it raises its own approvals, for "ask" verdicts only
    waits_for_approvals = True  # so the server's call timeout does not cut a human short

    def __init__(self, policy: Policy, approvals: ApprovalGate | None,
                 on_denied: Callable[[dict[str, Any]], Awaitable[None]] | None = None
                 ) -> None:
        self.policy = policy
        self.approvals = approvals
        self.on_denied = on_denied

    @property
    def input_schema(self) -> dict[str, Any]:
        return {"type": "object", "properties": {
            "tool_name": {"type": "string"}, "input": {"type": "object"},
            "tool_use_id": {"type": "string"}}, "required": ["tool_name", "input"]}

    def decide(self, tool_name: str, args: Mapping[str, Any]) -> Decision:
        """The policy's decision for one tool use (see the module docstring)."""
        if tool_name == "Bash":
            command = args.get("command")
            if not isinstance(command, str):
                return Decision("deny", "bad input", "", "Bash input has no command string")
            return self.policy.evaluate(command)
        if tool_name in WRITE_TOOLS:
            return self.policy.evaluate_capability("file_write")
        if tool_name in NET_TOOLS:
            return self.policy.evaluate_capability("network")
        if tool_name in READ_TOOLS:
            return Decision("allow", "read-only", tool_name, f"{tool_name} only reads")
        verdict = self.policy.default
        return Decision(verdict, "default", tool_name, f"policy.default is {verdict}")

    async def run(self, args: Any, context: ToolContext | None = None) -> Any:
        """Answer one permission request (JSON object, as Claude Code reads it)."""
        if not isinstance(args, Mapping):
            return _deny("corral: malformed permission request")
        tool_name = args.get("tool_name")
        tool_input = args.get("input")
        if not isinstance(tool_name, str) or not isinstance(tool_input, Mapping):
            return _deny("corral: malformed permission request")
        decision = self.decide(tool_name, tool_input)
        # Keys and tool only: the input is the agent's (hostile, maybe secret-bearing).
        log.debug("permission request keys=%s tool=%s: %s (%s)", sorted(args), tool_name,
                  decision.verdict, decision.rule)
        if decision.verdict == "allow":
            return {"behavior": "allow", "updatedInput": dict(tool_input)}
        call_id = args.get("tool_use_id")
        if decision.verdict == "deny" or self.approvals is None:
            if self.on_denied is not None:
                await self.on_denied({
                    "tool": tool_name, "toolCallId": call_id if isinstance(call_id, str)
                    else None, "rule": decision.rule, "reason": decision.reason})
            if decision.verdict == "deny":
                return _deny(f"denied by corral policy ({decision.rule}): {decision.reason}")
            return _deny(f"corral policy says ask ({decision.rule}) and this run has no "
                         "approval channel")
        refused = await self.approvals.request(
            tool_name, dict(tool_input),
            call_id=call_id if isinstance(call_id, str) else None)
        if refused is None:
            return {"behavior": "allow", "updatedInput": dict(tool_input)}
        return _deny(f"corral approval ({decision.rule}): {refused}")


def _deny(message: str) -> dict[str, Any]:
    return {"behavior": "deny", "message": message}
