"""Collect idle sandboxes: destroy every instance whose ``keep_alive`` has run out.

``collect_idle`` is what ``corral gc`` runs and what a reaper sweep can call. An instance
is skipped while its latest run is still running (the run keeps it alive), or while
another process holds its key lock (it is being ensured right now).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from corral._errors import CorralError
from corral.stores._protocols import InstanceRecord, InstanceStore, LockStore, RunStore
from corral.sandbox._contracts import Provider
from corral.sandbox._ensure import destroy_record
from corral.sandbox._redact import get_logger
from corral.sandbox._registry import build_provider, config_key, recorded_config
from corral.sandbox._snapshots import snapshots_for

__all__ = ["GcEntry", "GcReport", "collect_idle"]

log = get_logger("corral.sandbox._gc")

Outcome = Literal["destroyed", "would-destroy", "active", "busy", "destroy-failed", "unknown-provider"]


@dataclass(frozen=True, slots=True)
class GcEntry:
    key: str
    provider: str
    sandbox_id: str
    outcome: Outcome
    detail: str = ""


@dataclass(frozen=True, slots=True)
class GcReport:
    entries: tuple[GcEntry, ...] = ()
    counts: Mapping[str, int] = field(default_factory=dict)


async def collect_idle(
    store: InstanceStore,
    *,
    now: float | None = None,
    providers: Mapping[str, Provider] | None = None,
    dry_run: bool = False,
    limit: int = 100,
) -> GcReport:
    """Destroy idle sandboxes past their ``keep_alive``; never raises for one sandbox.

    Each sandbox's provider is rebuilt from the registry with the configuration its
    instance record names (``providers`` maps a provider name to an object to use instead,
    for sandboxes recorded without a configuration); one whose provider is not installed
    here is reported ``unknown-provider`` with the package to install."""
    now = time.time() if now is None else now
    given: Mapping[str, Provider] = providers or {}
    built: dict[tuple[str, str], Provider] = {}
    entries: list[GcEntry] = []
    for record in (await store.list_expired_instances(now))[:limit]:

        def entry(outcome: Outcome, detail: str = "", r: InstanceRecord = record) -> GcEntry:
            return GcEntry(r.key, r.provider, r.provider_sandbox_id, outcome, detail)

        if await _run_active(store, record):
            entries.append(entry("active", f"run {record.latest_run_id} is still running"))
            continue
        config, package = recorded_config(record.meta)
        which = (record.provider, config_key(config))
        if not config and record.provider in given:
            built[which] = given[record.provider]
        if which not in built:
            try:
                built[which] = build_provider(record.provider, config, package=package)
            except CorralError as exc:
                entries.append(entry("unknown-provider", str(exc)))
                continue
        provider = built[which]
        if dry_run:
            entries.append(entry("would-destroy"))
            continue
        owner = f"gc:{time.time_ns()}"
        name = f"sandbox:{record.key}"
        if isinstance(store, LockStore) and not await store.try_lock(name, owner, 60.0):
            entries.append(entry("busy", "being ensured by another process"))
            continue
        try:
            fresh = await store.get_instance(record.key)
            if fresh is None or fresh.expires_at is None or fresh.expires_at > now:
                continue  # used again since the listing
            await destroy_record(provider, fresh, store, snapshots=snapshots_for(provider))
            entries.append(entry("destroyed"))
        except Exception as exc:  # noqa: BLE001 - one sandbox's failure must not stop the sweep
            log.error("gc of sandbox %s failed: %s", record.provider_sandbox_id, exc)
            entries.append(entry("destroy-failed", str(exc)))
        finally:
            if isinstance(store, LockStore):
                await store.unlock(name, owner)
    return GcReport(tuple(entries), dict(Counter(e.outcome for e in entries)))


async def _run_active(store: InstanceStore, record: InstanceRecord) -> bool:
    if not record.latest_run_id or not isinstance(store, RunStore):
        return False
    run = await store.get(record.latest_run_id)
    return run is not None and not run.status.terminal
