"""Host tools for gemini-cli, end to end: the real gemini CLI in bubblewrap (no network)
calls a Python function of the driving process through the run's MCP server ``corral``,
projected into ``mcpServers`` of its settings with the bearer token expanded by the CLI from
its environment.

The scripted model server (Gemini ``streamGenerateContent``) stands in for the model: it
asks for the host tool under the name gemini-cli offers it, and records what comes back.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.runs._runner import Runner, RunRequest
from corral.stores import open_store
from corral.testing._model_server import ModelRequest, ModelServer, Reply, Text, ToolCall
from corral.tools import Toolset, tool
from corral.tools._projection import TOKEN_ENV, run_tools_token

from .conftest import REAL_KEY
from .host_tools_flow import DEADLINE, logged, tool_names

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("bwrap")]


def call_then_answer(tool_name: str, args: dict[str, Any]) -> Callable[[ModelRequest], Reply]:
    """Ask for host tool ``tool_name`` (under whatever prefix gemini-cli gives MCP tools),
    then answer with its result; without it on offer the answer says so."""

    def script(req: ModelRequest) -> Reply:
        results = req.tool_results
        if results:
            return Text("Host said: " + "\n".join(results).strip())
        offered = [t for t in req.tools if t.endswith(tool_name)]
        if not offered:
            return Text(f"NO HOST TOOL offered; tools: {req.tools}")
        return ToolCall("", tool=offered[0], args=args)

    return script


@pytest.fixture
def host_env(monkeypatch: pytest.MonkeyPatch, model_server: ModelServer,
             corral_home: Path) -> ModelServer:
    """The model server as the host's Gemini upstream (the Runner's model proxy uses it)."""
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", model_server.gemini_url)
    monkeypatch.setenv("GEMINI_API_KEY", REAL_KEY)
    return model_server


def test_gemini_host_tool_result_reaches_the_model(host_env: ModelServer, corral_home: Path,
                                                   tmp_path: Path) -> None:
    secret = "host-only-" + secrets.token_hex(8)
    secret_file = tmp_path / "host-state.txt"  # on the host, outside any sandbox
    secret_file.write_text(secret)
    seen: list[str] = []

    @tool
    def read_host_state(key: str) -> str:
        """Read a value that only the host has."""
        seen.append(key)
        return f"{key}={secret_file.read_text()}"

    host_env.script = call_then_answer("read_host_state", {"key": "answer"})

    async def main() -> tuple[list[dict[str, Any]], dict[str, Any], str, str]:
        store = await open_store(f"sqlite://{corral_home / 'corral.db'}")
        try:
            runner = Runner(store)
            rec = await runner.start(RunRequest(
                prompt="What does the host say?", harness="gemini-cli",
                options={"max_retries": 0, "model": "gemini-fake"},
                tools=Toolset([read_host_state])))
            with anyio.fail_after(DEADLINE):
                result = await runner.drive(rec.run_id)
            return (await logged(store, rec.run_id), result.record.spec or {},
                    result.record.status.value, await run_tools_token(store, rec.run_id))
        finally:
            await store.aclose()

    events, spec, status, token = anyio.run(main)
    offered = [r.tools for r in host_env.model_requests]
    assert status == "completed", (events[-3:], offered)
    assert seen == ["answer"], offered
    # The tool's result went back to the model in the CLI's next request.
    assert any(secret in r for req in host_env.model_requests for r in req.tool_results)
    # The events name the host tool by its own name; no server prefix leaks through.
    assert tool_names(events) == ["read_host_state"]
    start = next(e for e in events if e["type"] == "TOOL_CALL_START")
    args = "".join(e["delta"] for e in events if e["type"] == "TOOL_CALL_ARGS"
                   and e["toolCallId"] == start["toolCallId"])
    assert json.loads(args) == {"key": "answer"}
    results = [e["content"] for e in events if e["type"] == "TOOL_CALL_RESULT"]
    assert any(secret in r for r in results)
    text = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text.startswith("Host said:") and f"answer={secret}" in text
    assert token not in json.dumps(spec) and TOKEN_ENV not in json.dumps(spec)
