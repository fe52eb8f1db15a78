"""Finding host processes by ancestry or by the sandbox tag in their environment."""

from __future__ import annotations

import contextlib
import os

__all__ = ["TOKEN_ENV", "alive", "descendants", "tagged"]

TOKEN_ENV = "CORRAL_SANDBOX_TOKEN"


def _ppids() -> dict[int, int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                raw = fh.read()
        except OSError:
            continue
        # The command name may contain spaces and parentheses: split after the last ')'.
        fields = raw[raw.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            parents[int(entry)] = int(fields[1])
    return parents


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (children first), not including ``pid``."""
    children: dict[int, list[int]] = {}
    for child, parent in _ppids().items():
        children.setdefault(parent, []).append(child)
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def tagged(token: str) -> list[int]:
    """Pids whose environment carries ``CORRAL_SANDBOX_TOKEN=<token>``."""
    needle = f"{TOKEN_ENV}={token}".encode()
    found: list[int] = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        with contextlib.suppress(OSError), open(f"/proc/{entry}/environ", "rb") as fh:
            if needle in fh.read().split(b"\0"):
                found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return False
    return raw[raw.rfind(b")") + 2 :][:1] not in (b"Z", b"X")
