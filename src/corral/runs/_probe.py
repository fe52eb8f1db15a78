"""``probe_run_exit``: did a detached run's agent exit? The journal probe
(:mod:`corral.journal._probe`) of the run a record names: its journal's location is the
record's ``journal`` mapping, which the Runner writes when it starts the run."""

from __future__ import annotations

from corral.journal._layout import JournalPaths, encode_run_id
from corral.journal._probe import (
    JournalLocationError,
    JournalUnreachable,
    ProbeResult,
    locate_journal,
    probe_exit,
)
from corral.runs._inside import inside_handle, is_inside, note_exited, refresh_mirror, sandbox_gone
from corral.stores._records import RunRecord

__all__ = ["JournalLocationError", "journal_location", "probe_run_exit"]


def journal_location(record: RunRecord) -> tuple[JournalPaths, str]:
    """The run's journal paths and nonce, from ``record.journal`` (keys ``dir``, ``nonce``).

    Raises :class:`JournalLocationError` naming what is missing.
    """
    return locate_journal(record.journal, record.run_id)


async def probe_run_exit(
    record: RunRecord,
    *,
    max_bytes: int = 65536,
    recent: float = 30.0,
) -> ProbeResult:
    """:func:`corral.journal._probe.probe_exit` of the run's journal; ``unknown`` when the
    record does not say where its journal is, ``elsewhere`` when it is on another host.
    Never raises, never drives the run."""
    try:
        paths, nonce = journal_location(record)
    except JournalUnreachable as exc:
        return ProbeResult.elsewhere(str(exc))
    except JournalLocationError as exc:
        return ProbeResult.unknown(str(exc))
    gone = None
    if is_inside(record):
        # through the provider's API: copy the journal's end, ask the supervisor
        try:
            handle = await inside_handle(record)
            await refresh_mirror(record, paths, handle)
            if handle is not None:
                status = await handle.supervisor_status(encode_run_id(record.run_id))
                if status.get("state") == "running":
                    return ProbeResult.producing()
            else:
                gone = await sandbox_gone(record)
            await note_exited(paths)
        except Exception as exc:  # noqa: BLE001 - a probe never raises
            return ProbeResult.unknown(f"the sandbox's journal is unreachable: {exc}")
    probe = await probe_exit(paths, nonce, max_bytes=max_bytes, recent=recent)
    if gone is not None and probe.state != "finished":
        # what this host's copy of the journal lacks went with the sandbox
        return ProbeResult.gone(str(gone))
    return probe
