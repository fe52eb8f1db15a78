"""The memory store's checkpoints (:class:`~corral.abc.CheckpointStore`), a mixin.

Each method runs without an ``await`` between its checks and its writes, so it is atomic on
the event loop: the collector and ``put_checkpoint`` cannot interleave.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from corral.stores._checkpoints import (
    CHUNK_GRACE,
    Checkpoint,
    CheckpointExists,
    CheckpointInfo,
    ChunkStats,
    MissingChunks,
    check_chunks,
    check_digest,
    manifest_from_bytes,
    manifest_to_bytes,
)

__all__ = ["CheckpointState", "MemoryCheckpoints"]


@dataclass
class CheckpointState:
    chunks: dict[str, tuple[bytes, float]] = field(default_factory=dict)
    """digest -> (data, when last put or touched)"""
    manifests: dict[str, tuple[str, bytes, float]] = field(default_factory=dict)
    """checkpoint id -> (thread id, stored form, created_at); dict order is the order they
    were put"""
    refs: dict[str, int] = field(default_factory=dict)
    """digest -> how many manifests name it"""


class MemoryCheckpoints:
    """Checkpoints in process memory (mixed into :class:`~corral.stores.MemoryStore`)."""

    _checkpoint_state: CheckpointState

    if TYPE_CHECKING:  # the host class provides it
        def _now(self, now: float | None) -> float: ...

    async def put_chunks(self, chunks: Mapping[str, bytes], *, now: float | None = None
                         ) -> None:
        check_chunks(chunks)
        at = self._now(now)
        held = self._checkpoint_state.chunks
        for digest, data in chunks.items():
            old = held.get(digest)
            held[digest] = (old[0] if old is not None else bytes(data), at)

    async def missing_chunks(self, digests: Collection[str], *, now: float | None = None
                             ) -> set[str]:
        at = self._now(now)
        held = self._checkpoint_state.chunks
        missing: set[str] = set()
        for digest in digests:
            check_digest(digest)
            got = held.get(digest)
            if got is None:
                missing.add(digest)
            else:
                held[digest] = (got[0], at)
        return missing

    async def get_chunks(self, digests: Collection[str]) -> dict[str, bytes]:
        held = self._checkpoint_state.chunks
        return {d: held[d][0] for d in digests if d in held}

    async def put_checkpoint(self, checkpoint: Checkpoint, *, now: float | None = None
                             ) -> None:
        state = self._checkpoint_state
        stored = manifest_to_bytes(checkpoint)  # the rules, and a copy sharing nothing
        if checkpoint.checkpoint_id in state.manifests:
            raise CheckpointExists(checkpoint.checkpoint_id)
        digests = checkpoint.digests()
        missing = {d for d in digests if d not in state.chunks}
        if missing:
            raise MissingChunks(checkpoint.checkpoint_id, missing)
        at = self._now(now)
        for d in digests:
            state.chunks[d] = (state.chunks[d][0], at)
            state.refs[d] = state.refs.get(d, 0) + 1
        state.manifests[checkpoint.checkpoint_id] = (checkpoint.thread_id, stored,
                                                     float(checkpoint.created_at))

    async def get_checkpoint(self, checkpoint_id: str) -> Checkpoint | None:
        got = self._checkpoint_state.manifests.get(checkpoint_id)
        return None if got is None else manifest_from_bytes(got[1])

    async def list_checkpoints(self, thread_id: str) -> list[CheckpointInfo]:
        found = [manifest_from_bytes(data) for tid, data, _at in
                 self._checkpoint_state.manifests.values() if tid == thread_id]
        # stable: ties keep the order they were put in
        return [cp.info() for cp in sorted(found, key=lambda cp: cp.created_at)]

    async def delete_checkpoint(self, checkpoint_id: str) -> bool:
        state = self._checkpoint_state
        got = state.manifests.pop(checkpoint_id, None)
        if got is None:
            return False
        for d in manifest_from_bytes(got[1]).digests():
            left = state.refs.get(d, 0) - 1
            if left > 0:
                state.refs[d] = left
            else:
                state.refs.pop(d, None)
        return True

    async def collect_chunks(self, *, grace: float = CHUNK_GRACE, now: float | None = None
                             ) -> int:
        cutoff = self._now(now) - grace
        state = self._checkpoint_state
        doomed = [d for d, (_data, at) in state.chunks.items()
                  if at < cutoff and d not in state.refs]
        for d in doomed:
            del state.chunks[d]
        return len(doomed)

    async def chunk_stats(self) -> ChunkStats:
        held = self._checkpoint_state.chunks
        return ChunkStats(len(held), sum(len(data) for data, _at in held.values()))
