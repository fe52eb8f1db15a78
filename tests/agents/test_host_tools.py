"""Host tools for the agent, end to end: the real Claude Code CLI in bubblewrap (no network)
calls Python functions of the driving process through the run's MCP server ``corral``.

The Runner is used as a library (``Runner(store).start(RunRequest(..., tools=ts))`` then
``drive``); the scripted model server stands in for the model and records what the CLI
sends back, so a tool's result is seen arriving at the model.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.runs._runner import Runner, RunRequest
from corral.stores._protocols import Store
from corral.stores import open_store
from corral.testing._model_server import ModelServer
from corral.tools import Toolset, tool
from corral.tools._projection import TOKEN_ENV

from corral.testing._harness_events import call_then_answer, logged_events
from corral.testing._harness_world import host_tool_by_suffix

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("bwrap")]


async def _store(home: Path) -> Store:
    return await open_store(f"sqlite://{home / 'corral.db'}")


def test_prepare_agent_merges_the_host_tools_projection(
        sandbox_factory: Any, model_server: ModelServer) -> None:
    from corral.agents._prepare import prepare_agent
    from corral.harness._base import AgentRequest

    from .conftest import files_containing, make_harness, upstream_for

    other = {"url": "http://127.0.0.1:9/mcp", "type": "http"}
    mine = {"name": "mine", "port": 0, "unix": "/run/corral/mine.sock"}

    token = secrets.token_urlsafe(32)  # the Runner passes run_tools_token(store, run_id)

    async def main() -> None:
        handle = await sandbox_factory()
        harness = make_harness("claude-code")
        prepared = await prepare_agent(
            harness, handle, AgentRequest(prompt="hi", options={
                "mcp_servers": {"other": other}, "forward": [mine]}),
            thread_id="t-1", run_id="run-merge", upstream=upstream_for(harness, model_server),
            host_tools=True, tools_token=token)
        proj = prepared.host_tools
        assert proj is not None and proj.token == token
        cmd = prepared.command
        assert not any(proj.token in a for a in cmd.argv)  # never in argv
        assert cmd.env[TOKEN_ENV] == proj.token  # only in the CLI's environment
        config = json.loads(cmd.argv[cmd.argv.index("--mcp-config") + 1])["mcpServers"]
        assert set(config) == {"other", "corral"}  # merged, not replaced
        entry = json.loads(cmd.argv[[i for i, a in enumerate(cmd.argv)
                                     if a.startswith('{"forward"')][0]])
        assert [f["name"] for f in entry["forward"]] == ["mine", "model", "tools"]
        assert proj.socket.parent == next(Path(h) for h, i in handle.state.binds
                                          if i == "/run/corral")
        assert cmd.env["ENABLE_TOOL_SEARCH"] == "false"
        # nothing in the sandbox's files (workspace, home) or its socket dir has the token
        assert files_containing(Path(handle.host_root), proj.token.encode()) == []
        assert files_containing(proj.socket.parent, proj.token.encode()) == []

    anyio.run(main)


def test_another_driver_serves_the_tools(host_env: ModelServer, corral_home: Path) -> None:
    """The starter never serves; a second Runner (a successor: its own owner id, no state
    shared with the starter) drives with the same toolset on the recorded socket, with
    the token derived again, and the call goes through."""
    calls: list[str] = []

    @tool
    def read_host_state(key: str) -> str:
        """Read a value that only the host has."""
        calls.append(key)
        return f"{key}=from-the-successor"

    ts = Toolset([read_host_state])
    host_env.script = call_then_answer(host_tool_by_suffix, "read_host_state", {"key": "k"})

    async def main() -> tuple[str, list[dict[str, Any]]]:
        store = await _store(corral_home)
        try:
            rec = await Runner(store).start(RunRequest(
                prompt="Ask the host.", harness="claude-code", options={"max_retries": 0},
                tools=ts))
            successor = Runner(store)
            with anyio.fail_after(150):
                result = await successor.drive(rec.run_id, tools=ts)
            return result.record.status.value, await logged_events(store, rec.run_id)
        finally:
            await store.aclose()

    status, events = anyio.run(main)
    assert status == "completed", events[-3:]
    assert calls == ["k"]
    assert any("k=from-the-successor" in r for req in host_env.model_requests
               for r in req.tool_results)
