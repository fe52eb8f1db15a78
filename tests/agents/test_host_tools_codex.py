"""Host tools for Codex, end to end: the real Codex CLI in bubblewrap (no network) calls a
Python function of the driving process through the run's MCP server ``corral``, projected
into Codex's ``mcp_servers`` with the bearer token read from an environment variable.

The scripted model server (OpenAI Responses API) stands in for the model: it asks for the
host tool by the name Codex offers it under, and records what Codex sends back.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.harness._codex import mcp_server_config
from corral.testing._model_server import ModelServer
from corral.tools import Toolset, tool
from corral.tools._projection import TOKEN_ENV

from corral.testing._harness_events import call_then_answer
from corral.testing._harness_world import host_tool_by_suffix
from .conftest import files_containing, make_harness, upstream_for

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("bwrap")]


def test_prepare_agent_projects_host_tools_into_codex_config(
        sandbox_factory: Any, model_server: ModelServer) -> None:
    from corral.agents._prepare import prepare_agent
    from corral.harness._base import AgentRequest

    token = secrets.token_urlsafe(32)  # the Runner passes run_tools_token(store, run_id)

    async def main() -> None:
        handle = await sandbox_factory()
        harness = make_harness("codex")
        prepared = await prepare_agent(
            harness, handle, AgentRequest(prompt="hi", options={
                "model": "gpt-fake",
                "mcp_servers": {"other": {"url": "http://127.0.0.1:9/mcp"}}}),
            thread_id="t-1", run_id="run-codex-merge",
            upstream=upstream_for(harness, model_server), host_tools=True,
            tools_token=token)
        proj = prepared.host_tools
        assert proj is not None and proj.token == token
        cmd = prepared.command
        assert not any(proj.token in a for a in cmd.argv)  # never in argv
        assert cmd.env[TOKEN_ENV] == proj.token  # only in the CLI's environment
        overrides = [cmd.argv[i + 1] for i, a in enumerate(cmd.argv) if a == "-c"]
        assert "mcp_servers.other.url=\"http://127.0.0.1:9/mcp\"" in overrides
        assert ("mcp_servers.corral.url=\"http://127.0.0.1:{corral.port.tools}/mcp\""
                in overrides)
        assert f"mcp_servers.corral.bearer_token_env_var=\"{TOKEN_ENV}\"" in overrides
        entry = json.loads(next(a for a in cmd.argv if a.startswith('{"forward"')))
        assert [f["name"] for f in entry["forward"]] == ["model", "tools"]
        assert files_containing(Path(handle.host_root), proj.token.encode()) == []
        assert files_containing(proj.socket.parent, proj.token.encode()) == []

    anyio.run(main)


def test_mcp_server_config_keeps_secrets_in_the_environment() -> None:
    from corral._errors import ConfigError

    cfg = mcp_server_config("s", {"url": "http://h/mcp", "headers": {
        "Authorization": "Bearer ${TOK}", "X-Key": "${KEY}", "X-Plain": "v"}})
    assert cfg == {
        "mcp_servers.s.url": '"http://h/mcp"',
        "mcp_servers.s.bearer_token_env_var": '"TOK"',
        "mcp_servers.s.env_http_headers.X-Key": '"KEY"',
        "mcp_servers.s.http_headers.X-Plain": '"v"',
    }
    with pytest.raises(ConfigError, match="mixes text"):
        mcp_server_config("s", {"url": "http://h", "headers": {"X": "a ${TOK}"}})
    with pytest.raises(ConfigError, match="server name"):
        mcp_server_config("a.b", {"url": "http://h"})


def test_codex_keeps_the_token_out_of_the_sandbox(sandbox_factory: Any,
                                                  model_server: ModelServer) -> None:
    """After a whole Codex run that used the host tool, no file in the sandbox (workspace,
    ``~/.codex`` with its sessions and logs) nor in the socket directory holds the token;
    a wrong token is refused by the server (the CLI really authenticated)."""
    from corral.agents._prepare import NET_MOUNT
    from corral.tools._mcp_server import HostToolServer
    from corral.tools._projection import host_tools_projection

    from .conftest import run_agent

    @tool
    def read_host_state(key: str) -> str:
        """Read a value that only the host has."""
        return f"{key}=from-the-host"

    model_server.script = call_then_answer(host_tool_by_suffix, "read_host_state", {"key": "k"})

    async def main() -> None:
        handle = await sandbox_factory()
        harness = make_harness("codex")
        token = secrets.token_urlsafe(32)
        server = HostToolServer(Toolset([read_host_state]), token=token,
                                run_id="run-codex-token")
        net_host = next(Path(h) for h, i in handle.state.binds if i == NET_MOUNT)
        socket = host_tools_projection(net_host, NET_MOUNT, "run-codex-token").socket
        async with anyio.create_task_group() as tg:
            await tg.start(server.serve, socket)
            run = await run_agent(harness, handle, "Ask the host.", model_server,
                                  run_id="run-codex-token", host_tools=True,
                                  tools_token=token)
            tg.cancel_scope.cancel()
        assert server.calls == 1 and server.refused == 0, run.stderr[-2000:]
        assert any("k=from-the-host" in r for r in run.tool_results())
        # Codex's own files (the rollout of this session) are among those searched.
        assert list(Path(handle.host_root).rglob("rollout-*.jsonl"))
        assert files_containing(Path(handle.host_root), token.encode()) == []
        assert files_containing(net_host, token.encode()) == []
        assert token not in run.stderr

    anyio.run(main)
