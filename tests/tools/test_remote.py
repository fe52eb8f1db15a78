"""Remote-tool helpers: descriptors, stubs, the HTTP executor against real servers."""

from __future__ import annotations

import json
import secrets
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.tools import Toolset, UnknownToolError, tool
from corral.tools._asgi import serve_unix
from corral.tools._exec_app import tool_exec_app
from corral.tools._remote import (
    HttpToolExecutor,
    RemoteTool,
    RemoteToolBadResponse,
    RemoteToolRejected,
    RemoteToolServerError,
    RemoteToolTimeout,
    RemoteToolUnreachable,
    ToolArgumentsError,
    ToolDeniedError,
    ToolTimeoutError,
    execute_host_tool,
    is_tool_exec_request,
    parse_descriptors,
    remote_tool_stubs,
    tool_descriptors,
)

json_leaf = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
json_value = st.recursive(json_leaf, lambda c: st.lists(c, max_size=3)
                          | st.dictionaries(st.text(max_size=5), c, max_size=3), max_leaves=8)
descriptor = st.fixed_dictionaries({
    "name": st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True),
    "description": st.text(max_size=40),
    "inputSchema": st.fixed_dictionaries(
        {"type": st.just("object"),
         "properties": st.dictionaries(st.text(min_size=1, max_size=6),
                                       st.fixed_dictionaries({"type": st.sampled_from(
                                           ["string", "integer", "object"])}), max_size=3)},
        optional={"required": st.lists(st.text(max_size=4), max_size=2),
                  "x-extra": json_value}),
    "approval": st.booleans(),
})


class NullExecutor:
    async def execute(self, name: str, args: Any) -> Any:
        return {"ran": name, "args": args}


@settings(max_examples=150, deadline=None)
@given(st.lists(descriptor, max_size=5, unique_by=lambda d: d["name"]))
def test_descriptors_round_trip(descs: list[dict[str, Any]]) -> None:
    wire = json.loads(json.dumps(descs))
    stubs = remote_tool_stubs(wire, NullExecutor())
    assert tool_descriptors(stubs) == descs
    assert all(isinstance(t, RemoteTool) for t in stubs)


@given(st.one_of(json_value, st.dictionaries(st.text(max_size=5), json_value)))
def test_is_tool_exec_request_matches_shape(body: Any) -> None:
    ok = (isinstance(body, dict) and set(body) <= {"name", "args"}
          and isinstance(body.get("name"), str) and body["name"] != ""
          and (body.get("args") is None or isinstance(body["args"], dict)))
    assert is_tool_exec_request(body) is ok


def test_is_tool_exec_request_examples() -> None:
    assert is_tool_exec_request({"name": "a", "args": {"x": 1}})
    assert is_tool_exec_request({"name": "a"})
    assert not is_tool_exec_request({"name": "", "args": {}})
    assert not is_tool_exec_request({"name": 1})
    assert not is_tool_exec_request({"name": "a", "args": [1]})
    assert not is_tool_exec_request({"name": "a", "other": 1})
    assert not is_tool_exec_request(["a"])


def test_descriptors_of_host_tools_and_bad_descriptors() -> None:
    @tool(approval=True)
    def greet(who: str) -> str:
        """Say hello."""
        return f"hello {who}"

    [d] = tool_descriptors([greet])
    assert d["name"] == "greet" and d["description"] == "Say hello." and d["approval"]
    assert d["inputSchema"]["properties"]["who"]["type"] == "string"
    with pytest.raises(ToolArgumentsError, match="#0 needs a non-empty 'name'"):
        parse_descriptors([{"description": "x"}])
    with pytest.raises(ToolArgumentsError, match="object schema"):
        parse_descriptors([{"name": "a", "inputSchema": {"type": "string"}}])
    with pytest.raises(ToolArgumentsError, match="JSON array"):
        parse_descriptors({"name": "a"})


# ---------------------------------------------------------------- host side


calls: list[str] = []


@tool
def echo(text: str) -> dict[str, str]:
    calls.append(text)
    return {"echo": text}


@tool
def boom() -> None:
    raise RuntimeError("kaput")


@tool(approval=True)
def risky() -> str:
    calls.append("risky")
    return "done"


@tool
async def slow() -> str:
    await anyio.sleep(30)
    return "late"


@pytest.mark.anyio
async def test_execute_host_tool() -> None:
    ts = Toolset([echo, risky, slow])
    assert await execute_host_tool(ts, {"name": "echo", "args": {"text": "hi"}}) == {
        "echo": "hi"}
    with pytest.raises(UnknownToolError):
        await execute_host_tool(ts, {"name": "nope", "args": {}})
    with pytest.raises(ToolArgumentsError, match="JSON object"):
        await execute_host_tool(ts, {"nam": "echo"})
    with pytest.raises(ToolArgumentsError, match="text"):
        await execute_host_tool(ts, {"name": "echo", "args": {}})
    before = len(calls)
    with pytest.raises(ToolDeniedError, match="no approval channel"):
        await execute_host_tool(ts, {"name": "risky"})
    assert len(calls) == before
    with anyio.fail_after(5), pytest.raises(ToolTimeoutError, match="0.2s"):
        await execute_host_tool(ts, {"name": "slow"}, timeout=0.2)


# ---------------------------------------------------------------- scripted HTTP server


class Scripted(BaseHTTPRequestHandler):
    mode = "ok"
    seen: list[tuple[str, dict[str, Any]]] = []
    release = threading.Event()

    def log_message(self, *a: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        if status == 302:
            self.send_header("location", "/elsewhere")
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        n = int(self.headers.get("content-length", 0))
        body = json.loads(self.rfile.read(n))
        Scripted.seen.append((self.headers.get("authorization", ""), body))
        m = Scripted.mode
        if m == "ok":
            self._send(200, json.dumps({"result": {"got": body["args"]}}).encode())
        elif m == "401":
            self._send(401, b'{"error": {"message": "missing or wrong bearer token"}}')
        elif m == "404":
            self._send(404, b'{"error": {"message": "unknown host tool"}}')
        elif m == "500":
            self._send(500, b"internal trouble", "text/plain")
        elif m == "badjson":
            self._send(200, b"{not json")
        elif m == "shape":
            self._send(200, b'{"value": 1}')
        elif m == "302":
            self._send(302, b"")
        elif m == "hang":
            Scripted.release.wait(10)
            self._send(200, b'{"result": null}')


@pytest.fixture
def scripted() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    Scripted.seen = []
    Scripted.release = threading.Event()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/exec"
    finally:
        Scripted.release.set()
        srv.shutdown()
        srv.server_close()
        t.join(5)


@pytest.mark.anyio
async def test_http_executor_success_sends_token_and_body(scripted: str) -> None:
    Scripted.mode = "ok"
    ex = HttpToolExecutor(scripted, "tok-123")
    stubs = remote_tool_stubs([{"name": "t1"}], ex)
    assert await stubs.call("t1", {"a": [1, 2]}) == {"got": {"a": [1, 2]}}
    assert Scripted.seen == [("Bearer tok-123", {"name": "t1", "args": {"a": [1, 2]}})]
    assert "tok-123" not in repr(ex)


@pytest.mark.anyio
@pytest.mark.parametrize(("mode", "exc", "text"), [
    ("401", RemoteToolRejected, "HTTP 401: missing or wrong bearer token"),
    ("404", RemoteToolRejected, "HTTP 404: unknown host tool"),
    ("500", RemoteToolServerError, "HTTP 500: internal trouble"),
    ("badjson", RemoteToolBadResponse, "not JSON"),
    ("shape", RemoteToolBadResponse, "'result' field"),
    ("302", RemoteToolBadResponse, "unexpected HTTP 302"),
])
async def test_http_executor_failures(scripted: str, mode: str, exc: type[Exception],
                                      text: str) -> None:
    Scripted.mode = mode
    with pytest.raises(exc, match=text) as e:
        await HttpToolExecutor(scripted, "tok").execute("t1", {})
    assert "'t1'" in str(e.value)
    if isinstance(e.value, (RemoteToolRejected, RemoteToolServerError)):
        assert e.value.status == int(mode)


@pytest.mark.anyio
async def test_http_executor_timeout(scripted: str) -> None:
    Scripted.mode = "hang"
    with anyio.fail_after(10), pytest.raises(RemoteToolTimeout, match="within 0.3s"):
        await HttpToolExecutor(scripted, "tok", timeout=0.3).execute("t1", {})


@pytest.mark.anyio
async def test_http_executor_connection_refused(tmp_path: Path) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(RemoteToolUnreachable, match="cannot reach"):
        await HttpToolExecutor(f"http://127.0.0.1:{port}/", "tok").execute("t1", {})
    with pytest.raises(RemoteToolUnreachable):
        await HttpToolExecutor("http://corral/", "tok", transport=httpx.AsyncHTTPTransport(
            uds=str(tmp_path / "absent.sock"))).execute("t1", {})


# ---------------------------------------------------------------- real host endpoint


@pytest.mark.anyio
async def test_http_executor_against_host_endpoint_on_unix_socket(tmp_path: Path) -> None:
    token = secrets.token_hex(24)
    ts = Toolset([echo, boom, risky])
    app = tool_exec_app(ts, token=token, max_body=2000)
    sock = tmp_path / "exec.sock"

    def ex(tok: str = token) -> HttpToolExecutor:
        return HttpToolExecutor("http://corral/", tok, timeout=10,
                                transport=httpx.AsyncHTTPTransport(uds=str(sock)))

    async with anyio.create_task_group() as tg:
        await tg.start(serve_unix, app, sock)
        with anyio.fail_after(20):
            calls.clear()
            assert await ex().execute("echo", {"text": "hi"}) == {"echo": "hi"}
            assert calls == ["hi"]
            with pytest.raises(RemoteToolRejected) as e:
                await ex("x" * 48).execute("echo", {"text": "no"})
            assert e.value.status == 401
            with pytest.raises(RemoteToolRejected) as e:
                await ex().execute("echo", {"text": "y" * 5000})
            assert e.value.status == 413
            with pytest.raises(RemoteToolRejected, match="unknown host tool 'nope'") as e:
                await ex().execute("nope", {})
            assert e.value.status == 404
            with pytest.raises(RemoteToolRejected, match="text") as e:
                await ex().execute("echo", {"txt": 1})
            assert e.value.status == 422
            with pytest.raises(RemoteToolRejected, match="approval") as e:
                await ex().execute("risky", {})
            assert e.value.status == 403
            with pytest.raises(RemoteToolServerError, match="RuntimeError: kaput"):
                await ex().execute("boom", {})
            assert calls == ["hi"]  # refused calls never ran
            assert app.refused == 2
        tg.cancel_scope.cancel()
    assert not sock.exists()
