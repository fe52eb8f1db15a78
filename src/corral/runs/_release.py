"""A run's sandbox from its record: the definition rebuilt on any host, and its release at
the run's end (destroy it, or snapshot/keep it for the thread's next run)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from corral._log import library_logger
from corral._telemetry import span
from corral._errors import ConfigError
from corral.runs._spec import run_spec_of
from corral.sandbox._contracts import Provider
from corral.stores._protocols import Store
from corral.stores._records import RunRecord
from corral.sandbox import _traced as traced

if TYPE_CHECKING:
    from corral.sandbox._definition import Sandbox

__all__ = ["definition_of", "release_sandbox"]

log = library_logger("corral.runs._runner")


def definition_of(record: RunRecord) -> Sandbox | None:
    """Rebuild the run's sandbox definition from its record (secrets are read again from
    this host's environment; without them the definition is used secret-less)."""
    data = run_spec_of(record).sandbox
    if data is None:
        return None
    # Imported here for start-up cost: the sandbox machinery (ensure, bootstrap, policy) is
    # for a run's end, not for a driver taking a run over (``corral attach``).
    from corral.sandbox._definition import Sandbox

    try:
        return Sandbox.from_dict(data)
    except ConfigError as exc:
        if not data.get("secrets"):
            log.error("run %s: its sandbox definition is unusable: %s", record.run_id, exc)
            return None
        log.warning("run %s: secrets unavailable on this host (%s); events from here on "
                    "are redacted only for secrets this host knows", record.run_id, exc)
        try:
            return Sandbox.from_dict({k: v for k, v in data.items() if k != "secrets"})
        except ConfigError:
            return None


async def release_sandbox(store: Store, record: RunRecord, outcome: str, *,
                          provider_for: Callable[[str], Provider]) -> None:
    """Apply the run's lifecycle to its sandbox: destroy it (``destroy_on_complete`` or
    an aborted run), or snapshot/keep it for the next run of the thread."""
    with span("sandbox.release", {"corral.run.id": record.run_id,
                                  "corral.run.status": outcome}):
        await _release_sandbox(store, record, outcome, provider_for=provider_for)


async def _release_sandbox(store: Store, record: RunRecord, outcome: str, *,
                           provider_for: Callable[[str], Provider]) -> None:
    # here for start-up cost, as in definition_of
    from corral.sandbox._ensure import Ensured, destroy_record, release, snapshotter_of
    from corral.sandbox._key import RunContext as SandboxContext

    sandbox = definition_of(record)
    key = record.sandbox_key
    if sandbox is not None and key is None:
        # The starter died between making the sandbox and recording its key.
        key = sandbox.key(SandboxContext(thread_id=record.thread_id, run_id=record.run_id))
    if sandbox is None or key is None:
        ref = record.sandbox_ref or {}
        name, sandbox_id = ref.get("provider"), ref.get("id")
        if isinstance(name, str) and isinstance(sandbox_id, str):
            await traced.destroy(provider_for(name), sandbox_id, reason="release")
        return
    instance = await store.get_instance(key)
    if instance is None:
        return
    provider = sandbox.get_provider()
    if instance.latest_run_id not in (None, record.run_id) and instance.latest_run_id:
        latest = await store.get(instance.latest_run_id)
        if latest is not None and not latest.terminal and outcome != "aborted":
            return  # a later run of the thread uses this sandbox now
    if sandbox.lifecycle.destroys_on_complete or outcome == "aborted":
        await destroy_record(
            provider, instance, store, snapshots=snapshotter_of(sandbox, provider)
        )
        return
    handle = await provider.resume(instance.provider_sandbox_id)
    if handle is None:
        await store.delete_instance(key)
        return
    ensured = Ensured(handle, key, instance, "resumed", sandbox.secrets)
    sctx = SandboxContext(thread_id=record.thread_id, run_id=record.run_id)
    status = outcome if outcome in ("completed", "failed", "aborted") else "failed"
    await release(sandbox, ensured, sctx, store=store, outcome=status)  # type: ignore[arg-type]
