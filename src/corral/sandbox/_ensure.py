"""``ensure``: find or make the sandbox behind a definition, under a per-key lock.

Order: resume the recorded sandbox (re-bootstrapping it when its bootstrap marker is
missing) → restore the recorded snapshot → create + bootstrap (+ an ``after-setup``
snapshot). A failed bootstrap destroys the new sandbox and leaves no instance record.

The record is written as soon as a sandbox exists (marked ``bootstrapping``, with an
expiry), so a process that dies mid-bootstrap leaves something ``corral gc`` can find,
never an orphan. Secrets never go into the create spec (providers persist it); they are
passed as environment on each exec: :meth:`Ensured.exec_env`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import secrets as _secrets
import socket
import time
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

import anyio

from corral._telemetry import span
from corral._errors import CorralError
from corral.stores._protocols import (
    InstanceRecord,
    InstanceStore,
    LockStore,
    LocksReadingInstance,
    SecretStore,
    UpsertsUnlocking,
)
from corral.sandbox._bootstrap import bootstrap, read_marker
from corral.sandbox._contracts import (
    Handle,
    Provider,
    SandboxGoneError,
    SandboxSpec,
    SnapshotRef,
    UnsupportedCapability,
)
from corral.sandbox._hooks import call_hook
from corral.sandbox._key import RunContext
from corral.sandbox._redact import Redactor, get_logger
from corral.sandbox._secrets import Secrets
from corral.sandbox._snapshots import Snapshotter, snapshots_for
from corral.stores import open_store
from corral.sandbox import _traced as traced

if TYPE_CHECKING:
    from corral.sandbox._definition import Sandbox

__all__ = [
    "Ensured",
    "InstanceStoreLike",
    "Origin",
    "SpecHook",
    "destroy",
    "ensure",
    "key_lock",
    "release",
]

log = get_logger("corral.sandbox._ensure")

InstanceStoreLike = InstanceStore
Origin = Literal["resumed", "rebootstrapped", "restored", "created"]
SpecHook = Callable[[SandboxSpec], SandboxSpec]
"""Adjusts the spec of a sandbox being created or restored (e.g. extra binds for agent
CLIs). Not part of the instance key: a resumed sandbox keeps what it was created with."""

LOCK_TTL = 30.0
LOCK_WAIT = 3600.0
DESTROY_TIMEOUT = 60.0
BOOTSTRAP_GRACE = 3600.0
"""Expiry of a record whose bootstrap has not finished (for gc of crashed bootstraps)."""


@dataclass(frozen=True)
class Ensured:
    """A ready sandbox for one run.

    ``exec_env(extra)`` is the environment to pass to **every** ``exec``/``spawn`` of
    the run (the workspace secrets plus ``extra``); ``redactor`` hides the secret values
    and must be applied to every event, log line and error the run produces.
    """

    handle: Handle
    key: str
    record: InstanceRecord
    origin: Origin
    secrets: Secrets = field(repr=False)

    def exec_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(extra or {})
        env.update(self.secrets.env())
        return env

    @property
    def redactor(self) -> Redactor:
        return self.secrets.redactor()


# ---------------------------------------------------------------------- locking
# Weak: a key's lock lives while someone holds or waits for it (their frames keep it), so
# run-scoped keys do not pile up in a long-lived server.
_local_locks: weakref.WeakValueDictionary[str, anyio.Lock] = weakref.WeakValueDictionary()


def key_lock_name(key: str) -> str:
    """The store lock that guards instance ``key`` (:func:`key_lock`; gc takes it too)."""
    return f"sandbox:{key}"


@dataclass
class KeyLock:
    """What :func:`key_lock` yields: the instance record read under the lock, when the
    store read it in the transaction that took the lock (``read``); and the record the
    body wants written last (``write_last``: upserted when the body returns, before the
    lock is released, in the same transaction where the store can)."""

    read: bool = False
    instance: InstanceRecord | None = None
    write_last: InstanceRecord | None = None


@functools.cache
def _fast_paths(cls: type) -> tuple[bool, bool]:
    """Whether a store class offers :class:`LocksReadingInstance` and
    :class:`UpsertsUnlocking` (asked once per class: a runtime protocol check costs ~10 µs,
    on every ensure)."""
    return issubclass(cls, LocksReadingInstance), issubclass(cls, UpsertsUnlocking)


@asynccontextmanager
async def key_lock(store: object, key: str, *, read_instance: bool = False
                   ) -> AsyncIterator[KeyLock]:
    """Hold the per-key lock: in this process, and across processes and hosts when the
    store is a :class:`~corral.stores._protocols.LockStore` (a lease renewed while held).
    ``read_instance``: also read the instance record in the same transaction where the
    store can (:class:`~corral.stores._protocols.LocksReadingInstance`: one round trip less
    for ``ensure``)."""
    held = KeyLock()
    lock = _local_locks.get(key)
    if lock is None:
        lock = _local_locks[key] = anyio.Lock()
    async with lock:
        if not isinstance(store, LockStore):
            yield held
            if held.write_last is not None:  # (not reached when the body raised)
                await cast(InstanceStore, store).upsert_instance(held.write_last)
            return
        name = key_lock_name(key)
        owner = f"{socket.gethostname()}:{os.getpid()}:{_secrets.token_hex(4)}"
        reads, unlocks = _fast_paths(type(store))
        reading = cast(LocksReadingInstance, store).try_lock_reading_instance \
            if read_instance and reads else None

        async def attempt() -> bool:
            if reading is not None:
                taken, held.instance = await reading(name, owner, LOCK_TTL, key)
                held.read = taken
                return bool(taken)
            return await store.try_lock(name, owner, LOCK_TTL)

        if not await attempt():  # (the deadline's scope only when there is a wait)
            delay = 0.02
            with anyio.fail_after(LOCK_WAIT):
                while True:
                    await anyio.sleep(delay)  # another process is ensuring this key
                    delay = min(delay * 2, 0.5)
                    if await attempt():
                        break

        stop = anyio.Event()

        async def renew() -> None:
            # Ends when told, not by a cancel: the task group's exit is then cheaper (a
            # cancel's delivery took ~0.1 ms more of each ensure after an idle moment).
            while True:
                with anyio.move_on_after(LOCK_TTL / 3):
                    await stop.wait()
                    return
                await store.try_lock(name, owner, LOCK_TTL)

        # The body's exception is carried past the task group so that callers see it
        # as raised, not wrapped in an ExceptionGroup.
        failure: BaseException | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(renew)
                try:
                    yield held
                except BaseException as exc:
                    failure = exc
                finally:
                    stop.set()
        finally:
            with anyio.CancelScope(shield=True):
                last = held.write_last if failure is None else None
                # After the renewer stopped (it could take the lock again after a release).
                if last is None:
                    await store.unlock(name, owner)
                elif unlocks:
                    try:
                        await cast(UpsertsUnlocking, store).upsert_instance_unlocking(
                            last, name, owner)
                    except BaseException:
                        # nothing was written (one transaction): release the lock anyway,
                        # as after a failed write on its own, and raise the write's error
                        with contextlib.suppress(Exception):
                            await store.unlock(name, owner)
                        raise
                else:
                    try:
                        await cast(InstanceStore, store).upsert_instance(last)
                    finally:
                        await store.unlock(name, owner)
        if failure is not None:
            raise failure


# ---------------------------------------------------------------------- helpers
@asynccontextmanager
async def _store_for(store: InstanceStore | None) -> AsyncIterator[InstanceStore]:
    if store is not None:
        yield store
        return
    opened = await open_store()
    try:
        yield opened
    finally:
        await opened.aclose()


def snapshotter_of(sandbox: Sandbox, provider: Provider) -> Snapshotter | None:
    """The provider's snapshots for this definition (``None``: it offers none), redacting
    the definition's secrets from what they record."""
    return snapshots_for(provider, redactor=sandbox.secrets.redactor())


def _record(
    sandbox: Sandbox,
    ctx: RunContext,
    key: str,
    handle: Handle,
    *,
    snapshot: str | None,
    state: str,
    now: float,
    extra: Mapping[str, Any] | None = None,
) -> InstanceRecord:
    keep = sandbox.lifecycle.keep_alive_seconds
    if state == "bootstrapping":
        expires: float | None = now + max(keep or 0.0, BOOTSTRAP_GRACE)
    else:
        expires = now + keep if keep is not None else None
    meta: dict[str, Any] = {
        "definition": sandbox.id,
        "workspace_hash": sandbox.workspace.hash(),
        "tenant": ctx.tenant,
        "reuse": sandbox.lifecycle.reuse,
        "state": state,
        **(extra or {}),
        # name, configuration and package: any process rebuilds the provider from these
        "provider": sandbox.provider_record(),
    }
    return InstanceRecord(
        key=key,
        provider=handle.ref.provider,
        provider_sandbox_id=handle.id,
        thread_id=ctx.thread_id,
        updated_at=now,
        latest_snapshot_id=snapshot,
        latest_run_id=ctx.run_id,
        expires_at=expires,
        meta=meta,
    )


async def _destroy_quietly(provider: Provider, handle_id: str) -> None:
    """Destroy, shielded from cancellation and bounded in time (teardown must happen
    even when the caller is being cancelled)."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(DESTROY_TIMEOUT):
        try:
            await traced.destroy(provider, handle_id, reason="ensure failed")
        except Exception as exc:  # noqa: BLE001 - reported, and the original error wins
            log.error("destroying sandbox %s failed: %s", handle_id, exc)


async def _gone_under(provider: Provider, handle_id: str,
                     exc: BaseException) -> SandboxGoneError | None:
    """When a bootstrap failed because its sandbox was removed underneath (``docker rm -f``
    mid-setup, say), the error that says so; ``None`` for any other failure, a cancel, or a
    provider that cannot tell (the original error then stands). A sandbox that is being
    removed can still look alive for a moment after its processes died, so one that
    resumes must also run a command before it counts as there."""
    if not isinstance(exc, Exception) or isinstance(exc, SandboxGoneError):
        return None
    gone = SandboxGoneError.of(provider.name, handle_id,
                               "it was removed during the workspace's setup")
    with anyio.CancelScope(shield=True), anyio.move_on_after(DESTROY_TIMEOUT):
        while True:
            try:
                handle = await provider.resume(handle_id)
                if handle is None:
                    return gone
                if (await handle.process.exec(["true"], timeout=10)).exit_code == 0:
                    return None
            except SandboxGoneError:
                return gone
            except Exception as probe:  # noqa: BLE001 - asked again until the bound
                log.info("is sandbox %s still there? %s", handle_id, probe)
            await anyio.sleep(0.2)
    return None


async def _bootstrap(sandbox: Sandbox, handle: Handle) -> dict[str, Any]:
    red = sandbox.secrets.redactor()
    result = await bootstrap(handle, sandbox.workspace, env=sandbox.secrets.env(), redactor=red)
    return {"bootstrapped_at": result.bootstrapped_at, "commit": result.commit}


async def _bootstrap_recorded(
    sandbox: Sandbox, handle: Handle, store: InstanceStore, record: InstanceRecord
) -> dict[str, Any]:
    """Bootstrap while the ``bootstrapping`` record is written. The record is begun right
    after create, as before, and both are done when this returns; the setup need not wait
    for the store's round trip (a hop to a worker thread, milliseconds on a loaded host)."""
    failure: BaseException | None = None
    extra: dict[str, Any] = {}
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(store.upsert_instance, record)
            try:
                extra = await _bootstrap(sandbox, handle)
            except BaseException as exc:  # carried past the task group, unwrapped
                failure = exc
    except BaseExceptionGroup as group:  # the record's write failed (the setup was stopped)
        raise group.exceptions[0] from None
    if failure is not None:
        raise failure
    return extra


async def _marker_ok(sandbox: Sandbox, handle: Handle) -> bool:
    marker = await read_marker(handle)
    return marker is not None and marker.get("workspace_hash") == sandbox.workspace.hash()


# ---------------------------------------------------------------------- ensure
async def ensure(
    sandbox: Sandbox,
    ctx: RunContext,
    *,
    store: InstanceStore | None = None,
    spec_hook: SpecHook | None = None,
) -> Ensured:
    """Resume, restore or create + bootstrap the sandbox for ``ctx`` (see module doc).

    ``spec_hook`` is applied to the spec of a sandbox that is created or restored here (a
    resumed one keeps the spec it was created with)."""
    provider = sandbox.get_provider()
    key = sandbox.key(ctx)
    snapshots = snapshotter_of(sandbox, provider)
    if sandbox.lifecycle.snapshot != "none" and snapshots is None:
        raise UnsupportedCapability(
            provider.name, "snapshots", "set lifecycle.snapshot = 'none' for this provider"
        )
    with span("sandbox.ensure", {"corral.sandbox.provider": provider.name,
                                 "corral.sandbox.key": key}) as current:
        async with _store_for(store) as st, key_lock(st, key, read_instance=True) as held:
            ensured = await _ensure_locked(sandbox, ctx, key, provider, snapshots, st,
                                           spec_hook, held)
        if current is not None:
            current.set_attribute("corral.sandbox.id", ensured.handle.id)
        await call_hook(sandbox.hooks.on_ready, "on_ready", ensured.handle)
    return ensured


async def _ensure_locked(
    sandbox: Sandbox,
    ctx: RunContext,
    key: str,
    provider: Provider,
    snapshots: Snapshotter | None,
    store: InstanceStore,
    spec_hook: SpecHook | None = None,
    held: KeyLock | None = None,
) -> Ensured:
    async def spec() -> SandboxSpec:
        # only for a new sandbox (restore or create): a resume pays no store round trip
        base = _spec(sandbox, key, ctx, await store_id(store))
        return spec_hook(base) if spec_hook is not None else base

    if held is not None and held.read:
        existing = held.instance  # read under the lock, in the transaction that took it
    else:
        existing = await store.get_instance(key)
    if existing is not None and existing.provider != provider.name:
        existing = None  # the key covers the provider; a mismatch is not ours to touch
    stale_snapshot: str | None = None
    if existing is not None:
        handle = await provider.resume(existing.provider_sandbox_id)
        origin: Origin = "resumed"
        if handle is None and existing.latest_snapshot_id and snapshots is not None:
            ref = SnapshotRef(provider.name, existing.latest_snapshot_id)
            try:
                if await snapshots.exists(ref):
                    handle = await snapshots.restore(ref, await spec())
                    origin = "restored"
            except CorralError as exc:
                log.warning("restoring snapshot %s failed, creating anew: %s", ref.id, exc)
                handle = None
            if handle is None:
                stale_snapshot = existing.latest_snapshot_id
        if handle is not None:
            extra: dict[str, Any] = {
                k: existing.meta.get(k) for k in ("bootstrapped_at", "commit", "snapshot_taken_at")
            }
            if not await _marker_ok(sandbox, handle):
                # wiped underneath or never finished: bootstrap again, in place
                log.warning("sandbox %s has no bootstrap marker; bootstrapping again", handle.id)
                try:
                    extra.update(await _bootstrap(sandbox, handle))
                except BaseException as exc:
                    gone = await _gone_under(provider, handle.id, exc)
                    await _destroy_quietly(provider, handle.id)
                    await _forget(store, key, snapshots, provider.name, existing.latest_snapshot_id)
                    if isinstance(exc, Exception):
                        await call_hook(sandbox.hooks.on_error, "on_error", exc)
                    if gone is not None:
                        raise gone from exc
                    raise
                origin = "rebootstrapped"
            if origin == "restored":  # a rebootstrap keeps its workspace, in place
                try:
                    extra.update(await _thread_state(sandbox, ctx, handle, store,
                                                     bootstrapped=False))
                except BaseException:
                    await _destroy_quietly(provider, handle.id)
                    await _forget(store, key, snapshots, provider.name,
                                  existing.latest_snapshot_id)
                    raise
            now = time.time()
            record = _record(
                sandbox, ctx, key, handle,
                snapshot=existing.latest_snapshot_id if origin != "rebootstrapped" else None,
                state="ready", now=now, extra=extra,
            )  # fmt: skip
            if origin == "rebootstrapped" and existing.latest_snapshot_id and snapshots:
                await snapshots.delete(SnapshotRef(provider.name, existing.latest_snapshot_id))
            await _write_last(store, held, record)
            return Ensured(handle, key, record, origin, sandbox.secrets)

    # create + bootstrap
    handle = await traced.create(provider, await spec())
    now = time.time()
    try:
        extra = await _bootstrap_recorded(
            sandbox, handle, store,
            _record(sandbox, ctx, key, handle, snapshot=None, state="bootstrapping", now=now),
        )
        snap_id: str | None = None
        if sandbox.lifecycle.snapshot == "after-setup":
            assert snapshots is not None
            snap = await snapshots.snapshot(handle, "after-setup")
            snap_id = snap.id
            extra["snapshot_taken_at"] = time.time()
        extra.update(await _thread_state(sandbox, ctx, handle, store, bootstrapped=True))
    except BaseException as exc:
        gone = await _gone_under(provider, handle.id, exc)
        await _destroy_quietly(provider, handle.id)
        await _forget(store, key, snapshots, provider.name, stale_snapshot)
        if isinstance(exc, Exception):
            await call_hook(sandbox.hooks.on_error, "on_error", exc)
        if gone is not None:
            raise gone from exc
        raise
    if stale_snapshot and snapshots:
        await snapshots.delete(SnapshotRef(provider.name, stale_snapshot))
    record = _record(
        sandbox, ctx, key, handle, snapshot=snap_id, state="ready", now=time.time(), extra=extra
    )
    await _write_last(store, held, record)
    return Ensured(handle, key, record, "created", sandbox.secrets)


async def _thread_state(sandbox: Sandbox, ctx: RunContext, handle: Handle, store: object, *,
                        bootstrapped: bool) -> dict[str, Any]:
    """A fresh sandbox of a named thread (#27) gets the thread's state: its head checkpoint's
    workspace (the last turn's files, whichever host ran it), or, for the thread's first
    turn, the state before it is recorded (what undo of that turn brings back). Returns
    what the instance record notes of it."""
    if sandbox.lifecycle.checkpoint == "none" or ctx.thread_id == ctx.run_id:
        return {}  # no thread named (a run is its own thread): nothing to continue
    # start-up cost of every run's start: only a named thread loads the checkpoints
    from corral.sandbox._threads import (
        current_head,
        initial_checkpoint,
        lineage,
        restore_head,
        thread_checkpoints,
    )

    checkpoints = thread_checkpoints(store)
    if checkpoints is None:
        return {}
    of = lineage(sandbox.id, sandbox.workspace.hash())
    # one store read: the head, once the thread's last turn recorded its checkpoint
    head = await current_head(store, ctx.thread_id, but=ctx.run_id)
    restored = await restore_head(handle, checkpoints, ctx,
                                  head.checkpoint if head is not None else None,
                                  of=of, bootstrapped=bootstrapped)
    if restored is not None:
        return {"restored_checkpoint": restored}
    await initial_checkpoint(handle, checkpoints, ctx, secrets=sandbox.secrets.redactor(),
                             max_bytes=sandbox.lifecycle.checkpoint_max_bytes,
                             extra_meta={"lineage": of})
    return {}


async def _write_last(store: InstanceStore, held: KeyLock | None, record: InstanceRecord) -> None:
    """Write the ``ready`` record: under :func:`key_lock`, as the lock is released (one
    round trip for both where the store can), else now. Either way it is written before
    ``ensure`` returns, and a failure to write it is raised from ``ensure``."""
    if held is not None:
        held.write_last = record
    else:
        await store.upsert_instance(record)


async def store_id(store: object) -> str | None:
    """A label naming the store a sandbox's instance record lives in (a digest of its shared
    secret; every host sharing the store agrees), so that orphan collection only ever
    judges sandboxes of its own store. ``None`` for a store without shared secrets."""
    if not isinstance(store, SecretStore):
        return None
    secret = await store.shared_secret("sandbox-labels")
    return hashlib.sha256(secret).hexdigest()[:16]


def _spec(sandbox: Sandbox, key: str, ctx: RunContext | None = None,
          store_label: str | None = None) -> SandboxSpec:
    # No secrets here: providers persist the spec (state files, image config).
    labels = {"corral.key": key, "corral.definition": sandbox.id}
    if ctx is not None and ctx.run_id:
        labels["corral.run"] = ctx.run_id
    if store_label:
        labels["corral.store"] = store_label
    return SandboxSpec(
        network=sandbox.policy.direct_network,  # allow_hosts: the egress proxy, per run
        labels=labels,
    )


async def _forget(
    store: InstanceStore,
    key: str,
    snapshots: Snapshotter | None,
    provider: str,
    snapshot_id: str | None,
) -> None:
    with anyio.CancelScope(shield=True):
        await store.delete_instance(key)
        if snapshot_id and snapshots is not None:
            try:
                await snapshots.delete(SnapshotRef(provider, snapshot_id))
            except CorralError as exc:
                log.warning("deleting snapshot %s failed: %s", snapshot_id, exc)


# ---------------------------------------------------------------------- teardown
async def destroy(
    sandbox: Sandbox, ctx: RunContext, *, store: InstanceStore | None = None
) -> bool:
    """Destroy the sandbox for ``ctx`` and its snapshot, then forget it. True if there was
    a record. The destroy is shielded and bounded, never skipped because of a cancel."""
    provider = sandbox.get_provider()
    key = sandbox.key(ctx)
    async with _store_for(store) as st, key_lock(st, key):
        record = await st.get_instance(key)
        if record is None:
            return False
        await destroy_record(provider, record, st, snapshots=snapshotter_of(sandbox, provider))
    await call_hook(sandbox.hooks.on_destroy, "on_destroy", record)
    return True


async def destroy_record(
    provider: Provider,
    record: InstanceRecord,
    store: InstanceStore,
    *,
    snapshots: Snapshotter | None,
) -> None:
    """Destroy a recorded sandbox (raising if that fails), then delete snapshot and record."""
    with anyio.CancelScope(shield=True):
        with anyio.fail_after(DESTROY_TIMEOUT):
            await traced.destroy(provider, record.provider_sandbox_id, reason="discard")
        if record.latest_snapshot_id and snapshots is not None:
            await snapshots.delete(SnapshotRef(provider.name, record.latest_snapshot_id))
        await store.delete_instance(record.key)


async def release(
    sandbox: Sandbox,
    ensured: Ensured,
    ctx: RunContext,
    *,
    store: InstanceStore | None = None,
    outcome: Literal["completed", "failed", "aborted"] = "completed",
) -> None:
    """Call when a run ends: destroys the sandbox if ``destroy_on_complete`` (or the run was
    aborted), else takes the ``after-run`` snapshot if configured and refreshes the idle
    expiry that ``corral gc`` enforces."""
    provider = sandbox.get_provider()
    async with _store_for(store) as st, key_lock(st, ensured.key):
        record = await st.get_instance(ensured.key)
        snapshots = snapshotter_of(sandbox, provider)
        if record is None:
            return
        if sandbox.lifecycle.destroys_on_complete or outcome == "aborted":
            await destroy_record(provider, record, st, snapshots=snapshots)
            destroyed = True
        else:
            destroyed = False
            snap_id = record.latest_snapshot_id
            extra = dict(record.meta)
            if sandbox.lifecycle.snapshot == "after-run" and snapshots is not None:
                snap = await snapshots.snapshot(ensured.handle, f"after-run-{ctx.run_id}")
                if snap_id:
                    await snapshots.delete(SnapshotRef(provider.name, snap_id))
                snap_id = snap.id
                extra["snapshot_taken_at"] = time.time()
            keep = sandbox.lifecycle.keep_alive_seconds
            now = time.time()
            await st.upsert_instance(
                InstanceRecord(
                    key=record.key,
                    provider=record.provider,
                    provider_sandbox_id=record.provider_sandbox_id,
                    thread_id=record.thread_id,
                    updated_at=now,
                    latest_snapshot_id=snap_id,
                    latest_run_id=ctx.run_id,
                    expires_at=now + keep if keep is not None else None,
                    meta=extra,
                )
            )
    if destroyed:
        await call_hook(sandbox.hooks.on_destroy, "on_destroy", record)
