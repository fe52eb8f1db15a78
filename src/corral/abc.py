"""The protocols behind corral's seams, for code that implements or checks them.

* :class:`Provider` and :class:`Handle` (with :class:`ProcessApi`, :class:`Process` and
  :class:`FileSystem`): what a sandbox provider offers (DESIGN §2). Register one with
  :func:`corral.providers.register_provider` or the ``corral.providers`` entry point.
* Optional capabilities, each a ``runtime_checkable`` protocol that corral tests with
  ``isinstance`` (never by probing attributes): :class:`HostPaths` (a handle whose files
  are a host directory), :class:`Described` (a handle that tells what it was created
  with), :class:`SandboxIds` (a handle that knows its processes' host gid, so a run's
  sockets open to it alone), :class:`DefaultLimits` (a provider's default resource limits),
  :class:`ProvidesSnapshots` (a provider that hands out a :class:`Snapshotter`),
  :class:`SandboxDirs` (a provider whose sandboxes are host directories under its
  ``base_dir``), :class:`PrunesOrphans` (a provider that destroys sandboxes whose state
  vanished), :class:`InsideSupervisor` (a handle whose sandbox hosts its durable runs'
  supervisors: a provider that declares ``supervisor_inside``). The
  boolean :class:`~corral.sandbox._contracts.Capabilities` a provider declares are the
  other half: behaviour that no method signature shows.
* The stores: :class:`RunStore`, :class:`ClaimStore`, :class:`EventLog`,
  :class:`InstanceStore`, :class:`LockStore`, :class:`CheckpointStore` (content-addressed
  workspace checkpoints, #27), :class:`SessionStore` (agent CLIs' saved sessions per
  thread), and :class:`Store`, all of them at once; optional store capabilities:
  :class:`LocksReadingInstance` and :class:`UpsertsUnlocking` (``ensure``'s lock and
  instance record in one transaction each).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral._lazy import lazy_exports

if TYPE_CHECKING:
    from corral.sandbox._contracts import (
        DefaultLimits,
        Described,
        FileSystem,
        Handle,
        HostPaths,
        Process,
        ProcessApi,
        Provider,
        PrunesOrphans,
        SandboxDirs,
        SandboxIds,
    )
    from corral.sandbox._inside import InsideSupervisor
    from corral.sandbox._snapshots import ProvidesSnapshots, Snapshotter
    from corral.stores._protocols import (
        CheckpointStore,
        ClaimStore,
        EventLog,
        InstanceStore,
        LocksReadingInstance,
        LockStore,
        RunStore,
        SessionStore,
        Store,
        UpsertsUnlocking,
    )

# Names resolve on first use (corral._lazy), named for this namespace.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(
        ("DefaultLimits", "Described", "FileSystem", "Handle", "HostPaths", "Process",
         "ProcessApi", "Provider", "PrunesOrphans", "SandboxDirs", "SandboxIds"),
        "corral.sandbox._contracts",
    ),
    "InsideSupervisor": "corral.sandbox._inside",
    **dict.fromkeys(("ProvidesSnapshots", "Snapshotter"), "corral.sandbox._snapshots"),
    **dict.fromkeys(
        ("CheckpointStore", "ClaimStore", "EventLog", "InstanceStore", "LockStore",
         "LocksReadingInstance", "RunStore", "SessionStore", "Store", "UpsertsUnlocking"),
        "corral.stores._protocols",
    ),
}
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

__all__ = [
    "CheckpointStore",
    "ClaimStore",
    "DefaultLimits",
    "Described",
    "EventLog",
    "FileSystem",
    "Handle",
    "HostPaths",
    "InsideSupervisor",
    "InstanceStore",
    "LockStore",
    "LocksReadingInstance",
    "Process",
    "ProcessApi",
    "Provider",
    "ProvidesSnapshots",
    "PrunesOrphans",
    "RunStore",
    "SandboxDirs",
    "SandboxIds",
    "SessionStore",
    "Snapshotter",
    "Store",
    "UpsertsUnlocking",
]
