"""Egress allowlists: ``host[:port]`` entries, parsed and matched, and which addresses are
no public destination. Pure data, so a definition's policy validates its allowlist without
the proxy that enforces it (``corral.net``)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

from corral._errors import ConfigError

__all__ = ["AllowRule", "IPAddress", "IPNetwork", "ip_of", "non_public", "parse_allowlist", "split_host_port"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_HOST_RE = re.compile(r"^(\*\.)?[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$")
_IPV4_RE = re.compile(r"^\d{1,3}(\.\d{1,3}){3}(/\d{1,2})?$")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")


def ip_of(host: str) -> IPAddress | None:
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
            ip = ip_of(host)
            return ip is not None and ip in self.network
        host = host.lower().rstrip(".")
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and len(host) > len(self.host) - 1
        return host == self.host

    def names_address(self, ip: IPAddress, port: int) -> bool:
        """The entry names ``ip`` itself (as an IP literal or network) for ``port``."""
        return (self.network is not None and ip in self.network
                and (self.ports is None or port in self.ports))


def split_host_port(entry: str) -> tuple[str, str | None]:
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
            host, port_s = split_host_port(raw)
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
