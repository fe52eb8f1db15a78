"""Host tools for gemini-cli, end to end: the real gemini CLI in bubblewrap (no network)
calls a Python function of the driving process through the run's MCP server ``corral``,
projected into ``mcpServers`` of its settings with the bearer token expanded by the CLI from
its environment.

The scripted model server (Gemini ``streamGenerateContent``) stands in for the model: it
asks for the host tool under the name gemini-cli offers it, and records what comes back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral.testing._model_server import ModelRequest, ModelServer, ToolCall

from .host_tools_flow import check_host_tool_round_trip, host_tool_script

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("bwrap")]


def _offered(req: ModelRequest, tool_name: str, args: dict[str, Any]) -> ToolCall | None:
    """The call of host tool ``tool_name`` under whatever prefix gemini-cli gives MCP
    tools, if on offer."""
    offered = [t for t in req.tools if t.endswith(tool_name)]
    return ToolCall("", tool=offered[0], args=args) if offered else None


call_then_answer = host_tool_script(_offered)


def test_gemini_host_tool_result_reaches_the_model(host_env: ModelServer, corral_home: Path,
                                                   tmp_path: Path) -> None:
    check_host_tool_round_trip(
        harness="gemini-cli", options={"max_retries": 0, "model": "gemini-fake"},
        host_env=host_env, corral_home=corral_home, tmp_path=tmp_path,
        call_then_answer=call_then_answer)
