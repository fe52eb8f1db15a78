"""The official AG-UI client (``HttpAgent``) drives a real Claude Code run through corral's
AG-UI endpoint: a shell tool call round trip against the scripted model server, the key on
the host side only, and the client's own event verification accepting the stream."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.testing._model_script import shell_then_text
from corral.testing._model_server import ModelServer
from tests.server.conftest import TOKEN, Home
from tests.server.test_agui_client import run_http_agent

from .conftest import REAL_KEY, agent_cli_env

pytestmark = pytest.mark.timeout(240)


def test_http_agent_drives_a_claude_code_run_with_a_tool_call(
        agents_env: Path, bwrap: object, cli_env: dict[str, str], bwfiles: Path,
        corral_home: Path, model_server: ModelServer, e2e: Path) -> None:
    model_server.script = shell_then_text("echo from-the-shell", "All done: {output}")
    home = Home(corral_home)
    home.env.update({k: v for k, v in agent_cli_env(cli_env, bwfiles, model_server).items()
                     if k.startswith(("CORRAL_AGENTS", "CORRAL_BWRAP", "ANTHROPIC_"))})
    with home.server(token=TOKEN) as server:
        events, result = run_http_agent(
            e2e, f"{server.url}/v1/agui", "agui-cc", "agui-cc-1", "run echo in the shell",
            {"corral": {"harness": "claude-code"}})
        record = server.run("agui-cc-1")
    assert record["status"] == "completed", record
    assert events == home.log("agui-cc-1")
    starts = [e for e in events if e["type"] == "TOOL_CALL_START"]
    results = [e for e in events if e["type"] == "TOOL_CALL_RESULT"]
    assert [s["toolCallName"] for s in starts] == ["Bash"]
    assert [r["toolCallId"] for r in results] == [starts[0]["toolCallId"]]
    assert "from-the-shell" in results[0]["content"]
    said = "".join(m.get("content") or "" for m in result["newMessages"]
                   if m["role"] == "assistant")
    assert "All done:" in said and "from-the-shell" in said
    # the client assembled the tool call into its messages, as a front end would show it
    calls = [c for m in result["newMessages"] for c in m.get("toolCalls") or []]
    assert [c["function"]["name"] for c in calls] == ["Bash"]
    assert all(r.api_key == REAL_KEY for r in model_server.model_requests)
