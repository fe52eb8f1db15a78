"""Host tools and the command gate: what a host-tool call costs an agent, and what corral's
PreToolUse hook adds to each Bash command of an agent run under a policy (Claude Code and
Codex both run it).

The run's MCP server (``HostToolServer`` with the permission tool) listens on a unix
socket, reached over a loopback TCP forwarder as in a sandbox; the exact hook command
corral gives the CLI is run with ``sh -c`` and a PreToolUse input on stdin, as the CLI runs
it. Reported: wall time per decision (process start of the sandbox's Python, the MCP call,
the policy evaluation), for an allowed and a denied command, p50 / p90 / max. And a host
tool call (``tools/call`` of a Python function, over the same forwarder, from a client that
keeps no connection: what a CLI's MCP client pays per call at most).

Run:
    PYTHONPATH=src python bench/command_gate.py [--runs 50]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import anyio
import anyio.abc

from corral.harness._cli_base import CliOptions, bash_gate_command
from corral.policy._policy import Policy
from corral.testing._loopback import tcp_to_unix
from corral.tools._core import Toolset, tool
from corral.tools._mcp_server import HostToolServer
from corral.tools._permission import PermissionPromptTool
from corral.tools._projection import TOKEN_ENV

TOKEN = "bench-token-" + "x" * 20


@tool
def lookup(key: str) -> str:
    """A host tool: read host-only state."""
    return f"value of {key}"


def _call(port: int, body: bytes) -> bytes:
    head = (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json"
            "\r\nAccept: application/json, text/event-stream\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(head + body)
        chunks = []
        while data := conn.recv(65536):
            chunks.append(data)
    return b"".join(chunks)


POLICY = Policy(allow=("echo *", "git *"), deny=("rm *", "c?t *"), default="deny")


async def main(runs: int) -> None:
    server = HostToolServer(Toolset([PermissionPromptTool(POLICY, None), lookup]), token=TOKEN)
    sock = Path(tempfile.mkdtemp(prefix="corral-gate-")) / "tools.sock"
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve, sock)
        async with tcp_to_unix(sock) as port:
            await _measure(runs, port)
        tg.cancel_scope.cancel()


async def _measure(runs: int, port: int) -> None:
    url = f"http://127.0.0.1:{port}/mcp"
    command = bash_gate_command(CliOptions(mcp_servers={"corral": {"url": url}}))
    env = {**os.environ, TOKEN_ENV: TOKEN}
    print(f"command gate, {runs} decisions each, hook = {len(command)} bytes of shell")
    for label, cmd, want in (("allowed", "git status && echo ok", 0),
                             ("denied", "echo hi; cat /etc/passwd", 2)):
        body = json.dumps({"hook_event_name": "PreToolUse", "tool_name": "Bash",
                           "tool_input": {"command": cmd}, "tool_use_id": "t"}).encode()
        times: list[float] = []
        for _ in range(runs):
            t0 = time.perf_counter()
            res = await anyio.run_process(["sh", "-c", command], input=body, env=env,
                                          check=False)
            times.append((time.perf_counter() - t0) * 1000)
            assert res.returncode == want, res.stderr
        times.sort()
        print(f"  {label:8s} p50 {statistics.median(times):6.1f} ms   "
              f"p90 {times[int(len(times) * 0.9) - 1]:6.1f} ms   max {times[-1]:6.1f} ms")
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "lookup", "arguments": {"key": "k"}}}).encode()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        answer = await anyio.to_thread.run_sync(_call, port, body)
        times.append((time.perf_counter() - t0) * 1000)
        assert b"value of k" in answer, answer
    times.sort()
    print(f"  host tool call (tools/call, fresh connection) p50 "
          f"{statistics.median(times):6.1f} ms   p90 {times[int(len(times) * 0.9) - 1]:6.1f} ms")
    # for scale: the sandbox's Python starting and exiting, nothing else
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        await anyio.run_process(["/usr/bin/python3", "-I", "-S", "-c", "pass"])
        times.append((time.perf_counter() - t0) * 1000)
    print(f"  (python3 -I -S start+exit alone: p50 {statistics.median(times):.1f} ms)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    anyio.run(main, parser.parse_args().runs)
