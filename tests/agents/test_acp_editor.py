"""``corral acp --harness claude-code`` driven by the official ACP client library, with the
real Claude Code CLI in bubblewrap against the scripted model: the model's Bash call shows
in the editor as a tool call; corral's ``ask`` rule on it becomes the editor's permission
prompt, whose answer decides it; the tool's result and the model's answer follow."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from corral.testing._model_script import ModelRequest, Reply, Text, ToolCall
from tests.server.test_acp_agent import Editor, acp_client  # noqa: F401 - the fixture

from .conftest import agent_cli_env

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("bwrap")]

CONFIG = """
[policy]
allow = ["echo *"]
ask = ["touch *"]
default = "deny"
"""


def touch_then_answer(req: ModelRequest) -> Reply:
    if not req.tool_results:
        return ToolCall("touch made-by-agent", tool="Bash",
                        args={"command": "touch made-by-agent"})
    return Text("All done.")


@pytest.mark.parametrize("answer", ["allow", "deny"])
def test_the_editor_answers_claude_codes_ask(
        acp_client: Path, model_server: object, cli_env: dict[str, str],  # noqa: F811
        bwfiles: Path, tmp_path: Path, answer: str) -> None:
    srv = model_server
    srv.script = touch_then_answer  # type: ignore[attr-defined]
    env = agent_cli_env(cli_env, bwfiles, srv)  # type: ignore[arg-type]
    project = tmp_path / "project"
    project.mkdir()
    config = tmp_path / "corral.toml"
    config.write_text(CONFIG)
    cmd = [sys.executable, "-m", "corral", "acp", "--harness", "claude-code", "--config",
           str(config)]
    editor = Editor(acp_client, {"cmd": cmd, "env": env, "cwd": str(project),
                                 "prompt": "Make the file.", "permission": answer})
    try:
        editor.wait(240)
    finally:
        editor.stop()
    updates = [x["update"] for x in editor.kinds("update")]
    calls = [u for u in updates if u["sessionUpdate"] == "tool_call"
             and u.get("kind") == "execute"]
    assert calls, json.dumps(updates)[:3000]
    call_id = calls[0]["toolCallId"]
    (permission,) = editor.kinds("permission")
    assert permission["params"]["toolCall"]["title"] == "touch made-by-agent"
    done = [u for u in updates if u["sessionUpdate"] == "tool_call_update"
            and u["toolCallId"] == call_id and u.get("status") == "completed"]
    assert done, json.dumps(updates)[:3000]
    assert "All done." in editor.text()
    assert [s["stopReason"] for s in editor.kinds("stop")] == ["end_turn"]
    result = done[-1]["content"][0]["content"]["text"]
    if answer == "deny":
        assert "denied" in result.lower() or "refused" in result.lower(), result
