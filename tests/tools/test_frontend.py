"""Frontend tools (an AG-UI client runs them): held like approvals in the store, answered
with the client's result, bounded by the gate's timeout, never listed or answered as
approvals."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from corral.stores import MemoryStore
from corral.tools._approvals import ApprovalError, Approvals, answer_approval, list_pending
from corral.tools._core import ToolContext, ToolError, Toolset
from corral.tools._frontend import (
    FrontendCallError,
    answer_frontend_call,
    check_frontend_tools,
    frontend_tools,
)
from corral.tools._remote import ToolTimeoutError, execute_host_tool
from corral.testing import wait_until_async

SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}}
HOSTILE = "sure?$(touch /tmp/pwned)`id`\n<script>alert(1)</script>"


def _tool(store: MemoryStore, events: list[Any], timeout: float = 30) -> Toolset:
    gate = Approvals(store, "run-f", emit=events.append, timeout=timeout)
    return Toolset(frontend_tools([{"name": "confirm", "description": "ask the user",
                                    "parameters": SCHEMA}], gate))


def _call_and_answer(error: str | None) -> tuple[Any, list[Any], MemoryStore]:
    store = MemoryStore()
    events: list[Any] = []
    tools = _tool(store, events)

    async def main() -> Any:
        out: list[Any] = []

        async def call() -> None:
            try:
                # beyond the server's per-call timeout: the client's user may take longer
                out.append(await execute_host_tool(
                    tools, {"name": "confirm", "args": {"q": HOSTILE}}, timeout=0.05,
                    context=ToolContext("confirm", "run-f", "7", tool_use_id="toolu_9")))
            except ToolError as exc:
                out.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await wait_until_async(lambda: store.list_pending_approvals("run-f"),
                                   "the frontend call", interval=0.02)
            await anyio.sleep(0.1)  # past the call timeout: still held
            assert out == []
            # not an approval: not listed, not answerable as one
            assert await list_pending(store, "run-f") == []
            (request,) = await store.list_pending_approvals("run-f")
            assert request.call_id == "toolu_9"
            with pytest.raises(ApprovalError, match="frontend tool call, not an approval"):
                await answer_approval(store, "run-f", request.approval_id, True)
            assert await answer_frontend_call(store, "run-f", request.approval_id,
                                              "yes, <b>sure</b>", error=error)
            # a repeated answer (a retried input) changes nothing
            assert not await answer_frontend_call(store, "run-f", request.approval_id, "no")
        return out[0]

    return anyio.run(main), events, store


def test_the_clients_result_is_the_tools_result() -> None:
    value, events, _ = _call_and_answer(None)
    assert value == "yes, <b>sure</b>"
    assert [e.name for e in events] == ["corral.frontend_call", "corral.frontend_call_resolved"]
    announced = events[0].value
    # the agent's arguments are data: carried verbatim, never interpreted
    assert announced["tool"] == "confirm" and announced["args"] == {"q": HOSTILE}
    assert announced["toolCallId"] == "toolu_9"


def test_the_clients_error_is_a_tool_error() -> None:
    value, events, _ = _call_and_answer("the user closed the dialog")
    assert isinstance(value, ToolError)
    assert "failed in the client: the user closed the dialog" in str(value)
    assert events[-1].value["decision"] == "deny"


def test_an_unanswered_call_ends_at_the_gates_timeout() -> None:
    store = MemoryStore()
    events: list[Any] = []
    tools = _tool(store, events, timeout=0.2)

    async def main() -> None:
        with pytest.raises(ToolTimeoutError, match="sent no result .*goes on without it"):
            await tools.call("confirm", {"q": "?"})

    anyio.run(main)
    assert events[-1].value["decision"] == "timeout"

    async def late() -> None:
        request_id = events[0].value["approvalId"]
        assert not await answer_frontend_call(store, "run-f", request_id, "too late")
        with pytest.raises(FrontendCallError):
            await answer_frontend_call(store, "run-f", "forged.id", "x")

    anyio.run(late)


@pytest.mark.parametrize(("tools", "says"), [
    ([{"name": "permission_prompt"}], "named like one of corral's own tools"),
    ([{"name": "x" * 49}], "cannot be offered"),
    ([{"name": "mcp__corral__x:y"}], "cannot be offered"),
    ([{"name": "a"}, {"name": "a"}], "named like"),
    ([{"name": "a", "parameters": {"type": "string"}}], "JSON object schema"),
    ([{"name": "a", "description": 7}], "description must be a string"),
    ([{"name": f"t{i}"} for i in range(65)], "at most 64"),
])
def test_tools_corral_cannot_offer_are_named(tools: list[dict[str, Any]], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        check_frontend_tools(tools, {"permission_prompt"})


def test_an_empty_schema_is_an_object_schema() -> None:
    (d,) = check_frontend_tools([{"name": "go", "parameters": {}}], ())
    assert d == {"name": "go", "description": "", "parameters": {"type": "object",
                                                                  "properties": {}}}
