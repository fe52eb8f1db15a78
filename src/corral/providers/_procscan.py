"""Finding host processes by ancestry or by the sandbox tag in their environment.

``descendants`` walks ``/proc/<pid>/task/<tid>/children`` from the given pid, so its cost
grows with that process tree, not with the host's load; only kernels without
``CONFIG_PROC_CHILDREN`` fall back to reading every process's parent. ``tagged`` reads the
environment of every process on the host: it is the fallback of ``destroy`` where no
cgroup holds a sandbox's processes.
"""

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


_HAS_CHILDREN_FILE = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def _children(pid: int) -> list[int]:
    """Current children of ``pid`` (of any of its threads); [] once it is gone."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
            out.extend(int(c) for c in fh.read().split())
    return out


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (children first), not including ``pid``."""
    out: list[int] = []
    todo = [pid]
    if _HAS_CHILDREN_FILE:
        while todo:
            kids = _children(todo.pop())
            out.extend(kids)
            todo.extend(kids)
        return out
    children: dict[int, list[int]] = {}
    for child, parent in _ppids().items():
        children.setdefault(parent, []).append(child)
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
