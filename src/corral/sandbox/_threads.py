"""A thread's state in the store (#27): which checkpoint holds it, and how a sandbox gets it.

A thread is a conversation with an agent over one workspace, turn after turn (each turn a
run). Its state lives in the store, so any host serves its next turn:

* its **checkpoints** (:mod:`corral.sandbox._checkpoint`): the workspace after each turn,
  plus the agent CLI's saved session of that moment (the redacted copy the session store
  holds, carried as a :class:`~corral.stores.SessionPart` whose chunks share the
  workspace's chunk store). A thread's first turn records the state before it (the
  bootstrapped workspace, ``run_id`` ``None``, ``meta.initial``).
* the **head**: the thread's newest checkpoint is its current state. A fresh sandbox of the
  thread (another host's, a deleted container's replacement, a fork) gets the head's
  workspace (:func:`restore_head`); the conversation comes from the session store.

Undo and fork copy a manifest under a new id (its chunks are shared, nothing is read
again), so the head moves without losing history: the copy keeps the ``run_id`` whose
state it holds.
"""

from __future__ import annotations

import hashlib
import posixpath
import time
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Final

import anyio

from corral._errors import CorralError
from corral.sandbox._checkpoint import checkpoint_workspace, restore_checkpoint
from corral.sandbox._checkpoint_chunks import CHUNK_BYTES, decode, encode
from corral.sandbox._contracts import Handle
from corral.sandbox._key import RunContext
from corral.sandbox._redact import Redactor, get_logger
from corral.stores._checkpoints import (
    Checkpoint,
    CheckpointEntry,
    CheckpointInfo,
    CorruptCheckpoint,
    SessionPart,
    ThreadHead,
)
from corral.stores._protocols import CheckpointStore, RunStore, StoredSession, ThreadStore

__all__ = [
    "SESSION_ROOT",
    "copy_checkpoint",
    "current_head",
    "head_of",
    "initial_checkpoint",
    "last_turn_recorded",
    "restore_head",
    "session_of",
    "session_part",
    "thread_checkpoints",
]

log = get_logger("corral.sandbox._threads")

SESSION_ROOT: Final = "/home/agent"
"""Where a saved session's files live in the sandbox (the agent's home): the root of a
checkpoint's session part."""


LAST_TURN_WAIT: Final = 60.0
"""Seconds to wait for a thread's last turn's checkpoint (taken after that run's end is
logged, so a client can ask for the next turn, an undo or a fork first)."""


async def current_head(store: object, thread_id: str, *, but: str | None = None,
                       wait: float = LAST_TURN_WAIT) -> ThreadHead | None:
    """The thread's head checkpoint and its latest run (other than run ``but``), once
    that run's checkpoint is written on its record, or its failure to (waiting for it,
    bounded by ``wait``), so what comes next starts from it rather than from the turn
    before. One store read (:meth:`~corral.abc.ThreadStore.thread_head`) when nothing is
    pending. ``None`` for a store that keeps neither runs nor checkpoints."""
    if not isinstance(store, RunStore):
        return None
    deadline = time.monotonic() + wait
    while True:
        head = await _read_head(store, thread_id, but)
        last = head.last_run
        if last is None or last.thread_id == last.run_id or not last.terminal \
                or last.status.value == "aborted" or last.checkpoint is not None \
                or last.finished_at is None or last.finished_at < time.time() - 600:
            return head
        if time.monotonic() >= deadline:
            log.warning("thread %s: run %s's checkpoint is not written after %g s; "
                        "going on from the thread's last checkpoint", thread_id,
                        last.run_id, wait)
            return head
        await anyio.sleep(0.1)


async def _read_head(store: RunStore, thread_id: str, but: str | None) -> ThreadHead:
    if isinstance(store, ThreadStore):
        return await store.thread_head(thread_id, but=but)
    # a store without the one-read method: the same answer in three
    runs = [r for r in await store.list_by_thread(thread_id) if r.run_id != but]
    checkpoint = None
    if isinstance(store, CheckpointStore):
        infos = await store.list_checkpoints(thread_id)
        checkpoint = await store.get_checkpoint(infos[-1].checkpoint_id) if infos else None
    return ThreadHead(checkpoint, runs[-1] if runs else None)


async def last_turn_recorded(store: object, thread_id: str, *, but: str | None = None,
                             wait: float = LAST_TURN_WAIT) -> None:
    """Wait (bounded by ``wait``) until the thread's latest finished turn (other than run
    ``but``) has its checkpoint written on its record, or its failure to
    (:func:`current_head`)."""
    await current_head(store, thread_id, but=but, wait=wait)


def thread_checkpoints(store: object) -> CheckpointStore | None:
    """``store`` as a checkpoint store, or ``None`` when it keeps no checkpoints."""
    return store if isinstance(store, CheckpointStore) else None


async def head_of(store: CheckpointStore, thread_id: str) -> CheckpointInfo | None:
    """The thread's current state: its newest checkpoint, or ``None``."""
    infos = await store.list_checkpoints(thread_id)
    return infos[-1] if infos else None


async def session_part(store: CheckpointStore, session: StoredSession) -> SessionPart:
    """``session``'s files as a checkpoint's session part: their chunks put in ``store``
    (only those it lacks), the entries rooted at the sandbox home."""
    entries: dict[str, CheckpointEntry] = {}
    chunks: dict[str, bytes] = {}
    for rel in sorted(session.files):
        parts = rel.split("/")
        for i in range(1, len(parts)):
            d = "/".join(parts[:i])
            entries.setdefault(d, CheckpointEntry(d, "dir", 0o700))
        data = session.files[rel]
        digests = []
        for at in range(0, len(data), CHUNK_BYTES):
            piece = data[at:at + CHUNK_BYTES]
            digest = hashlib.sha256(piece).hexdigest()
            chunks[digest] = piece
            digests.append(digest)
        entries[rel] = CheckpointEntry(rel, "file", 0o600, len(data), tuple(digests))
    if chunks:
        missing = await store.missing_chunks(list(chunks))
        if missing:
            encoded = await anyio.to_thread.run_sync(
                lambda: {d: encode(chunks[d]) for d in missing})
            await store.put_chunks(encoded)
    ordered = tuple(sorted(entries.values(), key=lambda e: (e.path.count("/"), e.path)))
    return SessionPart(session.harness, session.session_id or "", SESSION_ROOT, ordered)


async def session_of(store: CheckpointStore, part: SessionPart, thread_id: str,
                     run_id: str | None = None) -> StoredSession:
    """The saved session a checkpoint's session part holds, for ``thread_id``."""
    files = [e for e in part.entries if e.kind == "file" and e.skipped is None]
    wanted = {d for e in files for d in e.chunks}
    got = await store.get_chunks(wanted) if wanted else {}
    if wanted - set(got):
        raise CorruptCheckpoint(f"the store lacks {len(wanted - set(got))} chunk(s) of a "
                                "saved session")
    raw = {d: decode(d, data) for d, data in got.items()}
    out = {e.path: b"".join(raw[d] for d in e.chunks) for e in files}
    if posixpath.normpath(part.root) != SESSION_ROOT:
        raise CorruptCheckpoint(f"a saved session rooted at {part.root[:200]!r}, not the "
                                "sandbox home")
    return StoredSession(thread_id, part.harness, part.session_id or None, out, time.time(),
                         run_id)


async def copy_checkpoint(store: CheckpointStore, source: Checkpoint, *, thread_id: str,
                          meta: Mapping[str, Any]) -> Checkpoint:
    """``source``'s manifest under a new id for ``thread_id`` (its chunks are shared):
    the thread's new head. The copy keeps the ``run_id`` whose state it holds."""
    copy = replace(source, checkpoint_id=f"ckpt-{uuid.uuid4().hex}", thread_id=thread_id,
                   created_at=time.time(), parent_id=source.checkpoint_id,
                   meta={**dict(source.meta), **dict(meta)})
    await store.put_checkpoint(copy)
    return copy


def lineage(definition_id: str, workspace_hash: str) -> str:
    """What a thread's checkpoints must share with a sandbox to be restored into it: the
    same definition over the same workspace source (a turn on another definition of the
    same thread starts from its own workspace, never from another definition's files)."""
    return hashlib.sha256(f"{definition_id}\0{workspace_hash}".encode()).hexdigest()[:32]


async def restore_head(handle: Handle, store: CheckpointStore, ctx: RunContext,
                       head: Checkpoint | None, *, of: str | None = None,
                       bootstrapped: bool = False) -> str | None:
    """Make a fresh sandbox's workspace the thread's ``head`` checkpoint (its files as the
    last turn left them, on whatever host that ran: :func:`current_head`); returns the
    checkpoint id, or ``None`` when the thread has none (or, with ``of``, when its head is
    of another :func:`lineage`). ``bootstrapped``: the sandbox was just made and
    bootstrapped from that lineage, so a head that is the thread's initial state needs no
    copy. Raises what :func:`restore_checkpoint` raises."""
    if head is None:
        return None
    if of is not None:
        if head.meta.get("lineage") != of:
            return None
        if bootstrapped and head.meta.get("initial"):
            # the state before the thread's first turn is what a sandbox of this lineage
            # holds right after its bootstrap: nothing to copy (an ensure per turn stays
            # as cheap as before threads, while the thread has no turn recorded)
            return head.checkpoint_id
    await restore_checkpoint(handle, store, head, session=False)
    log.info("thread %s: workspace restored from checkpoint %s", ctx.thread_id,
             head.checkpoint_id)
    return head.checkpoint_id


async def initial_checkpoint(handle: Handle, store: CheckpointStore, ctx: RunContext, *,
                             secrets: Redactor, max_bytes: int,
                             extra_meta: Mapping[str, str] | None = None
                             ) -> Checkpoint | None:
    """Record the state before the thread's first turn (what undo of that turn brings
    back). Never raises: a failure is logged, and undo of the first turn is then refused."""
    try:
        return await checkpoint_workspace(
            handle, store, thread_id=ctx.thread_id, run_id=None, secrets=secrets,
            max_bytes=max_bytes, on_too_large="skip",
            meta={"initial": True, "before_run": ctx.run_id, **(extra_meta or {})})
    except (CorralError, OSError) as exc:
        log.warning("thread %s: the state before its first turn was not recorded: %s",
                    ctx.thread_id, exc)
        return None
