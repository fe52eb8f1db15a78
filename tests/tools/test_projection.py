"""Projection of the host-tool server into Claude Code's command: token only in env."""

from __future__ import annotations

import json
from pathlib import Path

from corral.harness._base import AgentRequest
from corral.harness._claude_code import ClaudeCodeHarness
from corral.tools._projection import TOKEN_ENV, host_tools_projection


def test_projection_into_claude_code_command(tmp_path: Path) -> None:
    proj = host_tools_projection(tmp_path, "/run/corral", "run-9")
    again = host_tools_projection(tmp_path, "/run/corral", "run-9")
    assert proj.socket == again.socket and proj.socket.parent == tmp_path  # stable per run
    assert proj.token != again.token and len(proj.token) >= 32
    assert proj.forward == {"name": "tools", "port": 0,
                            "unix": f"/run/corral/{proj.socket.name}", "await": True}
    model = {"name": "model", "port": 0, "unix": "/run/corral/model-x.sock"}
    cmd = ClaudeCodeHarness().build_command(AgentRequest(
        prompt="hi", options={"forward": [model, proj.forward], "bin": "/bin/claude",
                              "mcp_servers": proj.mcp_servers},
        env=proj.env))
    assert all(proj.token not in a for a in cmd.argv)
    assert cmd.env[TOKEN_ENV] == proj.token
    config = json.loads(cmd.argv[cmd.argv.index("--mcp-config") + 1])
    assert config["mcpServers"]["corral"] == {
        "type": "http", "url": "http://127.0.0.1:{corral.port.tools}/mcp",
        "headers": {"Authorization": "Bearer ${CORRAL_TOOLS_TOKEN}"}}
    entry_config = json.loads(cmd.argv[5])  # the in-sandbox entry forwards "tools" too
    assert [f["name"] for f in entry_config["forward"]] == ["model", "tools"]
    assert proj.token not in repr(proj)
