"""The protocols behind corral's seams, for code that implements or checks them. Protocols live
here only: no other namespace exports one.

* :class:`Provider` and :class:`Handle` (with :class:`ProcessApi`, :class:`Process` and
  :class:`FileSystem`): what a sandbox provider offers (DESIGN §2). Register one with
  :func:`corral.providers.register_provider` or the ``corral.providers`` entry point.
* Optional capabilities, each a ``runtime_checkable`` protocol that corral tests with
  ``isinstance`` (never by probing attributes): :class:`HostPaths` (a handle whose files
  are a host directory), :class:`Described` (a handle that tells what it was created
  with), :class:`SandboxIds` (a handle that knows its processes' host gid, so a run's
  sockets open to it alone), :class:`InsideSupervisor` (a handle whose sandbox hosts its
  runs' supervisors: container providers), :class:`DefaultLimits` (a provider's default
  resource limits), :class:`ProvidesSnapshots` (a provider that hands out a
  :class:`Snapshotter`), :class:`ListsLabelled` (a provider that lists its sandboxes with
  their labels from any process, so ``corral gc`` finds orphans), :class:`SandboxDirs` (a
  provider whose sandboxes are host directories under its ``base_dir``),
  :class:`PrunesOrphans` (a provider that destroys sandboxes whose state vanished). The
  boolean
  :class:`~corral.sandbox.Capabilities` a provider declares are the other half: behaviour
  that no method signature shows.
* The stores: :class:`RunStore`, :class:`ClaimStore`, :class:`EventLog`,
  :class:`InstanceStore`, :class:`LockStore`, :class:`ApprovalStore` (approval requests and
  answers), :class:`SecretStore` (corral's own shared keys), :class:`CheckpointStore`
  (content-addressed workspace checkpoints, #27), :class:`SessionStore` (agent CLIs' saved
  sessions per thread), :class:`ThreadStore` (a thread's head in one read), and
  :class:`Store`, all of them at once; :class:`Diagnosable` (a store that checks itself
  for ``corral doctor``); optional store capabilities: :class:`LocksReadingInstance` and
  :class:`UpsertsUnlocking` (``ensure``'s lock and instance record in one transaction
  each).
* Harnesses: :class:`Harness` (an agent CLI adapter, registered with
  :func:`corral.harness.register_harness`) and its :class:`Translator`;
  :class:`NeedsAgentRuntime` (a harness whose runs need the agent runtime).
* Host tools: :class:`ToolLike` (what a :class:`~corral.tools.Toolset` holds besides
  functions) and :class:`ApprovalGate` (what holds an "ask" tool call for
  :func:`corral.tools.execute_host_tool`).
"""

from __future__ import annotations

from corral._lazy import TYPE_CHECKING, lazy_namespace

# The public names, listed once: resolved on first use (corral._lazy)
if TYPE_CHECKING or not lazy_namespace(globals()):
    from corral.harness._base import (
        Harness as Harness,
        NeedsAgentRuntime as NeedsAgentRuntime,
        Translator as Translator,
    )
    from corral.sandbox._contracts import (
        DefaultLimits as DefaultLimits,
        Described as Described,
        FileSystem as FileSystem,
        Handle as Handle,
        HostPaths as HostPaths,
        Process as Process,
        ProcessApi as ProcessApi,
        Provider as Provider,
        PrunesOrphans as PrunesOrphans,
        SandboxDirs as SandboxDirs,
        SandboxIds as SandboxIds,
    )
    from corral.sandbox._gc import ListsLabelled as ListsLabelled
    from corral.sandbox._inside import InsideSupervisor as InsideSupervisor
    from corral.sandbox._snapshots import (
        ProvidesSnapshots as ProvidesSnapshots,
        Snapshotter as Snapshotter,
    )
    from corral.stores._protocols import (
        ApprovalStore as ApprovalStore,
        CheckpointStore as CheckpointStore,
        ClaimStore as ClaimStore,
        Diagnosable as Diagnosable,
        EventLog as EventLog,
        InstanceStore as InstanceStore,
        LocksReadingInstance as LocksReadingInstance,
        LockStore as LockStore,
        RunStore as RunStore,
        SecretStore as SecretStore,
        SessionStore as SessionStore,
        Store as Store,
        ThreadStore as ThreadStore,
        UpsertsUnlocking as UpsertsUnlocking,
    )
    from corral.tools._core import ToolLike as ToolLike
    from corral.tools._remote import ApprovalGate as ApprovalGate
