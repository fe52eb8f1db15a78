"""Claim owner ids that say where the driver lives, so a dead local driver is noticed fast.

An owner id is ``drv:<boot id>:<pid>:<process start ticks>:<random>``. A host that reads
another driver's owner id can tell whether that driver was on this same machine (same boot
id) and, if so, whether its process is still alive (pid plus start time, so a reused pid is
not mistaken for it). Owners on other machines are never judged: their lease must lapse.
"""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corral.stores._records import RunRecord


@cache
def boot_id() -> str:
    """This machine's boot id (changes at every reboot)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")
    except OSError:
        return "unknown"


def _start_ticks(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    rest = raw[raw.rfind(b")") + 2 :].split()
    try:
        if rest[0] in (b"Z", b"X"):
            return None  # a zombie is dead for our purposes
        return int(rest[19])
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class OwnerId:
    boot: str
    pid: int
    start: int
    token: str

    def __str__(self) -> str:
        return f"drv:{self.boot}:{self.pid}:{self.start}:{self.token}"

    @classmethod
    def parse(cls, text: str) -> OwnerId | None:
        parts = text.split(":")
        if len(parts) != 5 or parts[0] != "drv":
            return None
        try:
            return cls(parts[1], int(parts[2]), int(parts[3]), parts[4])
        except ValueError:
            return None


def new_owner_id() -> str:
    """An owner id for a driver living in this process."""
    pid = os.getpid()
    return str(OwnerId(boot_id(), pid, _start_ticks(pid) or 0, secrets.token_hex(4)))


def owner_is_dead(owner: str | None) -> bool:
    """True only when ``owner`` provably was a process on this machine that no longer runs."""
    if not owner:
        return False
    parsed = OwnerId.parse(owner)
    if parsed is None or parsed.boot != boot_id() or parsed.boot == "unknown":
        return False
    return _start_ticks(parsed.pid) != parsed.start


def driver_gone(record: RunRecord, now: float | None = None) -> bool:
    """True when nobody holds a live lease on the run, or its holder provably died here."""
    at = time.time() if now is None else now
    if not record.lease_live(at):
        return True
    return owner_is_dead(record.claim_owner)
