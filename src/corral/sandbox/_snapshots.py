"""Snapshots as an optional capability (DESIGN §2), seen from the sandbox layer.

A provider offers snapshots in one of two ways: natively (``capabilities.snapshots``: its
own ``snapshot``/``restore``), or by implementing :class:`ProvidesSnapshots`, whose
``snapshotter`` keeps them itself (the host-directory providers copy the sandbox's files).
:func:`snapshots_for` picks; ``None`` means the provider has none.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from corral.sandbox._contracts import Handle, Provider, SandboxSpec, SnapshotRef
from corral.sandbox._redact import Redactor

__all__ = ["ProvidesSnapshots", "Snapshotter", "snapshots_for"]


@runtime_checkable
class Snapshotter(Protocol):
    """Snapshot, restore and delete sandboxes of one provider."""

    async def snapshot(self, handle: Handle, label: str = "") -> SnapshotRef: ...

    async def restore(self, snapshot: SnapshotRef, spec: SandboxSpec | None = None) -> Handle: ...

    async def delete(self, snapshot: SnapshotRef) -> None: ...

    async def exists(self, snapshot: SnapshotRef) -> bool: ...


@runtime_checkable
class ProvidesSnapshots(Protocol):
    """Optional provider capability: snapshots kept by a :class:`Snapshotter` it makes.

    ``redactor`` knows the run's secret values: a snapshot that would hold one must not be
    kept."""

    def snapshotter(self, *, redactor: Redactor | None = None) -> Snapshotter: ...


class _Native:
    """A provider's own snapshots (deletion is the provider's business)."""

    def __init__(self, provider: Provider) -> None:
        self._p = provider

    async def snapshot(self, handle: Handle, label: str = "") -> SnapshotRef:
        return await self._p.snapshot(handle, label)

    async def restore(self, snapshot: SnapshotRef, spec: SandboxSpec | None = None) -> Handle:
        return await self._p.restore(snapshot, spec)

    async def delete(self, snapshot: SnapshotRef) -> None:
        return None

    async def exists(self, snapshot: SnapshotRef) -> bool:
        return True


def snapshots_for(provider: Provider, *, redactor: Redactor | None = None) -> Snapshotter | None:
    """The snapshotter for ``provider``: its own, the one it makes, or ``None``."""
    if provider.capabilities.snapshots:
        return _Native(provider)
    if isinstance(provider, ProvidesSnapshots):
        return provider.snapshotter(redactor=redactor)
    return None
