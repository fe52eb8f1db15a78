"""Host tools for gemini-cli, end to end: the real gemini CLI in bubblewrap (no network)
calls a Python function of the driving process through the run's MCP server ``corral``,
projected into ``mcpServers`` of its settings with the bearer token expanded by the CLI from
its environment.

The scripted model server (Gemini ``streamGenerateContent``) stands in for the model: it
asks for the host tool under the name gemini-cli offers it, and records what comes back.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from corral.testing._model_server import ModelRequest, ModelServer, Reply, Text, ToolCall

from .host_tools_flow import check_host_tool_round_trip

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


def test_gemini_host_tool_result_reaches_the_model(host_env: ModelServer, corral_home: Path,
                                                   tmp_path: Path) -> None:
    check_host_tool_round_trip(
        harness="gemini-cli", options={"max_retries": 0, "model": "gemini-fake"},
        host_env=host_env, corral_home=corral_home, tmp_path=tmp_path,
        call_then_answer=call_then_answer)
