"""The command gate hook (``corral._insandbox.command_gate``) against a real run MCP
server: the exact hook command corral puts in ``--settings`` is run by ``sh -c`` with a
hook input on stdin, as Claude Code runs it, and must allow, deny naming the rule, and
fail closed."""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.harness._claude_code import bash_gate_settings
from corral.harness._cli_base import bash_gate_command
from corral.harness._codex import CodexHarness
from corral._insandbox.command_gate import parse_response
from corral.harness._cli_base import CliOptions
from corral.policy._policy import Policy
from corral.stores import MemoryStore
from corral.testing._loopback import tcp_to_unix
from corral.tools._approvals import Approvals, answer_approval, list_pending
from corral.tools._core import Toolset
from corral.tools._mcp_server import HostToolServer
from corral.tools._permission import PermissionPromptTool
from corral.tools._projection import TOKEN_ENV
from corral.testing import wait_until_async

pytestmark = pytest.mark.anyio

POLICY = Policy(allow=("echo *",), deny=("c?t *",), ask=("touch *",), default="deny")
TOKEN = "t" * 32


@pytest.fixture
async def gate_url(tmp_path: Path) -> AsyncIterator[tuple[str, Approvals]]:
    """The run's MCP server on a unix socket, reached over loopback TCP as in a sandbox."""
    approvals = Approvals(MemoryStore(), "run-1", timeout=30)
    server = HostToolServer(Toolset([PermissionPromptTool(POLICY, approvals)]), token=TOKEN,
                            run_id="run-1", approvals=approvals)
    sock = tmp_path / "tools.sock"
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve, sock)
        async with tcp_to_unix(sock) as port:
            yield f"http://127.0.0.1:{port}/mcp", approvals
        tg.cancel_scope.cancel()


def _claude_hook(url: str, timeout: float | None = None) -> str:
    opts = CliOptions(mcp_servers={"corral": {"type": "http", "url": url}}, timeout=timeout)
    settings = bash_gate_settings(opts)
    (entry,) = settings["hooks"]["PreToolUse"]
    assert entry["matcher"] == "Bash"
    (hook,) = entry["hooks"]
    assert hook["type"] == "command" and hook["timeout"] >= 3600
    command: str = hook["command"]
    return command


def _codex_hook(url: str) -> str:
    """The hook as Codex reads it: a TOML value of a ``-c hooks.PreToolUse=...`` override."""
    opts = CliOptions(mcp_servers={"corral": {"type": "http", "url": url}},
                      base_url="http://127.0.0.1:9/v1")
    argv = CodexHarness(policy=POLICY, permission_prompt=True).cli_argv(opts)
    assert "--dangerously-bypass-hook-trust" in argv
    (value,) = [a.split("=", 1)[1] for a in argv if a.startswith("hooks.PreToolUse=")]
    (entry,) = tomllib.loads(f"v = {value}")["v"]
    assert entry["matcher"] == "Bash"
    (hook,) = entry["hooks"]
    assert hook["type"] == "command" and hook["timeout"] >= 3600
    # the model is not offered the decision tool
    assert 'mcp_servers.corral.disabled_tools=["permission_prompt"]' in argv
    command: str = hook["command"]
    assert command == bash_gate_command(opts)
    return command


HOOKS = {"claude-code": _claude_hook, "codex": _codex_hook}
_hook_command = _claude_hook


async def _run_hook(url: str, hook_input: dict[str, Any], *, token: str | None = TOKEN,
                    cli: str = "claude-code", command: str | None = None
                    ) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    if token is not None:
        env[TOKEN_ENV] = token
    return await anyio.run_process(["sh", "-c", command or HOOKS[cli](url)],
                                   input=json.dumps(hook_input).encode(), env=env,
                                   check=False)


def _bash(command: str) -> dict[str, Any]:
    return {"session_id": "s", "hook_event_name": "PreToolUse", "tool_name": "Bash",
            "tool_input": {"command": command, "description": "x"}, "tool_use_id": "toolu_1"}


@pytest.mark.parametrize("cli", sorted(HOOKS))
async def test_allowed_command_is_allowed(gate_url: tuple[str, Approvals], cli: str) -> None:
    res = await _run_hook(gate_url[0], _bash("echo hi"), cli=cli)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)["hookSpecificOutput"]
    assert out["hookEventName"] == "PreToolUse" and out["permissionDecision"] == "allow"


@pytest.mark.parametrize("cli", sorted(HOOKS))
@pytest.mark.parametrize("command, rule", [
    ("cat /etc/passwd", "deny: c?t *"),            # read-only, refused by a non-prefix rule
    ("head -c 9 /etc/passwd", "default"),          # read-only, refused by default deny
    ("echo ok; cat /etc/shadow", "deny: c?t *"),   # a denied part anywhere
])
async def test_denied_command_blocks_naming_the_rule(
        gate_url: tuple[str, Approvals], command: str, rule: str, cli: str) -> None:
    res = await _run_hook(gate_url[0], _bash(command), cli=cli)
    assert res.returncode == 2
    assert f"denied by corral policy ({rule})" in res.stderr.decode()
    assert res.stdout == b""


@pytest.mark.parametrize("cli", sorted(HOOKS))
@pytest.mark.parametrize("command", [
    "x='a[$(cat /etc/passwd)]'; echo $((x))",      # a value evaluated later as arithmetic
    "echo $(( '$(cat /etc/passwd)' ))",            # single quotes are literal in arithmetic
    "[[ -v 'a[$(cat /etc/passwd)]' ]] && echo",    # a [[ … ]] that "runs nothing"
    "read -r y < f; echo $((y))",                  # data evaluated as code
])
async def test_code_bash_evaluates_is_refused_under_deny(
        gate_url: tuple[str, Approvals], command: str, cli: str) -> None:
    """Each of these ran `cat` (denied) under bash while the policy saw only `echo`."""
    res = await _run_hook(gate_url[0], _bash(command), cli=cli)
    assert res.returncode == 2, res.stdout
    assert "denied by corral policy (unparseable)" in res.stderr.decode()
    assert res.stdout == b""


async def test_ask_waits_for_the_approval(gate_url: tuple[str, Approvals]) -> None:
    url, gate = gate_url
    results: list[subprocess.CompletedProcess[bytes]] = []

    async def hook() -> None:
        results.append(await _run_hook(url, _bash("touch y")))

    async with anyio.create_task_group() as tg:
        tg.start_soon(hook)
        await wait_until_async(lambda: list_pending(gate.store, "run-1"),
                               "the approval request", timeout=30, interval=0.02)
        pending = await list_pending(gate.store, "run-1")
        assert not results  # held while nobody answered
        await answer_approval(gate.store, "run-1", pending[0].approval_id, False,
                              reason="not now")
    assert results[0].returncode == 2
    assert "not now" in results[0].stderr.decode()


@pytest.mark.parametrize("token", [None, "w" * 32])
async def test_fails_closed_without_the_right_token(
        gate_url: tuple[str, Approvals], token: str | None) -> None:
    res = await _run_hook(gate_url[0], _bash("echo hi"), token=token)
    assert res.returncode == 2
    assert "could not check this command" in res.stderr.decode()


async def test_fails_closed_when_no_server_comes_within_the_runs_time() -> None:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    await listener.aclose()  # nothing listens there now
    url = f"http://127.0.0.1:{port}/mcp"
    command = _claude_hook(url, timeout=1.5)  # a run of 1.5 s: it asks again for that long
    assert command.endswith(" 1.5")
    res = await _run_hook(url, _bash("echo hi"), command=command)
    assert res.returncode == 2
    assert "could not check this command" in res.stderr.decode()


async def test_an_approval_outlives_the_server_that_asked_it(tmp_path: Path) -> None:
    """The driver serving the run's tools goes (SIGKILL, detach) while the gate waits for an
    approval: the gate asks again until a successor serves the socket; the successor finds
    the same request (keyed by the tool call) and the answer given meanwhile."""
    store = MemoryStore()
    sock = tmp_path / "tools.sock"

    async def serve(scope: anyio.CancelScope,
                    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                    ) -> None:
        approvals = Approvals(store, "run-1", timeout=30)
        server = HostToolServer(Toolset([PermissionPromptTool(POLICY, approvals)]),
                                token=TOKEN, run_id="run-1", approvals=approvals)
        with scope:
            async with anyio.create_task_group() as tg:
                await tg.start(server.serve, sock)
                task_status.started()
                await anyio.sleep_forever()

    results: list[subprocess.CompletedProcess[bytes]] = []
    async with anyio.create_task_group() as tg, tcp_to_unix(sock) as port:
        url = f"http://127.0.0.1:{port}/mcp"

        async def hook() -> None:
            results.append(await _run_hook(url, _bash("touch y")))

        first = anyio.CancelScope()
        await tg.start(serve, first)
        tg.start_soon(hook)
        await wait_until_async(lambda: list_pending(store, "run-1"), "the approval request",
                               timeout=30, interval=0.02)
        (asked,) = await list_pending(store, "run-1")
        first.cancel()  # the driver goes with the gate's question open
        await wait_until_async(lambda: not sock.exists(), "the socket to go", timeout=30,
                               interval=0.02)
        await answer_approval(store, "run-1", asked.approval_id, True)  # no driver meanwhile
        assert not results  # still asking
        second = anyio.CancelScope()
        await tg.start(serve, second)  # the successor
        await wait_until_async(lambda: results, "the gate's answer", timeout=30, interval=0.05)
        second.cancel()
    assert results[0].returncode == 0, results[0].stderr
    assert json.loads(results[0].stdout)["hookSpecificOutput"]["permissionDecision"] == "allow"
    assert await list_pending(store, "run-1") == []


async def test_fails_closed_on_garbage_input(gate_url: tuple[str, Approvals]) -> None:
    env = {**os.environ, TOKEN_ENV: TOKEN}
    res = await anyio.run_process(["sh", "-c", _hook_command(gate_url[0])], input=b"{not json",
                                  env=env, check=False)
    assert res.returncode == 2
    assert b"could not check this command" in res.stderr and b"JSONDecodeError" in res.stderr


async def test_other_tools_pass_through(gate_url: tuple[str, Approvals]) -> None:
    res = await _run_hook(gate_url[0], {"tool_name": "Read", "tool_input": {"file_path": "x"}})
    assert res.returncode == 0 and res.stdout == b""


@given(body=st.binary(max_size=3000), cuts=st.lists(st.integers(1, 500), max_size=8),
       extra=st.sampled_from(["", "X-Other: 1\r\n", "content-type: application/json\r\n"]))
def test_response_parser_reads_every_framing(body: bytes, cuts: list[int], extra: str) -> None:
    """Content-Length, chunked (any chunk sizes) and read-to-end answers give back the body;
    a truncated one raises instead of yielding a partial verdict."""
    fixed = f"HTTP/1.1 200 OK\r\n{extra}Content-Length: {len(body)}\r\n\r\n".encode() + body
    assert parse_response(fixed) == body
    chunks, rest = [], body
    for cut in cuts:
        if rest:
            chunks.append(rest[:cut])
            rest = rest[cut:]
    if rest:
        chunks.append(rest)
    chunked = f"HTTP/1.1 200 OK\r\n{extra}Transfer-Encoding: chunked\r\n\r\n".encode() + b"".join(
        f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in chunks) + b"0\r\n\r\n"
    assert parse_response(chunked) == body
    assert parse_response(f"HTTP/1.1 200 OK\r\n{extra}\r\n".encode() + body) == body
    if body:  # cut short (the driver went mid-answer): worth asking again
        with pytest.raises(ConnectionError):
            parse_response(fixed[:-1])
        with pytest.raises(ConnectionError):
            parse_response(chunked[: len(chunked) - len(body) // 2 - 7])


@pytest.mark.parametrize(("status", "error"), [
    ("500 Internal Server Error", ConnectionError), ("503 Service Unavailable", ConnectionError),
    ("401 Unauthorized", RuntimeError), ("404 Not Found", RuntimeError), ("", RuntimeError)])
def test_a_server_error_is_asked_again_and_a_refusal_is_final(
        status: str, error: type[Exception]) -> None:
    """Anything but a 200 is no verdict: a 5xx (the driver stopped mid-answer) and no
    answer at all are asked again, anything else (a bad token, junk) refuses at once."""
    line = f"HTTP/1.1 {status}" if status else "junk"
    with pytest.raises(error):
        parse_response(f"{line}\r\nContent-Length: 2\r\n\r\n{{}}".encode())
    with pytest.raises(ConnectionError):
        parse_response(b"")
