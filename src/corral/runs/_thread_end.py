"""A turn's end for its thread (#27): a checkpoint of the workspace and of the saved agent
session, in the store, where any host's next turn, undo and fork find it.

Taken when a run of a named thread ends ``completed`` or ``failed`` (an ``aborted`` run's
sandbox is destroyed and its turn not kept: the thread's head stays the previous turn's
state), after the agent's session was saved and before the lifecycle may destroy the
sandbox. Bounded in time and never failing the run: what happened is written on the run's
record (``checkpoint``: ``{"id", "bytes"}``, ``{"skipped": why}`` or ``{"error": why}``)
and logged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from corral._errors import CorralError
from corral._log import library_logger
from corral.runs._release import definition_of
from corral.runs._spec import run_spec_of
from corral.sandbox._checkpoint import CheckpointTooLarge, checkpoint_workspace
from corral.sandbox._contracts import Provider
from corral.sandbox._redact import Redactor
from corral.sandbox._threads import lineage, session_part
from corral.stores._protocols import Store, StoreError
from corral.stores._records import RunPatch, RunRecord

__all__ = ["CHECKPOINT_TIMEOUT", "checkpoint_turn"]

log = library_logger("corral.runs._runner")

CHECKPOINT_TIMEOUT = 300.0
"""Seconds a turn's checkpoint may take before it is given up (the run is already over)."""


async def checkpoint_turn(store: Store, record: RunRecord, outcome: str, *,
                          provider_for: Callable[[str], Provider],
                          redactor: Redactor | None) -> dict[str, Any] | None:
    """Checkpoint the thread of ``record`` after its turn (see the module docstring);
    returns what was written on the record, ``None`` when the run takes none. Never
    raises (but for cancellation)."""
    if outcome not in ("completed", "failed") or record.thread_id == record.run_id:
        return None
    # Always a note on the record: the thread's next turn waits for it.
    sandbox = definition_of(record)
    note: dict[str, Any]
    if sandbox is None:
        note = {"error": "the run's sandbox definition is unusable on this host"}
    elif sandbox.lifecycle.checkpoint == "none":
        note = {"skipped": "checkpoints are off (lifecycle.checkpoint = \"none\")"}
    else:
        note = await _bounded(store, record, sandbox, provider_for, redactor)
    if "error" in note:
        log.warning("run %s: no checkpoint of thread %s: %s", record.run_id,
                    record.thread_id, note["error"])
    try:
        await store.update(record.run_id, RunPatch(checkpoint=note))
    except StoreError as exc:
        log.warning("run %s: recording its checkpoint failed: %s", record.run_id, exc)
    return note


async def _bounded(store: Store, record: RunRecord, sandbox: Any,
                   provider_for: Callable[[str], Provider],
                   redactor: Redactor | None) -> dict[str, Any]:
    note: dict[str, Any]
    with anyio.move_on_after(CHECKPOINT_TIMEOUT) as scope:
        try:
            note = await _checkpoint(store, record, sandbox, provider_for, redactor)
        except (CorralError, OSError) as exc:
            note = {"error": str(exc)[:500]}
    if scope.cancelled_caught:
        note = {"error": f"the checkpoint took longer than {CHECKPOINT_TIMEOUT:g} s"}
    return note


async def _checkpoint(store: Store, record: RunRecord, sandbox: Any,
                      provider_for: Callable[[str], Provider],
                      redactor: Redactor | None) -> dict[str, Any]:
    # A host that does not know every secret of the run cannot keep them out of the
    # checkpoint (as it saves no session): it takes none.
    known = {name for name, _ in redactor.items()} if redactor is not None else set()
    unknown = sorted(set(run_spec_of(record).secret_names) - known)
    if unknown:
        return {"error": f"this host does not know the run's secret(s) "
                         f"{', '.join(unknown)}, so it cannot keep them out of a checkpoint"}
    ref = record.sandbox_ref or {}
    name, sandbox_id = ref.get("provider"), ref.get("id")
    if not isinstance(name, str) or not isinstance(sandbox_id, str):
        return {"error": "the run has no sandbox"}
    handle = await provider_for(name).resume(sandbox_id)
    if handle is None:
        return {"error": "the run's sandbox is unreachable from this host"}
    part = None
    if record.harness not in (None, "command"):
        saved = await store.get_session(record.thread_id, record.harness)
        if saved is not None:
            part = await session_part(store, saved)
    parent = (await store.thread_head(record.thread_id)).checkpoint
    lifecycle = sandbox.lifecycle
    try:
        cp = await checkpoint_workspace(
            handle, store, thread_id=record.thread_id, run_id=record.run_id,
            secrets=redactor if redactor is not None else (),
            max_bytes=lifecycle.checkpoint_max_bytes,
            on_too_large=lifecycle.on_checkpoint_too_large, parent=parent,
            session_part=part, meta={"outcome": record.status.value,
                                     "lineage": lineage(sandbox.id, sandbox.workspace.hash())})
    except CheckpointTooLarge as exc:
        return {"error": str(exc)}
    if cp is None:
        return {"skipped": "the workspace is over the checkpoint size cap "
                           f"({lifecycle.checkpoint_max_bytes} bytes)"}
    return {"id": cp.checkpoint_id, "bytes": cp.total_bytes,
            **({"session": cp.session.harness} if cp.session is not None else {})}
