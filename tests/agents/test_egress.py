"""The egress proxy: allowlist parsing and matching, CONNECT and plain HTTP on a unix socket,
and from inside a real bubblewrap sandbox (through the in-sandbox forwarder), with the real
Claude Code CLI running curl."""

from __future__ import annotations

import base64
import json
import os
import threading
from collections.abc import Iterator

from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.helpers import HelloServer
from ag_ui.core import EventType
from hypothesis import given
from hypothesis import strategies as st

from corral._errors import ConfigError
from corral.agents._prepare import NET_MOUNT
from corral.harness._cli_base import entry_argv
from corral.net._egress import EgressProxy, parse_allowlist
from corral.testing._model_script import shell_then_text
from corral.testing._model_server import ModelServer

from .conftest import make_harness, run_agent

pytestmark = pytest.mark.timeout(180)


def serve(host: str) -> tuple[HelloServer, int]:
    srv = HelloServer(host)
    return srv, srv.port


@pytest.fixture
def two_servers() -> Iterator[tuple[str, int, int]]:
    # 127.0.0.2: host loopback, but not the 127.0.0.1 the harness exempts from proxying.
    a, pa = serve("127.0.0.2")
    b, pb = serve("127.0.0.2")
    yield "127.0.0.2", pa, pb
    for s in (a, b):
        s.shutdown()
        s.server_close()


# ---------------------------------------------------------------- allowlist


def test_allowlist_semantics() -> None:
    rules = parse_allowlist(["api.example.com", "*.pkg.dev:443", "10.0.0.5:8080",
                             "[::1]:9000", "anyport.test:*"])
    proxy = EgressProxy(list(rules))
    assert proxy.allows("api.example.com", 443) and proxy.allows("API.example.com.", 80)
    assert not proxy.allows("api.example.com", 8443)
    assert proxy.allows("x.pkg.dev", 443) and proxy.allows("a.b.pkg.dev", 443)
    assert not proxy.allows("pkg.dev", 443) and not proxy.allows("evilpkg.dev", 443)
    assert proxy.allows("10.0.0.5", 8080) and not proxy.allows("10.0.0.5", 80)
    assert proxy.allows("::1", 9000)
    assert proxy.allows("anyport.test", 1) and proxy.allows("anyport.test", 65535)
    assert not proxy.allows("example.com", 443)
    for bad in ["", "a b", "host:0", "host:99999", "host:x", "::1", "[::1", "http://x",
                "ex*ample.com"]:
        with pytest.raises(ConfigError):
            parse_allowlist([bad])
    with pytest.raises(ConfigError):
        parse_allowlist("example.com")  # type: ignore[arg-type]


@given(host=st.from_regex(r"[a-z]{1,8}(\.[a-z]{1,8}){0,2}", fullmatch=True),
       port=st.integers(1, 65535))
def test_property_nothing_is_allowed_by_an_empty_list_and_exact_rules_are_exact(
        host: str, port: int) -> None:
    assert not EgressProxy([]).allows(host, port)
    exact = EgressProxy([f"{host}:{port}"])
    assert exact.allows(host, port)
    assert not exact.allows(host, port % 65535 + 1)
    assert not exact.allows("x" + host, port)


# ---------------------------------------------------------------- on a unix socket


def _short_sock_dir() -> Path:
    d = Path("/tmp") / f"ceg-{os.getpid()}-{threading.get_ident() % 10**5}"
    d.mkdir(exist_ok=True)
    return d


def test_connect_and_plain_http_on_the_socket(two_servers: tuple[str, int, int]) -> None:
    host, allowed, refused = two_servers
    d = _short_sock_dir()
    sock = d / "e.sock"
    proxy = EgressProxy([f"{host}:{allowed}"])

    async def request(data: bytes) -> bytes:
        async with await anyio.connect_unix(str(sock)) as s:
            await s.send(data)
            out = b""
            with anyio.fail_after(10):
                while True:  # every request says Connection: close
                    try:
                        out += await s.receive()
                    except anyio.EndOfStream:
                        return out

    async def go() -> list[bytes]:
        async with anyio.create_task_group() as tg:
            await tg.start(proxy.serve, sock)
            tunnel = await request(
                f"CONNECT {host}:{allowed} HTTP/1.1\r\nHost: {host}:{allowed}\r\n\r\n"
                f"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            plain = await request(f"GET http://{host}:{allowed}/ HTTP/1.1\r\nHost: x\r\n"
                                  "Connection: close\r\n\r\n".encode())
            denied = await request(f"CONNECT {host}:{refused} HTTP/1.1\r\nHost: x\r\n"
                                   "Connection: close\r\n\r\n".encode())
            denied_plain = await request(f"GET http://{host}:{refused}/ HTTP/1.1\r\n"
                                         "Host: x\r\nConnection: close\r\n\r\n".encode())
            tg.cancel_scope.cancel()
        return [tunnel, plain, denied, denied_plain]

    try:
        tunnel, plain, denied, denied_plain = anyio.run(go)
    finally:
        for p in d.iterdir():
            p.unlink()
        d.rmdir()
    assert tunnel.startswith(b"HTTP/1.1 200") and f"hello from {allowed}".encode() in tunnel
    assert plain.startswith(b"HTTP/1.1 200") and f"hello from {allowed}".encode() in plain
    for resp in (denied, denied_plain):
        assert resp.startswith(b"HTTP/1.1 403")
        assert f"connections to {host}:{refused} are not allowed".encode() in resp
    assert proxy.refused == [f"{host}:{refused}", f"{host}:{refused}"]


# ---------------------------------------------------------------- inside bubblewrap


def test_egress_from_inside_a_sandbox(sandbox_factory: Any,
                                      two_servers: tuple[str, int, int]) -> None:
    host, allowed, refused = two_servers
    token = "run-token-" + "x7" * 12
    proxy = EgressProxy([f"{host}:{allowed}"], token=token)
    script = (
        # the proxy URL without the run's token: refused before anything is forwarded
        f"curl -s -m 5 -x http://127.0.0.1:{{corral.port.egress}} http://{host}:{allowed}/;"
        " echo; "
        f"curl -s -m 5 http://{host}:{allowed}/; echo; "
        f"curl -s -m 5 http://{host}:{refused}/; echo; "
        f"curl -s -m 5 -p http://{host}:{allowed}/ && echo tunnel-ok; "
        f"curl -s -m 5 -p http://{host}:{refused}/ || echo tunnel-refused; "
        f"curl -s -m 3 --noproxy '*' http://{host}:{allowed}/ || echo direct-failed"
    )

    async def go() -> Any:
        handle = await sandbox_factory()
        net = next(Path(h) for h, i in handle.state.binds if i == NET_MOUNT)
        async with anyio.create_task_group() as tg:
            await tg.start(proxy.serve, net / "egress-t.sock")
            argv = entry_argv("/usr/bin/python3", ["sh", "-c", script],
                              forward=[{"name": "egress", "port": 0,
                                        "unix": f"{NET_MOUNT}/egress-t.sock"}])
            # the token as the proxy URL's password: curl sends it (Proxy-Authorization)
            px = f"http://corral:{token}@127.0.0.1:{{corral.port.egress}}"
            result = await handle.process.exec(argv, env={"http_proxy": px, "HTTP_PROXY": px},
                                               timeout=90)
            tg.cancel_scope.cancel()
        return result

    result = anyio.run(go)
    out = result.stdout.decode()
    assert f"hello from {allowed}" in out, (out, result.stderr)
    assert f"connections to {host}:{refused} are not allowed by this sandbox's network " \
           "policy" in out
    assert "tunnel-ok" in out and "tunnel-refused" in out
    assert "direct-failed" in out  # no way around the proxy: the sandbox has no network
    assert out.count(f"hello from {allowed}") == 2
    assert "does not carry this run's proxy credentials" in out
    assert proxy.unauthorized == 1


def test_claude_code_sees_the_refusal(sandbox_factory: Any, model_server: ModelServer,
                                      two_servers: tuple[str, int, int]) -> None:
    host, allowed, refused = two_servers
    model_server.script = shell_then_text(
        f"curl -s -m 5 http://{host}:{allowed}/; echo; curl -s -m 5 http://{host}:{refused}/",
        "Fetched: {output}")
    harness = make_harness("claude-code")

    async def go() -> Any:
        handle = await sandbox_factory()
        return await run_agent(harness, handle, "fetch both", model_server,
                               egress=[f"{host}:{allowed}"])

    run = anyio.run(go)
    assert run.terminal.type == EventType.RUN_FINISHED, run.stderr
    out = run.tool_results()[0]
    assert f"hello from {allowed}" in out
    assert f"corral egress proxy: connections to {host}:{refused} are not allowed" in out
    # the model proxy was not routed through the egress proxy (NO_PROXY covers 127.0.0.1)
    assert run.prepared.egress_proxy is not None
    assert run.prepared.egress_proxy.allowed == [f"{host}:{allowed}"]
    assert json.dumps(run.prepared.egress_proxy.refused) == json.dumps([f"{host}:{refused}"])


EGRESS_TOKEN = "egress-token-0123456789abcdef"


@pytest.mark.parametrize("auth", [
    None,
    "Basic " + base64.b64encode(b"corral:wrong-password-0123456789").decode(),
    "Basic " + base64.b64encode(f"corral:{EGRESS_TOKEN}x".encode()).decode(),
    "Basic not base64!",
    f"Bearer {EGRESS_TOKEN}",
    "Basic " + base64.b64encode(EGRESS_TOKEN.encode()).decode(),  # no user:password form
])
@pytest.mark.parametrize("method,target", [("CONNECT", "{host}:{port}"),
                                           ("GET", "http://{host}:{port}/")])
def test_a_request_without_the_runs_proxy_credentials_gets_407_and_goes_nowhere(
        two_servers: tuple[str, int, int], auth: str | None, method: str, target: str
) -> None:
    from corral.net._http11 import Request

    host, allowed, _refused = two_servers
    proxy = EgressProxy([f"{host}:{allowed}"], token=EGRESS_TOKEN)
    headers = [("proxy-authorization", auth)] if auth is not None else []
    resp = anyio.run(proxy.handle, Request(method, target.format(host=host, port=allowed),
                                           headers, b""))
    assert resp.status == 407
    assert ("proxy-authenticate", 'Basic realm="corral"') in resp.headers
    assert proxy.unauthorized == 1 and proxy.allowed == [] and proxy.refused == []
    if method == "GET":  # (a CONNECT's tunnel would need a client to close it)
        good = "Basic " + base64.b64encode(f"any-user:{EGRESS_TOKEN}".encode()).decode()

        async def fetch() -> tuple[int, bytes]:
            r = await proxy.handle(Request(method, target.format(host=host, port=allowed),
                                           [("proxy-authorization", good)], b""))
            if isinstance(r.body, bytes):
                return r.status, r.body
            return r.status, b"".join([c async for c in r.body])

        status, body = anyio.run(fetch)
        assert status == 200 and f"hello from {allowed}".encode() in body
        assert proxy.allowed == [f"{host}:{allowed}"]


@given(st.one_of(st.none(), st.text(max_size=80),
                 st.binary(max_size=60).map(
                     lambda b: "Basic " + base64.b64encode(b).decode()),
                 st.text(max_size=30).map(
                     lambda u: "Basic " + base64.b64encode(
                         f"{u}:{EGRESS_TOKEN[:-1]}".encode()).decode())))
def test_property_only_the_runs_token_as_the_password_passes(auth: str | None) -> None:
    from corral.net._http11 import Request

    proxy = EgressProxy(["example.com"], token=EGRESS_TOKEN)
    headers = [("proxy-authorization", auth)] if auth is not None else []
    assert not proxy._authorized(Request("CONNECT", "example.com:443", headers, b""))
    user = auth or "u"
    good = "Basic " + base64.b64encode(f"{user[:20]}:{EGRESS_TOKEN}".encode()).decode()
    if ":" not in user[:20]:  # (a colon in the user name would move the password)
        assert proxy._authorized(Request("CONNECT", "example.com:443",
                                         [("proxy-authorization", good)], b""))
