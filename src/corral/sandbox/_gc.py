"""Collect idle sandboxes: destroy every instance whose ``keep_alive`` has run out, and
orphans: sandboxes a provider lists by label that no instance record points to; then the
checkpoint chunks no checkpoint names any more (#27).

``collect_idle`` is what ``corral gc`` runs and what a reaper sweep calls. An instance
is skipped while its latest run is still running (the run keeps it alive), or while
another process holds its key lock (it is being ensured right now).

Orphans (``collect_orphans``) come from providers whose sandboxes outlive every host
process and carry labels (:class:`ListsLabelled`, e.g. docker containers): a sandbox made
for an instance key of *this* store (label ``corral.store``) whose record is gone or names
another sandbox, older than a grace period (a sandbox is made before its record is
written), is destroyed under the key's lock. Sandboxes of other stores, and sandboxes made
without a key (``corral exec --keep``), are never touched.

Chunks (``collect_chunks``): a removed checkpoint's chunks that no other checkpoint names
are deleted once nobody put or touched them for :data:`~corral.stores.CHUNK_GRACE`. That
grace is what keeps a concurrent writer safe: a checkpoint being taken puts (or touches)
its chunks before its manifest, and the store refuses a manifest naming a chunk it no
longer holds (the collector and ``put_checkpoint`` serialize), so the writer is told to put
it again rather than left with a checkpoint that cannot be restored.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from corral._errors import CorralError
from corral.stores._protocols import (
    CheckpointStore,
    InstanceRecord,
    InstanceStore,
    LockStore,
    RunStore,
)
from corral.sandbox._contracts import Provider, SandboxRef
from corral.sandbox._ensure import destroy_record, key_lock_name, store_id
from corral.sandbox._redact import get_logger
from corral.sandbox._provider_registry import (
    build_provider,
    config_key,
    provider_names,
    recorded_config,
)
from corral.sandbox._snapshots import snapshots_for
from corral.sandbox import _traced as traced

__all__ = ["ORPHAN_GRACE", "GcEntry", "GcReport", "LabelledSandbox", "ListsLabelled",
           "collect_idle", "collect_orphans"]

log = get_logger("corral.sandbox._gc")

Outcome = Literal["destroyed", "would-destroy", "active", "busy", "destroy-failed",
                  "unknown-provider", "orphan-destroyed", "orphan-would-destroy"]

ORPHAN_GRACE = 600.0
"""Seconds a labelled sandbox without a record is left alone (it may be being made)."""


@dataclass(frozen=True, slots=True)
class LabelledSandbox:
    """One sandbox as a provider lists it with its labels."""

    id: str
    labels: Mapping[str, str]
    created_at: float


@runtime_checkable
class ListsLabelled(Protocol):
    """Optional provider capability: list its sandboxes with their labels, from any
    process (the labels are the state: docker containers)."""

    @property
    def name(self) -> str: ...

    async def labelled(self) -> list[LabelledSandbox]: ...

    async def destroy(self, ref: SandboxRef | str) -> None: ...


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
    chunks: int = 0
    """Checkpoint chunks deleted (none with ``dry_run``)."""


async def collect_idle(
    store: InstanceStore,
    *,
    now: float | None = None,
    providers: Mapping[str, Provider] | None = None,
    dry_run: bool = False,
    limit: int = 100,
    orphans: bool = True,
    orphan_grace: float = ORPHAN_GRACE,
    chunks: bool = True,
) -> GcReport:
    """Destroy idle sandboxes past their ``keep_alive``; never raises for one sandbox.
    Then (``chunks``, and not ``dry_run``), when ``store`` keeps checkpoints, delete the
    chunks no checkpoint names and nobody put or touched for
    :data:`~corral.stores.CHUNK_GRACE` before ``now`` (see the module docstring).

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
        async with _try_key_lock(store, record.key) as held:
            if not held:
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
    if orphans:
        listing = [p for p in {**_labelling_providers(), **given}.values()
                   if isinstance(p, ListsLabelled)]
        entries += await collect_orphans(store, listing, now=now, dry_run=dry_run,
                                         grace=orphan_grace, limit=limit)
    freed = 0
    if chunks and not dry_run and isinstance(store, CheckpointStore):
        freed = await store.collect_chunks(now=now)
    return GcReport(tuple(entries), dict(Counter(e.outcome for e in entries)), freed)


def _labelling_providers() -> dict[str, Provider]:
    """Every registered provider, with its default configuration, that lists its sandboxes
    by label (one that cannot be built here is left out: it has nothing here to collect)."""
    out: dict[str, Provider] = {}
    for name in provider_names():
        try:
            provider = build_provider(name)
        except Exception:  # noqa: BLE001 - a missing prerequisite means nothing to collect
            continue
        if isinstance(provider, ListsLabelled):
            out[name] = provider
    return out


async def collect_orphans(
    store: InstanceStore,
    providers: Sequence[ListsLabelled],
    *,
    now: float | None = None,
    dry_run: bool = False,
    grace: float = ORPHAN_GRACE,
    limit: int = 100,
) -> list[GcEntry]:
    """Destroy the sandboxes of ``providers`` labelled with an instance key of this store
    that no instance record points to, older than ``grace`` seconds; never raises for one
    sandbox (a provider that cannot list, e.g. no Docker daemon, has none)."""
    now = time.time() if now is None else now
    ours = await store_id(store)
    if ours is None:
        return []
    entries: list[GcEntry] = []
    for provider in providers:
        try:
            found = await provider.labelled()
        except CorralError as exc:
            log.info("gc: %s lists no sandboxes here: %s", provider.name, exc)
            continue
        for sb in found:
            if len(entries) >= limit:
                return entries
            key = sb.labels.get("corral.key")
            if not key or sb.labels.get("corral.store") != ours or now - sb.created_at < grace:
                continue
            if await _points_to(store, key, provider.name, sb.id):
                continue
            entry = GcEntry(key, provider.name, sb.id, "orphan-would-destroy",
                            "no instance record points to it")
            if dry_run:
                entries.append(entry)
                continue
            async with _try_key_lock(store, key) as held:
                if not held:
                    continue  # being ensured right now
                try:
                    if await _points_to(store, key, provider.name, sb.id):
                        continue  # recorded since the listing
                    await traced.destroy(provider, SandboxRef(provider.name, sb.id),
                                         reason="gc")
                    entries.append(GcEntry(key, provider.name, sb.id, "orphan-destroyed",
                                           entry.detail))
                except Exception as exc:  # noqa: BLE001 - one failure must not stop the sweep
                    log.error("gc of orphan sandbox %s failed: %s", sb.id, exc)
                    entries.append(GcEntry(key, provider.name, sb.id, "destroy-failed",
                                           str(exc)))
    return entries


@asynccontextmanager
async def _try_key_lock(store: InstanceStore, key: str) -> AsyncIterator[bool]:
    """Take instance ``key``'s lock (the one ensure holds) without waiting: yields whether
    it is held (always, for a store without locks), and releases it after."""
    if not isinstance(store, LockStore):
        yield True
        return
    name, owner = key_lock_name(key), f"gc:{time.time_ns()}"
    if not await store.try_lock(name, owner, 60.0):
        yield False
        return
    try:
        yield True
    finally:
        await store.unlock(name, owner)


async def _points_to(store: InstanceStore, key: str, provider: str, sandbox_id: str) -> bool:
    record = await store.get_instance(key)
    return record is not None and record.provider == provider and \
        record.provider_sandbox_id == sandbox_id


async def _run_active(store: InstanceStore, record: InstanceRecord) -> bool:
    if not record.latest_run_id or not isinstance(store, RunStore):
        return False
    run = await store.get(record.latest_run_id)
    return run is not None and not run.status.terminal
