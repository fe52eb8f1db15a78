"""corral's permission prompt tool (no CLI): what it answers for each kind of tool use,
and how an ``ask`` verdict goes through a real :class:`Approvals` gate."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from corral._errors import ConfigError
from corral.harness._base import AgentRequest
from corral.harness._claude_code import PROMPT_TOOL, ClaudeCodeHarness
from corral.policy._policy import Policy
from corral.stores import MemoryStore
from corral.tools._approvals import Approvals, answer_approval, list_pending
from corral.tools._core import Toolset, result_text
from corral.tools._permission import PERMISSION_TOOL, PermissionPromptTool
from corral.tools._remote import execute_host_tool
from corral.testing import wait_until_async

POLICY = Policy(allow=("echo *",), deny=("rm *",), ask=("touch *",), default="deny",
                file_write="ask", network="deny")


def _call(tool: PermissionPromptTool, name: str, args: dict[str, Any]) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        out = await Toolset([tool]).call(PERMISSION_TOOL, {
            "tool_name": name, "input": args, "tool_use_id": "toolu_1"})
        return dict(json.loads(result_text(out)))

    return anyio.run(main)


@pytest.mark.parametrize("name, args, behavior, fragment", [
    ("Bash", {"command": "echo hi"}, "allow", None),
    ("Bash", {"command": "echo hi && rm -rf /"}, "deny", "deny: rm *"),
    ("Bash", {"command": "python x.py"}, "deny", "default"),
    ("Bash", {"cmd": "echo hi"}, "deny", "no command"),
    ("Read", {"file_path": "/etc/passwd"}, "allow", None),
    ("WebFetch", {"url": "http://x"}, "deny", "network"),
    ("mcp__other__thing", {}, "deny", "default"),
    ("Write", {"file_path": "a", "content": ""}, "deny", "no approval channel"),
    ("Bash", {"command": "touch y"}, "deny", "no approval channel"),
])
def test_decisions_without_approvals(name: str, args: dict[str, Any], behavior: str,
                                     fragment: str | None) -> None:
    answer = _call(PermissionPromptTool(POLICY, None), name, args)
    assert answer["behavior"] == behavior
    if behavior == "allow":
        assert answer["updatedInput"] == args
    else:
        assert fragment is not None and fragment in answer["message"]


@pytest.mark.parametrize("allow", [True, False])
def test_ask_waits_for_the_approval_gate(allow: bool) -> None:
    events: list[Any] = []
    store = MemoryStore()
    gate = Approvals(store, "run-p", emit=events.append, timeout=30)
    tool = PermissionPromptTool(POLICY, gate)

    async def main() -> dict[str, Any]:
        out: list[dict[str, Any]] = []

        async def ask() -> None:
            out.append(await tool.run({"tool_name": "Bash", "input": {"command": "touch y"},
                                       "tool_use_id": "toolu_2"}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            await wait_until_async(lambda: list_pending(store, "run-p"),
                                   "the approval request", interval=0.02)
            pending = await list_pending(store, "run-p")
            assert out == []  # held until answered
            assert pending[0].tool == "Bash" and pending[0].args == {"command": "touch y"}
            await answer_approval(store, "run-p", pending[0].approval_id, allow, reason="no")
        return out[0]

    answer = anyio.run(main)
    if allow:
        assert answer == {"behavior": "allow", "updatedInput": {"command": "touch y"}}
    else:
        assert answer["behavior"] == "deny" and "ask: touch *" in answer["message"]
    assert [e.name for e in events] == ["corral.approval_request", "corral.approval_resolved"]


def test_an_approval_outlasts_the_servers_call_timeout() -> None:
    """The run's MCP server cuts tool calls at its call timeout; the permission prompt's
    wait for a human is bounded by the approval timeout instead."""
    store = MemoryStore()
    gate = Approvals(store, "run-c", timeout=30)
    tools = Toolset([PermissionPromptTool(POLICY, gate)])

    async def main() -> Any:
        out: list[Any] = []

        async def call() -> None:
            out.append(await execute_host_tool(tools, {"name": PERMISSION_TOOL, "args": {
                "tool_name": "Bash", "input": {"command": "touch y"}}}, timeout=0.2))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await wait_until_async(lambda: list_pending(store, "run-c"),
                                   "the approval request", interval=0.02)
            pending = await list_pending(store, "run-c")
            await anyio.sleep(0.5)  # the scenario: the human answers after the call timeout
            await answer_approval(store, "run-c", pending[0].approval_id, True)
        return out[0]

    assert anyio.run(main)["behavior"] == "allow"


def test_ask_times_out_to_deny() -> None:
    gate = Approvals(MemoryStore(), "run-t", timeout=0.2)
    answer = anyio.run(PermissionPromptTool(POLICY, gate).run,
                       {"tool_name": "Write", "input": {"file_path": "a"}})
    assert answer["behavior"] == "deny" and "no answer within" in answer["message"]


def test_claude_mapping_with_the_prompt_tool() -> None:
    # Refused without the prompt tool (no approval channel) ...
    with pytest.raises(ConfigError, match="ask rules"):
        ClaudeCodeHarness(policy=POLICY)
    # ... accepted with it: Bash goes to the prompt tool, prefix deny rules to Claude too.
    h = ClaudeCodeHarness(policy=POLICY, permission_prompt=True)
    argv = list(h.policy_mapping.argv)
    assert h.policy_mapping.permission_prompt
    assert argv[:4] == ["--permission-mode", "default", "--permission-prompt-tool", PROMPT_TOOL]
    allowed = argv[argv.index("--allowedTools") + 1:argv.index("--disallowedTools")]
    assert "mcp__corral" in allowed and not any(a.startswith("Bash") for a in allowed)
    assert "Write" not in allowed  # file_write: ask goes to the prompt tool
    assert "Bash(rm:*)" in argv[argv.index("--disallowedTools"):]
    # The prompt tool lives on the corral server: without it the command is refused.
    with pytest.raises(ConfigError, match="host_tools=True"):
        h.build_command(AgentRequest(prompt="hi"))


def test_no_policy_keeps_bypass() -> None:
    h = ClaudeCodeHarness(policy=None, permission_prompt=True)
    assert h.policy_mapping.bypass and not h.policy_mapping.permission_prompt
    assert "--permission-prompt-tool" not in h.policy_mapping.argv
