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

Only the run's own sandbox may use its proxy: with a ``token``, every request must carry
``Proxy-Authorization: Basic`` credentials whose password is the run's token (the sandbox's
proxy URL is ``http://corral:<token>@127.0.0.1:<port>``, and clients send what the URL
holds). Anything else gets a ``407`` before the allowlist is even consulted: nothing is
resolved, connected or recorded.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hmac
import ipaddress
import os
import socket
from collections.abc import AsyncIterator, Sequence
from urllib.parse import urlsplit

import anyio
import anyio.abc
import httpx

from corral._errors import ConfigError
from corral.net._http11 import Request, Response, serve_unix, text_response
from corral.net._model_proxy import HOP_BY_HOP, shared_ssl_context

from corral.policy._allowlist import (
    AllowRule,
    IPAddress,
    ip_of,
    non_public,
    parse_allowlist,
    split_host_port,
)

__all__ = ["AllowRule", "EgressProxy", "parse_allowlist"]

_NEED_TOKEN = (b"corral egress proxy: this request does not carry this run's proxy "
               b"credentials; only the run's own sandbox may use its egress proxy\n")

class EgressProxy:
    """An allowlisting HTTP/HTTPS proxy (see the module docstring)."""

    def __init__(self, allow: Sequence[str] | Sequence[AllowRule], *,
                 connect_timeout: float = 10.0, token: str | None = None) -> None:
        """``token``: the run's token, the password the sandbox's proxy URL carries;
        ``None``: every client that can connect to the socket is served."""
        if token is not None and (len(token) < 16 or not token.isascii()
                                  or not token.isprintable()):
            raise ConfigError("the egress proxy's run token must be at least 16 printable "
                              "ASCII characters")
        self._token = token.encode() if token is not None else None
        self.unauthorized = 0
        """Requests refused for want of the run's token."""
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
        resolved = "is" if ip_of(host) is not None else f"resolves to {ip},"
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
        literal = ip_of(host)
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
                ip = ip_of(str(sockaddr[0]).split("%")[0])
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

    def _authorized(self, request: Request) -> bool:
        if self._token is None:
            return True
        auth = request.header("proxy-authorization") or ""
        scheme, _, cred = auth.strip().partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(cred.strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        _user, _, password = decoded.partition(b":")
        return hmac.compare_digest(password, self._token)

    async def handle(self, request: Request) -> Response:
        if not self._authorized(request):
            self.unauthorized += 1
            return Response(407, [("proxy-authenticate", 'Basic realm="corral"'),
                                  ("content-type", "text/plain; charset=utf-8"),
                                  ("content-length", str(len(_NEED_TOKEN)))], _NEED_TOKEN)
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
            host, port_s = split_host_port(request.target.lower())
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
