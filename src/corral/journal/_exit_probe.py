"""Did a run's agent exit? Answered from its journal's tail only, without a run record.

This is what makes the reaper safe: after a viewer leaves nothing appends to the event log,
so the log cannot say whether the agent finished; the journal keeps growing and ends with
the supervisor's exit sentinel once it did. The probe reads only the end of the journal and
never drives the run, writes, or closes anything.

Where a run's journal is comes from a small mapping its starter records (the Runner keeps it
as ``record.journal``; :func:`locate_journal` reads it):

- ``dir``: the host-private directory holding the run's journal files
  (:class:`corral.journal._layout.JournalPaths`, named after the run id);
- ``nonce``: the run's sentinel nonce (32 lowercase hex characters);
- ``host`` (optional): the machine id (:func:`machine_id`) of the host that wrote it. A run
  is visible to every host sharing the store, but its journal only where the provider keeps
  it: a host that finds no journal at ``dir`` and is not that machine cannot tell "never
  started" from "elsewhere", so it says so (:class:`JournalUnreachable`) and touches
  nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

import anyio.to_thread

from corral._errors import CorralError
from corral.journal._layout import JournalPaths
from corral.journal._reader import probe_journal_tail
from corral.journal._sentinel import normalize_nonce

__all__ = [
    "JournalLocationError",
    "JournalUnreachable",
    "ProbeResult",
    "check_here",
    "journal_entry",
    "locate_journal",
    "machine_id",
    "probe_exit",
]


class JournalLocationError(CorralError):
    """A run does not say where its journal is (or says it malformed)."""


class JournalUnreachable(JournalLocationError):
    """The run's journal lives on another machine and is not visible from this one."""


@cache
def machine_id() -> str:
    """This machine's stable id (``/etc/machine-id``; the hostname where there is none).
    Unlike the boot id it survives reboots, as journals on disk do."""
    for candidate in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            text = Path(candidate).read_text().strip()
        except OSError:
            continue
        if text:
            return text
    return "host:" + os.uname().nodename


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """What an out-of-band look at a run's journal learned.

    Three states, not a boolean: "could not tell" must not read as "still working" (only
    one of them is something an operator should see), and never as "finished". ``elsewhere``
    is "could not tell, and must not act": the journal is on another host. ``not-started`` is for a run whose starter provably died before it launched the
    agent: there is nothing to wait for, the run is claimed and ended like a finished one
    (its drive, under the claim, decides how); so is ``gone``, a run whose sandbox (holding
    its journal) vanished.
    """

    state: Literal["finished", "producing", "unknown", "not-started", "elsewhere", "gone"]
    exit_code: int | None = None
    error: str | None = None

    @classmethod
    def finished(cls, exit_code: int) -> ProbeResult:
        return cls("finished", exit_code=exit_code)

    @classmethod
    def producing(cls) -> ProbeResult:
        return cls("producing")

    @classmethod
    def unknown(cls, error: str) -> ProbeResult:
        return cls("unknown", error=error)

    @classmethod
    def not_started(cls, reason: str) -> ProbeResult:
        return cls("not-started", error=reason)

    @classmethod
    def gone(cls, reason: str) -> ProbeResult:
        """The run's sandbox (which held its journal) no longer exists and the journal's
        copy here has no exit: nothing will ever come, so the run is claimed and ended
        like a finished one (its drive, under the claim, says the sandbox is gone)."""
        return cls("gone", error=reason)

    @classmethod
    def elsewhere(cls, reason: str) -> ProbeResult:
        """The journal is on another host (:class:`JournalUnreachable`), or the run's
        harness is not installed in this process: only a host that has both can tell, or
        stop the agent; here nothing may be decided, expiry included."""
        return cls("elsewhere", error=reason)


def journal_entry(info: Mapping[str, Any] | None, run_id: str) -> tuple[str, str]:
    """The journal directory and nonce of run ``run_id`` from its journal mapping (keys
    ``dir``, ``nonce``), checked. Raises :class:`JournalLocationError` naming what is
    missing or malformed."""
    if info is None:
        raise JournalLocationError(
            f"run {run_id!r} has no journal in its record; it was not started as a "
            "durable run, so nobody can tell whether its agent finished"
        )
    directory = info.get("dir")
    nonce = info.get("nonce")
    if not isinstance(directory, str) or not directory or not os.path.isabs(directory):
        raise JournalLocationError(
            f"run {run_id!r}: journal.dir must be an absolute directory path, "
            f"got {directory!r}"
        )
    if not isinstance(nonce, str):
        raise JournalLocationError(f"run {run_id!r}: journal.nonce is missing")
    try:
        normalize_nonce(nonce)
    except ValueError as exc:
        raise JournalLocationError(f"run {run_id!r}: journal.nonce: {exc}") from None
    return directory, nonce


def check_here(info: Mapping[str, Any], paths: JournalPaths, run_id: str) -> None:
    """Raise :class:`JournalUnreachable` when the journal at ``paths`` was written by
    another machine (``info["host"]``) and this one sees none of it."""
    host = info.get("host")
    if (isinstance(host, str) and host != machine_id()
            and not (paths.journal.exists() or paths.status.exists())):
        # (Not "is the directory there": another host may have the same path for its own.)
        raise JournalUnreachable(
            f"run {run_id!r}: its journal is on another host (machine id {host[:12]}…, "
            f"directory {info.get('dir')}), which this host cannot reach; attach to, cancel "
            "or reap this run from that host, or give the hosts a shared journals directory"
        )


def locate_journal(info: Mapping[str, Any] | None, run_id: str) -> tuple[JournalPaths, str]:
    """The journal paths and nonce of run ``run_id`` from its journal mapping
    (:func:`journal_entry`), when this host can read them (:func:`check_here`)."""
    directory, nonce = journal_entry(info, run_id)
    paths = JournalPaths.for_run(directory, run_id)
    assert info is not None  # journal_entry refused None
    check_here(info, paths, run_id)
    return paths, nonce


async def probe_exit(
    paths: JournalPaths,
    nonce: str,
    *,
    max_bytes: int = 65536,
    recent: float = 30.0,
) -> ProbeResult:
    """``finished`` with the agent's exit code when the journal ends with its exit
    sentinel; ``producing`` while the supervisor is alive or the journal changed within
    ``recent`` seconds; otherwise ``unknown`` with the reason. Any failure is ``unknown``,
    never ``finished``; it never raises.
    """
    try:
        # A local file read, but possibly on slow storage: keep it off the event loop.
        probe = await anyio.to_thread.run_sync(
            lambda: probe_journal_tail(paths, nonce, max_bytes=max_bytes, recent=recent)
        )
    except Exception as exc:  # noqa: BLE001 - a probe never raises
        return ProbeResult.unknown(f"probing the journal failed: {exc}")
    if probe.state == "finished" and probe.code is not None:
        return ProbeResult.finished(probe.code)
    if probe.state == "producing":
        return ProbeResult.producing()
    return ProbeResult.unknown(probe.reason or "the journal probe could not tell")
