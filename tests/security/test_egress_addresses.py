"""The egress allowlist reaches the internet, not the host.

Attack: the egress proxy runs on the host, and it connected to whatever an allowed name
resolved to. ``allow_hosts = ["localhost:*"]`` (or any allowed name that resolves, or is
made to resolve, to 127.0.0.1, 169.254.169.254, 10.x, ...) let the agent reach host-only
services (a database on loopback, the cloud metadata endpoint) through the proxy.

Defence: every address an allowed name resolves to must be public; a loopback,
link-local, private, ULA, unspecified, multicast or other non-global address gets a 403
naming it, unless an allowlist entry names that address or its network as an IP literal.
The proxy then connects to the address it checked (a DNS answer cannot change between
check and connect). Driven here through the real proxy on its unix socket, against a real
listener on the host's 127.0.0.1.
"""

from __future__ import annotations

import ipaddress
import os
import tempfile
from collections.abc import Iterator

from pathlib import Path

import anyio
import pytest

from tests.helpers import HelloServer

from corral._errors import ConfigError
from corral.net._egress import EgressProxy, parse_allowlist

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def host_service() -> Iterator[HelloServer]:
    """A service listening on the host's loopback only."""
    srv = HelloServer("127.0.0.1")
    yield srv
    srv.stop()


def ask(allow: list[str], *requests: str) -> tuple[list[bytes], EgressProxy]:
    """Serve an :class:`EgressProxy` allowing ``allow`` on a unix socket and send it each
    raw request (one connection each); the responses, in order."""
    proxy = EgressProxy(allow)

    async def one(sock: str, data: str) -> bytes:
        async with await anyio.connect_unix(sock) as s:
            await s.send(data.encode())
            out = b""
            with anyio.fail_after(10):
                while True:  # every request says Connection: close
                    try:
                        out += await s.receive()
                    except anyio.EndOfStream:
                        return out

    async def go(sock: str) -> list[bytes]:
        async with anyio.create_task_group() as tg:
            await tg.start(proxy.serve, sock)
            out = [await one(sock, r) for r in requests]
            tg.cancel_scope.cancel()
        return out

    with tempfile.TemporaryDirectory(prefix="ceg-", dir="/tmp") as d:  # short socket path
        return anyio.run(go, os.path.join(d, "e.sock")), proxy


def connect(target: str) -> str:
    return (f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n"
            "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")


def get(authority: str) -> str:
    return (f"GET http://{authority}/ HTTP/1.1\r\nHost: {authority}\r\n"
            "Connection: close\r\n\r\n")


@pytest.mark.parametrize("rule", ["localhost:{port}", "localhost:*", "127.1:{port}",
                                  "2130706433:{port}"])
def test_an_allowed_name_that_resolves_to_loopback_is_refused(
        rule: str, host_service: HelloServer) -> None:
    """``localhost``, and numeric names the resolver turns into 127.0.0.1."""
    port = host_service.server_address[1]
    name = rule.split(":")[0]
    responses, proxy = ask([rule.format(port=port)], connect(f"{name}:{port}"),
                           get(f"{name}:{port}"))
    for resp in responses:
        assert resp.startswith(b"HTTP/1.1 403"), resp
        assert (f"{name} resolves to 127.0.0.1, a loopback address".encode() in resp), resp
        assert f"127.0.0.1:{port}".encode() in resp  # what the operator would have to name
    assert host_service.hits == 0  # type: ignore[attr-defined]
    assert proxy.refused == [f"{name}:{port}"] * 2 and proxy.allowed == []


@pytest.mark.parametrize("rule", ["127.0.0.1:{port}", "127.0.0.0/8:{port}", "127.0.0.1:*",
                                  "[::ffff:127.0.0.1]:{port}"])
def test_an_address_named_literally_is_reached(rule: str,
                                               host_service: HelloServer) -> None:
    """The operator's explicit choice: the address (or its network) itself."""
    port = host_service.server_address[1]
    responses, proxy = ask([rule.format(port=port)], connect(f"127.0.0.1:{port}"),
                           get(f"127.0.0.1:{port}"), connect(f"[::ffff:127.0.0.1]:{port}"))
    for resp in responses:
        assert resp.startswith(b"HTTP/1.1 200") and b"hello from" in resp, resp
    assert host_service.hits == 3  # type: ignore[attr-defined]
    assert proxy.refused == []


def test_a_name_is_allowed_to_the_addresses_named_beside_it(
        host_service: HelloServer) -> None:
    """``localhost:PORT`` with every address it resolves to named: reached, over the
    address checked (plain HTTP keeps the name in its Host header)."""
    import socket

    port = host_service.server_address[1]
    addresses = {ipaddress.ip_address(str(a[4][0]).split("%")[0]) for a in
                 socket.getaddrinfo("localhost", port, type=socket.SOCK_STREAM)}
    named = [f"[{a}]:{port}" if a.version == 6 else f"{a}:{port}" for a in addresses]
    responses, _ = ask([f"localhost:{port}", *named], connect(f"localhost:{port}"),
                       get(f"localhost:{port}"))
    for resp in responses:
        assert resp.startswith(b"HTTP/1.1 200") and b"hello from" in resp, resp


@pytest.mark.parametrize("address, why", [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("0.0.0.0", "unspecified"),
    ("::", "unspecified"), ("169.254.169.254", "link-local"), ("fe80::1", "link-local"),
    ("10.1.2.3", "private"), ("192.168.0.1", "private"), ("172.16.0.1", "private"),
    ("fd00::1", "private"), ("100.100.100.200", "no public"), ("224.0.0.1", "multicast"),
    ("ff02::1", "multicast"), ("::ffff:127.0.0.1", "loopback"),
    ("64:ff9b::a9fe:a9fe", "link-local"), ("2002:7f00:1::", "loopback"),
    ("::7f00:1", "reserved"),
])
def test_non_public_addresses_are_named(address: str, why: str) -> None:
    """Each address class the proxy refuses for a name, including IPv6 forms that carry
    an IPv4 address (mapped, NAT64, 6to4)."""
    from corral.policy._allowlist import non_public

    reason = non_public(ipaddress.ip_address(address))
    assert reason is not None and why in reason, (address, reason)


@pytest.mark.parametrize("address", ["8.8.8.8", "2606:4700::1111", "1.1.1.1"])
def test_public_addresses_pass(address: str) -> None:
    from corral.policy._allowlist import non_public

    assert non_public(ipaddress.ip_address(address)) is None


def test_ip_entries_are_checked_when_read(tmp_path: Path) -> None:
    rules = parse_allowlist(["10.0.0.0/8:5432", "[fd00::/8]:443", "[::1]:9000", "127.0.0.1"])
    proxy = EgressProxy(list(rules))
    assert proxy.allows("10.9.9.9", 5432) and not proxy.allows("11.0.0.1", 5432)
    assert proxy.allows("fd12::3", 443) and proxy.allows("0:0::1", 9000)
    assert proxy.allows("127.0.0.1", 80) and not proxy.allows("127.0.0.1", 8080)
    for bad in ["10.0.0.1/8", "999.1.1.1", "[nonsense]:80", "10.0.0.0/33:80"]:
        with pytest.raises(ConfigError, match="egress allowlist entry"):
            parse_allowlist([bad])
