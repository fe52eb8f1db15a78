"""Helpers of the "another local user" attacks: a live run's host services (model proxy,
egress proxy, host tools) on real sandboxes, and a client that talks to their unix sockets
as another uid (``setpriv``) or from inside the sandbox.

The client is a stdlib script: the socket path in argv, the raw request on stdin (so a
token in it never shows in a process listing); it prints one JSON line:
``{"errno": N}`` when it cannot connect, else ``{"status": N, "body": "..."}``."""

from __future__ import annotations

import base64
import json
import shutil
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from corral.agents._prepare import PreparedAgent, prepare_agent, with_agent_binds
from corral.harness._base import AgentRequest
from corral.harness._claude_code import ClaudeCodeHarness
from corral.sandbox._contracts import Handle, Provider, SandboxSpec
from corral.testing._model_script import Text
from corral.testing._model_server import ModelServer
from corral.tools import Toolset, tool
from corral.tools._mcp_server import HostToolServer
from tests.agents.conftest import upstream_for

CLIENT = r"""
import json, socket, sys
request = bytes.fromhex(sys.stdin.read().strip())
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(sys.argv[1])
except OSError as exc:
    print(json.dumps({"errno": exc.errno, "error": str(exc)}))
    sys.exit(0)
s.settimeout(60)
s.sendall(request)
data = b""
while b"\r\n\r\n" not in data:
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
head, _, body = data.partition(b"\r\n\r\n")
lines = head.decode("latin-1").split("\r\n")
status = int(lines[0].split()[1]) if lines and len(lines[0].split()) > 1 else 0
length = 0
for line in lines[1:]:
    name, _, value = line.partition(":")
    if name.strip().lower() == "content-length":
        length = int(value.strip())
while len(body) < length:
    chunk = s.recv(65536)
    if not chunk:
        break
    body += chunk
print(json.dumps({"status": status, "body": body.decode("utf-8", "replace")}))
"""

NOBODY = 65534


def http_request(method: str, target: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: localhost", "Connection: close",
             *(f"{k}: {v}" for k, v in headers.items())]
    if method != "CONNECT":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


MODEL_BODY = json.dumps({"model": "claude-x", "max_tokens": 16, "stream": False,
                         "messages": [{"role": "user", "content": "spend the run's key"}]}
                        ).encode()


def model_request(key: str) -> bytes:
    """An Anthropic Messages call with ``key`` as its API key."""
    return http_request("POST", "/v1/messages", {"x-api-key": key,
                                                 "anthropic-version": "2023-06-01",
                                                 "content-type": "application/json"},
                        MODEL_BODY)


def tools_request(token: str | None) -> bytes:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                       "params": {"name": "launch", "arguments": {}}}).encode()
    headers = {"content-type": "application/json",
               "accept": "application/json, text/event-stream"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    return http_request("POST", "/mcp", headers, body)


def connect_request(target: str, token: str | None) -> bytes:
    headers = {}
    if token is not None:
        cred = base64.b64encode(f"corral:{token}".encode()).decode()
        headers["proxy-authorization"] = f"Basic {cred}"
    return http_request("CONNECT", target, headers)


async def as_user(uid: int, socket_path: Path | str, request: bytes) -> dict[str, Any]:
    """Send ``request`` to ``socket_path`` as host uid/gid ``uid`` (no groups)."""
    setpriv = shutil.which("setpriv")
    assert setpriv is not None, "setpriv (util-linux) is needed"
    done = await anyio.run_process(
        [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "/usr/bin/python3",
         "-I", "-S", "-c", CLIENT, str(socket_path)],
        input=request.hex().encode(), check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


async def from_sandbox(handle: Handle, inside_path: str, request: bytes) -> dict[str, Any]:
    """Send ``request`` from inside the sandbox (its own uid), as the agent would."""
    result = await handle.process.exec(
        ["/usr/bin/python3", "-I", "-S", "-c", CLIENT, inside_path],
        stdin=request.hex().encode(), timeout=60)
    assert result.exit_code == 0, result.describe() + result.stderr.decode(errors="replace")
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def refused(result: dict[str, Any], status: int) -> bool:
    """The attacker could not connect at all, or got ``status`` (401/407)."""
    return "errno" in result or result.get("status") == status


tool_calls: list[str] = []


@tool
def launch() -> str:
    """A host tool the attacker wants to run."""
    tool_calls.append("launch")
    return "launched"


@dataclass
class LiveRun:
    """A prepared run whose model proxy, egress proxy and host tools are served."""

    handle: Handle
    prepared: PreparedAgent
    srv: ModelServer
    tcp_accepted: list[str] = field(default_factory=list)
    tcp_port: int = 0

    def inside(self, host_socket: Path) -> str:
        return f"/run/corral/{host_socket.name}"


@asynccontextmanager
async def live_run(provider: Provider, srv: ModelServer) -> AsyncIterator[LiveRun]:
    """A sandbox with the agent binds and a prepared claude-code run whose services run
    (the agent itself is not started: the attacks target the services)."""
    tool_calls.clear()
    srv.script = lambda _req: Text("the run's own answer")
    handle = await provider.create(with_agent_binds(SandboxSpec()))
    try:
        async with anyio.create_task_group() as tg:
            accepted: list[str] = []

            async def on_tcp(stream: anyio.abc.SocketStream) -> None:
                accepted.append("connection")
                await stream.aclose()

            listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
            port = listener.extra(anyio.abc.SocketAttribute.local_port)
            tg.start_soon(listener.serve, on_tcp)
            harness = ClaudeCodeHarness()
            prepared = await prepare_agent(
                harness, handle, AgentRequest(prompt="hello", options={"max_retries": 0}),
                thread_id="thread-attack", run_id=f"attack-{uuid.uuid4().hex[:8]}",
                upstream=upstream_for(harness, srv), egress=[f"127.0.0.1:{port}"],
                host_tools=True)
            assert prepared.host_tools is not None
            server = HostToolServer(Toolset([launch]), token=prepared.host_tools.token,
                                    run_id=prepared.run_id)
            async with prepared.services():
                await tg.start(server.serve, prepared.host_tools.socket)
                yield LiveRun(handle, prepared, srv, accepted, port)
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await provider.destroy(handle.ref)
