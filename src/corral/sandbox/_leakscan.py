"""Find secret values (and their common encodings) in files on the host.

Used before a snapshot is kept (a snapshot must never hold a secret) and by tests that
scan every byte corral wrote.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from corral.sandbox._redact import variants

__all__ = ["Finding", "scan_bytes", "scan_paths"]

CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class Finding:
    """Where a secret was found: the file and the secret's *name* (never its value)."""

    path: str
    secret: str


Secrets = Mapping[str, str] | Iterable[tuple[str, str]]


def _pattern(secrets: Secrets) -> tuple[re.Pattern[bytes] | None, dict[bytes, str], int]:
    table: dict[bytes, str] = {}
    items = secrets.items() if isinstance(secrets, Mapping) else secrets
    for name, value in items:
        for v in variants(value):
            table.setdefault(v.encode("utf-8"), name)
    if not table:
        return None, table, 0
    ordered = sorted(table, key=len, reverse=True)
    return re.compile(b"|".join(re.escape(o) for o in ordered)), table, len(ordered[0])


def scan_bytes(data: bytes, secrets: Secrets) -> list[str]:
    """Names of the secrets whose values (or encodings) occur in ``data``."""
    pattern, table, _ = _pattern(secrets)
    if pattern is None:
        return []
    return sorted({table[m.group(0)] for m in pattern.finditer(data)})


def scan_paths(paths: Iterable[str | Path], secrets: Secrets) -> list[Finding]:
    """Scan files and directory trees (symlinks are not followed) for secret values."""
    pattern, table, longest = _pattern(secrets)
    if pattern is None:
        return []
    found: list[Finding] = []

    def scan_file(path: str) -> None:
        names: set[str] = set()
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return
        with os.fdopen(fd, "rb") as f:
            carry = b""
            while True:
                chunk = f.read(CHUNK)
                if not chunk:
                    break
                buf = carry + chunk
                names.update(table[m.group(0)] for m in pattern.finditer(buf))
                carry = buf[-(longest - 1) :] if longest > 1 else b""
        found.extend(Finding(path, n) for n in sorted(names))

    for p in paths:
        p = str(p)
        if os.path.isfile(p) and not os.path.islink(p):
            scan_file(p)
            continue
        for dirpath, _dirs, files in os.walk(p):
            for name in files:
                full = os.path.join(dirpath, name)
                if not os.path.islink(full):
                    scan_file(full)
    return found
