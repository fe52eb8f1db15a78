"""Harness kit, host tools: a Python function of the driving process the model calls over
MCP, and one held for a corral approval."""

from __future__ import annotations

import json
import secrets
from typing import Any

import anyio

from corral.runs._runner import Runner
from corral.runs._request import RunRequest
from corral.sandbox._definition import Sandbox
from corral.sandbox._lifecycle import Lifecycle
from corral.testing._harness_world import HarnessWorld, world
from corral.testing._kit import Kit
from corral.testing._model_script import ModelRequest, Reply, Text
from corral.tools import Toolset, tool
from corral.tools._approvals import APPROVAL_RESOLVED_EVENT, answer_approval
from corral.tools._projection import TOKEN_ENV, run_tools_token
from corral.testing._harness_events import (
    approval_request, call_then_answer, customs, logged_events, results, texts, tool_names,
)

__all__ = ["HOST_TOOL_CHECKS"]

HOST_TOOL_CHECKS: Kit[HarnessWorld] = Kit("harness", subject=world)
"""This part's checks, in the order written (:data:`~corral.testing.HARNESS_KIT` joins the
parts)."""


@HOST_TOOL_CHECKS.add
async def check_host_tool(w: HarnessWorld) -> None:
    """A host tool (a Python function of the driving process, served over MCP) called by
    the model runs on the host, also under a policy denying every command; its result
    reaches the model and the events under the tool's own name; its bearer token is in no
    record or event."""
    secret = "host-only-" + secrets.token_hex(8)
    seen: list[str] = []

    @tool
    def read_host_state(key: str) -> str:
        """Read a value that only the host has."""
        seen.append(key)
        return f"{key}={secret}"

    w.script(call_then_answer(w.case.host_tool_call, "read_host_state", {"key": "answer"}))
    # host tools are corral's own, not commands: a policy denying every command (where
    # the harness enforces one) still lets them run
    sandbox = Sandbox(provider=w.case.provider, lifecycle=Lifecycle(reuse="none"),
                      policy=w.policy("deny")) if "deny" in w.case.enforces else None
    async with w.store() as store:
        runner = Runner(store)
        rec = await runner.start(RunRequest(
            prompt="What does the host say?", harness=w.case.harness,
            options=dict(w.case.options), tools=Toolset([read_host_state]),
            provider=w.case.provider, sandbox=sandbox))
        with anyio.fail_after(w.case.deadline):
            result = await runner.drive(rec.run_id)
        events = await logged_events(store, rec.run_id)
        token = await run_tools_token(store, rec.run_id)
        spec = result.record.spec or {}
    offered = [r.tools for r in w.server.model_requests]
    assert result.record.status.value == "completed", (events[-3:], offered)
    assert seen == ["answer"], offered
    assert any(secret in r for req in w.server.model_requests for r in req.tool_results)
    assert tool_names(events) == ["read_host_state"]  # no server prefix leaks through
    start = next(e for e in events if e["type"] == "TOOL_CALL_START")
    args = "".join(e["delta"] for e in events if e["type"] == "TOOL_CALL_ARGS"
                   and e["toolCallId"] == start["toolCallId"])
    assert json.loads(args) == {"key": "answer"}
    assert any(secret in r for r in results(events))
    assert f"answer={secret}" in texts(events).split("Host said:", 1)[-1]
    assert token not in json.dumps(spec) + json.dumps(events)
    assert TOKEN_ENV not in json.dumps(spec)


@HOST_TOOL_CHECKS.add
async def check_host_tool_approval(w: HarnessWorld) -> None:
    """A host tool marked ``approval=True`` is held until a corral approval: allowed, it
    runs; denied, it does not and the model gets the reason."""
    flags: list[str] = []

    @tool(approval=True)
    def set_host_flag(value: str) -> str:
        """Set a flag on the host (needs a human's approval)."""
        flags.append(value)
        return f"flag set to {value}"

    call = w.case.host_tool_call

    def script(req: ModelRequest) -> Reply:
        # by what came back (a CLI may send more than one result part for one call)
        done = len([r for r in req.tool_results if "flag set to" in r or "denied" in r])
        if done >= 2:
            return Text("Host said: " + "\n".join(req.tool_results).strip())
        made = call(req, "set_host_flag", {"value": ("on", "off")[done]})
        return made if made is not None else Text(f"NO HOST TOOL offered: {req.tools}")

    w.script(script)
    async with w.store() as store:
        runner = Runner(store, tools=Toolset([set_host_flag]), approval_timeout=120)
        sandbox = Sandbox(provider=w.case.provider, lifecycle=Lifecycle(reuse="none"),
                          policy=w.policy()) if w.case.extra_ask else None
        run_id = (await runner.start(RunRequest(
            prompt="Set the flag on, then off.", harness=w.case.harness,
            options=dict(w.case.options), provider=w.case.provider,
            sandbox=sandbox))).run_id
        done: list[Any] = []

        async def drive() -> None:
            done.append(await runner.drive(run_id))

        with anyio.fail_after(w.case.deadline * 2):
            async with anyio.create_task_group() as tg:
                tg.start_soon(drive)
                first = await approval_request(store, run_id, 0, lambda: bool(done),
                                            w.case.deadline)
                assert flags == []  # held until answered
                assert first["tool"] == "set_host_flag" and first["args"] == {"value": "on"}
                await answer_approval(store, run_id, first["approvalId"], True)
                second = await approval_request(store, run_id, 1, lambda: bool(done),
                                             w.case.deadline)
                assert second["args"] == {"value": "off"}
                await answer_approval(store, run_id, second["approvalId"], False,
                                      reason="not today")
        events = await logged_events(store, run_id)
    assert done[0].record.status.value == "completed", events[-3:]
    assert flags == ["on"]
    assert [r["decision"] for r in customs(events, APPROVAL_RESOLVED_EVENT)] == \
        ["allow", "deny"]
    assert tool_names(events) == ["set_host_flag", "set_host_flag"]
    results = [r for req in w.server.model_requests for r in req.tool_results]
    assert any("flag set to on" in r for r in results), results
    assert any("denied by a human: not today" in r for r in results), results
