"""The egress proxy: a sandbox's only way out, limited to an allowlist of host[:port].

A sandbox with egress still has no network of its own; ``HTTP_PROXY``/``HTTPS_PROXY``
inside point at ``127.0.0.1:<port>``, which the in-sandbox forwarder pipes to a unix socket
where an :class:`EgressProxy` serves on the host. It accepts ``CONNECT host:port`` (HTTPS
and any TCP protocol) and plain ``http://`` requests in absolute form, and only to
destinations the allowlist names. Anything else gets a ``403`` whose body says what was
refused and why, so the agent (and the model) sees a clear refusal.

Allowlist entries: ``host`` (ports 80 and 443), ``host:port``, ``host:*`` (any port), and
``*.domain`` for subdomains (not the domain itself). Hosts are matched case-insensitively
as names or IP literals (``[::1]:8080`` for IPv6); the proxy connects to exactly the
host asked for, and names are resolved on the host.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio
import anyio.abc
import httpx

from corral.errors import ConfigError
from corral.net.http11 import Request, Response, serve_unix, text_response
from corral.net.model_proxy import HOP_BY_HOP, shared_ssl_context

__all__ = ["AllowRule", "EgressProxy", "parse_allowlist"]

_HOST_RE = re.compile(r"^(\*\.)?[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$")
_IPV4_RE = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")


@dataclass(frozen=True, slots=True)
class AllowRule:
    """One allowlist entry."""

    host: str
    """Lower-case name or IP literal; ``*.x`` matches subdomains of ``x``."""
    ports: frozenset[int] | None
    """``None`` = any port."""
    source: str

    def matches(self, host: str, port: int) -> bool:
        host = host.lower().rstrip(".")
        if self.ports is not None and port not in self.ports:
            return False
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and len(host) > len(self.host) - 1
        return host == self.host


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
        is_ip6 = raw.startswith("[")
        if not (is_ip6 or _IPV4_RE.match(host) or _HOST_RE.match(host)):
            raise ConfigError(
                f"egress allowlist entry {entry!r}: {host!r} is not a host name, '*.domain' "
                "or IP address"
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
        rules.append(AllowRule(host, ports, entry))
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
        return any(r.matches(host, port) for r in self.rules)

    def _refuse(self, host: str, port: int) -> Response:
        self.refused.append(f"{host}:{port}")
        allowed = ", ".join(r.source for r in self.rules) or "nothing"
        return text_response(
            403,
            f"corral egress proxy: connections to {host}:{port} are not allowed by this "
            f"sandbox's network policy (allowed: {allowed})\n",
        )

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
        self.allowed.append(f"{host}:{port}")
        return await self._forward_http(request)

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
        try:
            with anyio.fail_after(self.connect_timeout):
                remote = await anyio.connect_tcp(host, port)
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

    async def _forward_http(self, request: Request) -> Response:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(300.0, connect=self.connect_timeout),
                follow_redirects=False, trust_env=False, verify=shared_ssl_context(),
            )
        headers = [(k, v) for k, v in request.headers if k not in HOP_BY_HOP]
        req = self._client.build_request(request.method, request.target, headers=headers,
                                         content=request.body)
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
