"""Secrets kept out of a checkpoint: each file's content scanned (the leak scan's matcher, a
value across two chunks found too), the entries whose name or link target holds a secret,
and the salted fingerprint of the values checked against (never the values)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


from corral.sandbox._redact import Redactor

__all__ = [
    "ContentScanner",
    "Secrets",
    "fingerprint",
    "named_secrets",
    "same_secrets",
    "secret_items",
]

Secrets = Redactor | Mapping[str, str] | Iterable[tuple[str, str]]


def secret_items(secrets: Secrets) -> list[tuple[str, str]]:
    if isinstance(secrets, Redactor):
        return secrets.items()
    if isinstance(secrets, Mapping):
        return [(str(k), str(v)) for k, v in secrets.items()]
    return [(str(k), str(v)) for k, v in secrets]


def fingerprint(items: list[tuple[str, str]], salt: bytes) -> str:
    """``salt:HMAC-SHA256(salt, sorted values)``: equal for equal secret sets, the values
    not recoverable from it (but by guessing: keep secrets high in entropy)."""
    mac = hmac.new(salt, b"\0".join(sorted(v.encode() for _n, v in items)), hashlib.sha256)
    return f"{salt.hex()}:{mac.hexdigest()}"


def same_secrets(scan: str, items: list[tuple[str, str]]) -> bool:
    salt_hex, _, _ = scan.partition(":")
    try:
        salt = bytes.fromhex(salt_hex)
    except ValueError:
        return False
    return bool(salt) and hmac.compare_digest(fingerprint(items, salt), scan)


@dataclass
class ContentScanner:
    """One file's chunks, scanned for secrets before any of them may be stored; the last
    chunk is held back until the next one is scanned (a value across the boundary)."""

    pattern: Any
    table: dict[bytes, str]
    longest: int
    held: list[tuple[str, bytes]] = field(default_factory=list)
    carry: bytes = b""
    found: str | None = None

    def feed(self, data: bytes) -> None:
        if self.pattern is None or self.found is not None:
            return
        buf = self.carry + data
        m = self.pattern.search(buf)
        if m is not None:
            self.found = self.table[m.group(0)]
        self.carry = buf[-(self.longest - 1):] if self.longest > 1 else b""


def named_secrets(listing: Any, pattern: Any) -> set[str]:
    """The listed paths whose name or link target holds a secret, or that lie under one."""
    if pattern is None or not isinstance(listing, dict):
        return set()
    out: set[str] = set()
    for raw in listing.get("entries", ()):
        try:
            path, target = str(raw[0]), raw[6]
        except (IndexError, TypeError, KeyError):
            continue
        parent = path.rpartition("/")[0]
        if parent in out or pattern.search(path.encode("utf-8", "surrogateescape")) or (
                isinstance(target, str)
                and pattern.search(target.encode("utf-8", "surrogateescape"))):
            out.add(path)
    return out
