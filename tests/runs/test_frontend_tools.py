"""A run's frontend tools live in its spec: a driver with no toolset of its own (one that took
the run over, on any host) offers them on the run's tool socket, beside corral's own tools,
and a call waits for the client's result in the store, under the agent's own call id."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import anyio

from corral.runs import RunRequest, RunSpec
from corral.runs._host_tools import serve_tools
from corral.sandbox._definition import Sandbox
from corral.stores._memory import MemoryStore
from corral.stores._protocols import NewRun
from corral.testing import wait_until_async
from corral.tools._frontend import answer_frontend_call
from corral.tools._projection import run_tools_token
from tests.tools.mcp_client import mcp_client

PICK = {"name": "pick", "description": "Pick a color.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}


def test_the_spec_keeps_an_agent_runs_frontend_tools_only() -> None:
    sandbox = Sandbox(provider="bubblewrap")
    agent = RunRequest(prompt="x", harness="claude-code", frontend_tools=[PICK])
    spec = RunSpec.of_request(agent, sandbox, agent.harness_choice(sandbox))
    assert spec.frontend_tools == [PICK]
    command = RunRequest(command=["true"], frontend_tools=[PICK])
    spec = RunSpec.of_request(command, sandbox, command.harness_choice(sandbox))
    assert spec.frontend_tools is None  # a command calls no tools


def test_a_driver_without_a_toolset_serves_the_runs_frontend_tools() -> None:
    async def main() -> tuple[list[str], Any]:
        store = MemoryStore()
        with tempfile.TemporaryDirectory() as tmp:
            sock = str(Path(tmp) / "tools.sock")
            spec = RunSpec(frontend_tools=[PICK], agent={"tools_socket": sock})
            record = await store.create(NewRun("run-ft", "th", harness="claude-code",
                                               spec=spec.to_json()))
            claim = await store.acquire_claim("run-ft", "me", 60)
            async with anyio.create_task_group() as tg:
                await serve_tools(tg, store, record, None, claim.epoch, approval_timeout=30)
                async with mcp_client(sock, await run_tools_token(store, "run-ft")) as c:
                    names = sorted(t.name for t in (await c.list_tools()).tools)
                    out: list[Any] = []

                    async def call() -> None:
                        out.append(await c.call_tool(
                            "pick", {"q": "which?"},
                            meta={"claudecode/toolUseId": "toolu_01"}))

                    tg.start_soon(call)
                    await wait_until_async(lambda: store.list_pending_approvals("run-ft"),
                                           "the frontend call", interval=0.02)
                    (pending,) = await store.list_pending_approvals("run-ft")
                    assert pending.call_id == "toolu_01"  # the agent's own id
                    log = await store.snapshot("run-ft")
                    (announced,) = [e.event["value"] for e in log
                                    if e.event.get("name") == "corral.frontend_call"]
                    assert announced["toolCallId"] == "toolu_01"
                    assert announced["args"] == {"q": "which?"}
                    await answer_frontend_call(store, "run-ft", pending.approval_id, "teal")
                    await wait_until_async(lambda: out, "the call's result", interval=0.02)
                tg.cancel_scope.cancel()
            return names, out[0]

    names, result = anyio.run(main)
    assert names == ["pick"]
    assert not result.is_error and result.content[0].text == "teal"
