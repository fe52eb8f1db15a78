"""``probe_run_exit``: did a detached run's agent exit? The journal probe
(:mod:`corral.journal._exit_probe`) of the run a record names, asked of its agent site
(:mod:`corral.runs._placement`): its journal's location is the record's ``journal``
mapping, which the Runner writes when it starts the run."""

from __future__ import annotations

from corral.journal._layout import JournalPaths
from corral.journal._exit_probe import JournalLocationError, JournalUnreachable, ProbeResult
from corral.runs._placement import site_of
from corral.runs._site import AgentSite
from corral.stores._records import RunRecord

__all__ = ["JournalLocationError", "journal_location", "journal_site", "probe_run_exit"]


def journal_site(record: RunRecord) -> AgentSite:
    """The run's agent site, when this host can read its journal.

    Raises :class:`JournalLocationError` naming what is missing, and
    :class:`JournalUnreachable` when the journal is on another machine."""
    site = site_of(record)
    site.check_here()
    return site


def journal_location(record: RunRecord) -> tuple[JournalPaths, str]:
    """The run's journal paths and nonce, from ``record.journal`` (keys ``dir``, ``nonce``).

    Raises :class:`JournalLocationError` naming what is missing.
    """
    site = journal_site(record)
    return site.paths, site.nonce


async def probe_run_exit(
    record: RunRecord,
    *,
    max_bytes: int = 65536,
    recent: float = 30.0,
) -> ProbeResult:
    """:func:`corral.journal._exit_probe.probe_exit` of the run's journal; ``unknown`` when the
    record does not say where its journal is, ``elsewhere`` when it is on another host.
    Never raises, never drives the run."""
    try:
        site = journal_site(record)
    except JournalUnreachable as exc:
        return ProbeResult.elsewhere(str(exc))
    except JournalLocationError as exc:
        return ProbeResult.unknown(str(exc))
    return await site.probe(max_bytes=max_bytes, recent=recent)
