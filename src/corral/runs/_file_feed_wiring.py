"""Wiring a run's file feed (:mod:`corral.runs._file_feed`) to its record, sandbox and log:
for a driver holding the run, and for a driver that finishes it without a watch (the
reaper's catch-up of changes made while nobody watched)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from corral._errors import CorralError
from corral._log import library_logger
from corral.journal._layout import JournalPaths
from corral.runs._file_feed import FileFeed, load_manifest
from corral.runs._host_tools import append_aside
from corral.runs._spec import run_spec_of
from corral.sandbox._contracts import HostPaths, Provider
from corral.sandbox._secrets import Secrets
from corral.stores._protocols import EventLog
from corral.stores._records import RunRecord

__all__ = ["Emit", "file_feed", "unlogged_file_events"]

log = library_logger("corral.runs._runner")

Emit = Callable[[Sequence[dict[str, Any]]], Awaitable[None]]


async def file_feed(store: EventLog, record: RunRecord, paths: JournalPaths, epoch: int,
                    secrets: Secrets | None, *, provider_for: Callable[[str], Provider],
                    max_watches: int, emit: Emit | None = None) -> FileFeed | None:
    """The run's file feed when its sandbox definition asked for file events (``None``
    otherwise, or when this driver cannot have it). Its events go to ``emit``, by default
    into the run's log under claim ``epoch``."""
    spec = run_spec_of(record)
    files = spec.files
    ref = record.sandbox_ref or {}
    if files is None or not isinstance(ref.get("id"), str):
        return None
    try:
        handle = await provider_for(str(ref.get("provider"))).resume(str(ref["id"]))
    except CorralError as exc:
        log.warning("run %s: no file events, its sandbox is unreachable: %s",
                    record.run_id, exc)
        return None
    if not isinstance(handle, HostPaths):
        return None
    run_id = record.run_id
    missing = set(spec.secret_names) - set(secrets or ())
    if missing:
        # Paths and patches could carry them: the next driver that knows every secret
        # logs what this one did not (the catch-up).
        log.warning("run %s: no file events from this driver: secrets %s are not known "
                    "here", run_id, sorted(missing))
        return None

    async def append(events: Sequence[Mapping[str, Any]]) -> None:
        try:
            await append_aside(store, run_id, events, epoch)
        except Exception as exc:  # noqa: BLE001 - file events never stop a run
            log.warning("run %s: cannot log file events: %s", run_id, exc)

    async def logged() -> list[Mapping[str, Any]]:
        return [e.event for e in await store.snapshot(run_id)]

    baseline, tree = files.get("baseline"), files.get("tree")
    return FileFeed(handle, handle.host_path(handle.workdir), emit=emit or append,
                    max_watches=max_watches, logged=logged,
                    diff=files.get("diff") is True,
                    baseline=baseline if isinstance(baseline, str) else None,
                    manifest=load_manifest(paths.files),
                    redactor=secrets.redactor() if secrets is not None else None,
                    tree=(str(tree[0]), str(tree[1])) if isinstance(tree, list)
                    and len(tree) == 2 else None)


async def unlogged_file_events(store: EventLog, record: RunRecord, paths: JournalPaths | None,
                               secrets: Secrets | None, *,
                               provider_for: Callable[[str], Provider],
                               max_watches: int) -> list[dict[str, Any]]:
    """The file events of a run with ``file_events`` that its log lacks (changes made
    while nobody watched), for a driver that finishes the run without a watch (the
    reaper); ``[]`` when there are none or they cannot be had. Never raises."""
    if paths is None:
        return []
    got: list[dict[str, Any]] = []

    async def collect(events: Sequence[dict[str, Any]]) -> None:
        got.extend(events)

    try:
        feed = await file_feed(store, record, paths, 0, secrets, provider_for=provider_for,
                               max_watches=max_watches, emit=collect)
        if feed is None:
            return []
        await feed.catch_up(e.event for e in await store.snapshot(record.run_id))
    except Exception as exc:  # noqa: BLE001 - file events never stop a run's end
        log.warning("run %s: no catch-up of file events: %s", record.run_id, exc)
        return []
    return got
