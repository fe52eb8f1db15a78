"""What the harnesses put on the CLI's command line and environment (no CLI is run)."""

from __future__ import annotations

import json

import pytest

from corral._errors import ConfigError
from corral.harness._base import AgentRequest
from corral.harness._claude_code import ClaudeCodeHarness
from corral.harness._codex import CodexHarness
from corral.net._model_proxy import PLACEHOLDER_KEY

MCP = {"tools": {"command": "/usr/bin/tool-server", "args": ["--stdio"], "env": {"A": "1"}},
       "remote": {"url": "http://127.0.0.1:9/mcp"}}


def test_claude_command() -> None:
    cmd = ClaudeCodeHarness().build_command(AgentRequest(
        prompt="fix it", options={"model": "claude-x", "resume": "sid-1", "mcp_servers": MCP,
                                  "forward": [{"name": "model", "port": 0,
                                               "unix": "/run/corral/m.sock"}],
                                  "timeout": 30}))
    argv = list(cmd.argv)
    assert argv[:3] == ["/usr/bin/python3", "-I", "-S"]  # the in-sandbox entry
    config = json.loads(argv[argv.index("--") - 1])
    assert config == {"forward": [{"name": "model", "port": 0, "unix": "/run/corral/m.sock"}]}
    assert cmd.timeout == 30.0  # enforced by the supervisor on the host, not in the sandbox
    cli = argv[argv.index("--") + 1:]
    assert cli[0].endswith("/claude-code/2.1.332/node_modules/.bin/claude")
    assert cli[1:5] == ["-p", "--output-format", "stream-json", "--verbose"]
    assert cli[cli.index("--model") + 1] == "claude-x"
    assert cli[cli.index("--resume") + 1] == "sid-1"
    mcp = json.loads(cli[cli.index("--mcp-config") + 1])["mcpServers"]
    assert mcp["tools"] == {"command": "/usr/bin/tool-server", "args": ["--stdio"],
                            "env": {"A": "1"}}
    assert mcp["remote"]["url"] == "http://127.0.0.1:9/mcp" and "--strict-mcp-config" in cli
    assert cmd.stdin == b"fix it" and "fix it" not in " ".join(argv)  # prompt on stdin
    assert cmd.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:{corral.port.model}"
    assert cmd.env["ANTHROPIC_API_KEY"] == PLACEHOLDER_KEY
    assert cmd.env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert cmd.env["CLAUDE_CODE_MAX_RETRIES"] == "2"
    assert cmd.cwd == "/workspace"


def test_codex_command() -> None:
    cmd = CodexHarness().build_command(AgentRequest(
        prompt="fix it", options={"resume": "thr-1", "mcp_servers": MCP, "egress": True,
                                  "base_url": "http://127.0.0.1:5/v1", "max_retries": 0}))
    argv = list(cmd.argv)
    assert argv[1:4] == ["exec", "resume", "--json"]
    assert argv[-2:] == ["thr-1", "-"]
    configs = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-c")
    assert configs["model_provider"] == '"corral"'
    assert configs["model_providers.corral.base_url"] == '"http://127.0.0.1:5/v1"'
    assert configs["model_providers.corral.wire_api"] == '"responses"'
    assert configs["model_providers.corral.request_max_retries"] == "0"
    assert configs["mcp_servers.tools.command"] == '"/usr/bin/tool-server"'
    assert json.loads(configs["mcp_servers.tools.args"]) == ["--stdio"]
    assert configs["mcp_servers.remote.url"] == '"http://127.0.0.1:9/mcp"'
    assert "--disable" in argv and argv[argv.index("--disable") + 1] == "plugins"
    assert cmd.env["CORRAL_MODEL_KEY"] == PLACEHOLDER_KEY
    assert cmd.env["HTTPS_PROXY"] == "http://127.0.0.1:{corral.port.egress}"
    assert "127.0.0.1" in cmd.env["NO_PROXY"]


@pytest.mark.parametrize("options, fragment", [
    ({"bogus": 1}, "unknown agent option"),
    ({"timeout": -1}, "timeout"),
    ({"max_retries": "3"}, "max_retries"),
    ({"mcp_servers": {"x": {}}}, "needs a 'command'"),
    ({"forward": [{"name": "m"}]}, "forward"),
    ({"env": {"A": 1}}, "env"),
    ({}, "needs a model endpoint"),
])
def test_bad_options_are_config_errors(options: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        ClaudeCodeHarness().build_command(AgentRequest(prompt="x", options=options))


def test_an_empty_prompt_is_refused() -> None:
    with pytest.raises(ConfigError, match="non-empty prompt"):
        CodexHarness().build_command(AgentRequest(prompt="  ", options={"base_url": "http://x"}))
