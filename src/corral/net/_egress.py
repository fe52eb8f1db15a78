"""The egress proxy: a sandbox's only way out, limited to an allowlist of host[:port].

A sandbox with egress still has no network of its own; ``HTTP_PROXY``/``HTTPS_PROXY``
inside point at ``127.0.0.1:<port>``, which the in-sandbox forwarder pipes to a unix socket
where an :class:`EgressProxy` serves on the host. It accepts ``CONNECT host:port`` (HTTPS
and any TCP protocol) and plain ``http://`` requests in absolute form, and only to
destinations the allowlist names. Anything else gets a ``403`` whose body says what was
refused and why, so the agent (and the model) sees a clear refusal.

Allowlist entries: ``host`` (ports 80 and 443), ``host:port``, ``host:*`` (any port), and
``*.domain`` for subdomains (not the domain itself). Hosts are matched case-insensitively
as names, or as IP addresses and networks: ``10.0.0.5:8080``, ``10.0.0.0/8:5432``,
``[::1]:8080`` and ``[fd00::/8]:443`` for IPv6.

The proxy runs on the host, so an allowed *name* must not become a way to the host's own
services or its network's: names are resolved on the host, and every address a name
resolves to must be a public one. Loopback, link-local (cloud metadata at
169.254.169.254), unspecified, multicast, private, ULA, shared (100.64.0.0/10) and other
non-global addresses are refused with a 403 saying so, unless an allowlist entry names
that address or a network holding it as an IP literal (the operator's explicit choice):
``localhost:8080`` reaches nothing; ``localhost:8080`` with ``127.0.0.1:8080``, or
``127.0.0.1:8080`` alone, reaches the host's port 8080. The proxy then connects to the
address it checked, never to the name again, so a DNS answer that changes between the
check and the connection (a rebind) cannot slip through.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import socket
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio
import anyio.abc
import httpx

from corral._errors import ConfigError
from corral.net._http11 import Request, Response, serve_unix, text_response
from corral.net._model_proxy import HOP_BY_HOP, shared_ssl_context

__all__ = ["AllowRule", "EgressProxy", "parse_allowlist"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_HOST_RE = re.compile(r"^(\*\.)?[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$")
_IPV4_RE = re.compile(r"^\d{1,3}(\.\d{1,3}){3}(/\d{1,2})?$")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")


def _ip(host: str) -> IPAddress | None:
    """``host`` as an IP address (IPv4-mapped IPv6 as its IPv4), or ``None`` for a name."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def non_public(ip: IPAddress) -> str | None:
    """Why ``ip`` is no public destination (``"a loopback address"``, ...), or ``None``.

    IPv6 forms that carry an IPv4 address (mapped, 6to4, NAT64) are judged by it."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            return non_public(embedded)
        if ip in _IPV4_COMPATIBLE and not ip.is_unspecified and not ip.is_loopback:
            return "a reserved address"
    for test, what in ((ip.is_unspecified, "an unspecified address"),
                       (ip.is_loopback, "a loopback address"),
                       (ip.is_link_local, "a link-local address"),
                       (ip.is_multicast, "a multicast address"),
                       (ip.is_private, "a private address"),
                       (not ip.is_global, "no public address")):
        if test:
            return what
    return None


@dataclass(frozen=True, slots=True)
class AllowRule:
    """One allowlist entry."""

    host: str
    """Lower-case name or IP literal; ``*.x`` matches subdomains of ``x``."""
    ports: frozenset[int] | None
    """``None`` = any port."""
    source: str
    network: IPNetwork | None = None
    """The addresses an IP-literal entry names (one address, or a network)."""

    def matches(self, host: str, port: int) -> bool:
        """The entry allows asking for ``host:port`` (a name, or an IP literal)."""
        if self.ports is not None and port not in self.ports:
            return False
        if self.network is not None:
            ip = _ip(host)
            return ip is not None and ip in self.network
        host = host.lower().rstrip(".")
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and len(host) > len(self.host) - 1
        return host == self.host

    def names_address(self, ip: IPAddress, port: int) -> bool:
        """The entry names ``ip`` itself (as an IP literal or network) for ``port``."""
        return (self.network is not None and ip in self.network
                and (self.ports is None or port in self.ports))


def _split_host_port(entry: str) -> tuple[str, str | None]:
    if entry.startswith("["):
        end = entry.find("]")
        if end < 0:
            raise ValueError("unclosed '['")
        host, rest = entry[1:end], entry[end + 1 :]
        if rest and not rest.startswith(":"):
            raise ValueError("junk after ']'")
        return host, rest[1:] if rest else None
    if entry.count(":") == 1:
        host, port = entry.split(":")
        return host, port
    if ":" in entry:
        raise ValueError("IPv6 addresses must be written in brackets: [::1]:443")
    return entry, None


def parse_allowlist(entries: Iterable[str]) -> tuple[AllowRule, ...]:
    """Parse allowlist entries; raises :class:`ConfigError` naming a bad entry."""
    if isinstance(entries, str):
        raise ConfigError("the egress allowlist must be a list of 'host[:port]' strings")
    rules: list[AllowRule] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, str) or not entry.strip():
            raise ConfigError(f"egress allowlist entry {i} must be a non-empty string")
        raw = entry.strip().lower()
        try:
            host, port_s = _split_host_port(raw)
        except ValueError as exc:
            raise ConfigError(f"egress allowlist entry {entry!r}: {exc}") from None
        network: IPNetwork | None = None
        if raw.startswith("[") or _IPV4_RE.match(host):
            try:
                network = ipaddress.ip_network(host)
            except ValueError as exc:
                raise ConfigError(f"egress allowlist entry {entry!r}: {exc}") from None
            if isinstance(network, ipaddress.IPv6Network) and network.prefixlen == 128:
                mapped = network.network_address.ipv4_mapped
                if mapped is not None:  # judged as the IPv4 address it is
                    network = ipaddress.IPv4Network(mapped)
            host = str(network.network_address if network.num_addresses == 1 else network)
        elif not _HOST_RE.match(host):
            raise ConfigError(
                f"egress allowlist entry {entry!r}: {host!r} is not a host name, '*.domain', "
                "IP address or network"
            )
        ports: frozenset[int] | None
        if port_s is None:
            ports = frozenset({80, 443})
        elif port_s == "*":
            ports = None
        elif port_s.isdigit() and 0 < int(port_s) < 65536:
            ports = frozenset({int(port_s)})
        else:
            raise ConfigError(f"egress allowlist entry {entry!r}: bad port {port_s!r}")
        rules.append(AllowRule(host, ports, entry, network))
    return tuple(rules)


class EgressProxy:
    """An allowlisting HTTP/HTTPS proxy (see the module docstring)."""

    def __init__(self, allow: Sequence[str] | Sequence[AllowRule], *,
                 connect_timeout: float = 10.0) -> None:
        self.rules: tuple[AllowRule, ...] = (
            tuple(r for r in allow if isinstance(r, AllowRule))
            if allow and all(isinstance(r, AllowRule) for r in allow)
            else parse_allowlist([str(r) for r in allow])
        )
        self.connect_timeout = connect_timeout
        self.refused: list[str] = []
        """Destinations refused so far (``host:port``), for reports."""
        self.allowed: list[str] = []
        self._client: httpx.AsyncClient | None = None

    def allows(self, host: str, port: int) -> bool:
        """The allowlist lets the agent ask for ``host:port`` (before any resolution)."""
        return any(r.matches(host, port) for r in self.rules)

    def _refuse(self, host: str, port: int) -> Response:
        self.refused.append(f"{host}:{port}")
        allowed = ", ".join(r.source for r in self.rules) or "nothing"
        return text_response(
            403,
            f"corral egress proxy: connections to {host}:{port} are not allowed by this "
            f"sandbox's network policy (allowed: {allowed})\n",
        )

    def _refuse_address(self, host: str, port: int, ip: IPAddress, why: str) -> Response:
        self.refused.append(f"{host}:{port}")
        resolved = "is" if _ip(host) is not None else f"resolves to {ip},"
        return text_response(
            403,
            f"corral egress proxy: connections to {host}:{port} are not allowed: {host} "
            f"{resolved} {why}, which this sandbox's network policy does not name (only an "
            f"entry with the address itself, such as {_literal(ip)}:{port}, allows it)\n",
        )

    async def _destination(self, host: str, port: int) -> list[IPAddress] | Response:
        """The addresses to connect to for an allowed ``host:port``, each checked; or the
        response refusing it (a non-public address the allowlist does not name, or a
        name that does not resolve)."""
        literal = _ip(host)
        if literal is not None:
            found = [literal]
        else:
            try:
                with anyio.fail_after(self.connect_timeout):
                    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except (OSError, TimeoutError) as exc:
                return text_response(502, f"corral egress proxy: cannot resolve {host}: "
                                          f"{exc}\n")
            found = []
            for _family, _type, _proto, _name, sockaddr in infos:
                ip = _ip(str(sockaddr[0]).split("%")[0])
                if ip is not None and ip not in found:
                    found.append(ip)
            if not found:
                return text_response(502, f"corral egress proxy: cannot resolve {host}\n")
        # Every address is checked, not only the first: which one a client would end up
        # on is not ours to guess, and a name that points at both the internet and the
        # host is refused outright.
        for ip in found:
            why = non_public(ip)
            if why is not None and not any(r.names_address(ip, port) for r in self.rules):
                return self._refuse_address(host, port, ip, why)
        return found

    async def serve(self, socket_path: str | os.PathLike[str], *,
                    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                    ) -> None:
        """Serve on a unix socket until cancelled (``task_status.started()`` once bound)."""
        try:
            await serve_unix(socket_path, self.handle, task_status=task_status)
        finally:
            with anyio.CancelScope(shield=True):
                if self._client is not None:
                    await self._client.aclose()
                    self._client = None

    async def handle(self, request: Request) -> Response:
        if request.method == "CONNECT":
            return await self._connect(request)
        parts = urlsplit(request.target)
        if parts.scheme != "http" or not parts.hostname:
            return text_response(
                400,
                "corral egress proxy: send absolute http:// URLs, or CONNECT for https\n",
            )
        try:
            port = parts.port or 80
        except ValueError:
            return text_response(400, "corral egress proxy: bad port in URL\n")
        host = parts.hostname
        if not self.allows(host, port):
            return self._refuse(host, port)
        addresses = await self._destination(host, port)
        if isinstance(addresses, Response):
            return addresses
        self.allowed.append(f"{host}:{port}")
        # To the checked address, not the name (httpx would resolve it again); the
        # request keeps its Host header, so the server sees the name asked for.
        return await self._forward_http(request, addresses[0])

    async def _connect_checked(self, addresses: Sequence[IPAddress], port: int
                               ) -> anyio.abc.SocketStream:
        """A TCP connection to the first of ``addresses`` that answers, within the
        connect timeout (the addresses, not a name: nothing is resolved again)."""
        error: Exception = OSError("no address")
        with anyio.fail_after(self.connect_timeout):
            for ip in addresses:
                try:
                    return await anyio.connect_tcp(str(ip), port)
                except OSError as exc:
                    error = exc
        raise error

    async def _connect(self, request: Request) -> Response:
        try:
            host, port_s = _split_host_port(request.target.lower())
            port = int(port_s or "")
            if not 0 < port < 65536:
                raise ValueError
        except ValueError:
            return text_response(400, f"corral egress proxy: bad CONNECT target "
                                      f"{request.target!r}; use host:port\n")
        if not self.allows(host, port):
            return self._refuse(host, port)
        addresses = await self._destination(host, port)
        if isinstance(addresses, Response):
            return addresses
        try:
            remote = await self._connect_checked(addresses, port)
        except (OSError, TimeoutError) as exc:
            return text_response(502, f"corral egress proxy: cannot connect to "
                                      f"{host}:{port}: {exc}\n")
        self.allowed.append(f"{host}:{port}")

        async def tunnel(client: anyio.abc.ByteStream, early: bytes) -> None:
            async with remote:
                if early:
                    await remote.send(early)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_pipe, client, remote)
                    tg.start_soon(_pipe, remote, client)

        return Response(200, [], b"", tunnel=tunnel)

    async def _forward_http(self, request: Request, ip: IPAddress) -> Response:
        """Forward a plain-HTTP request to ``ip`` (checked), streaming the answer back."""
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(300.0, connect=self.connect_timeout),
                follow_redirects=False, trust_env=False, verify=shared_ssl_context(),
            )
        headers = [(k, v) for k, v in request.headers if k not in HOP_BY_HOP]
        url = httpx.URL(request.target)
        if not any(k.lower() == "host" for k, _ in headers):
            headers.append(("host", url.netloc.decode("ascii")))
        req = self._client.build_request(request.method, url.copy_with(host=str(ip)),
                                         headers=headers, content=request.body)
        try:
            resp = await self._client.send(req, stream=True)
        except httpx.HTTPError as exc:
            return text_response(502, f"corral egress proxy: {exc.__class__.__name__}: {exc}\n")
        out = [(k, v) for k, v in resp.headers.multi_items()
               if k.lower() not in HOP_BY_HOP and k.lower() != "content-encoding"]

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in resp.aiter_bytes():
                    yield chunk
            except httpx.HTTPError:
                pass
            finally:
                with anyio.CancelScope(shield=True):
                    await resp.aclose()

        return Response(resp.status_code, out, body())


def _literal(ip: IPAddress) -> str:
    """``ip`` as an allowlist entry writes it (IPv6 in brackets)."""
    return f"[{ip}]" if isinstance(ip, ipaddress.IPv6Address) else str(ip)


async def _pipe(src: anyio.abc.ByteStream, dst: anyio.abc.ByteStream) -> None:
    try:
        while True:
            data = await src.receive(65536)
            await dst.send(data)
    except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError,
            ConnectionError):
        pass
    finally:
        with contextlib.suppress(Exception):
            await dst.send_eof()
