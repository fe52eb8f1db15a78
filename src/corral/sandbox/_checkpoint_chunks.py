"""A checkpoint's content in the store: files cut into 1 MiB chunks named by their SHA-256,
each stored encoded (zlib where that saves a tenth or more) and put in batches, only the
chunks the store lacks; read back checked against its digest."""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import anyio.from_thread
import anyio.to_thread

from corral.stores._checkpoints import (
    CorruptCheckpoint,
)
from corral.stores._protocols import CheckpointStore

__all__ = [
    "BATCH_BYTES",
    "CHUNK_BYTES",
    "ChunkUploader",
    "decode",
    "encode",
]

CHUNK_BYTES: Final = 1 << 20
BATCH_BYTES: Final = 8 << 20
"""Chunk bytes sent to the store per ``put_chunks``, or fetched per ``get_chunks``."""
_ENCODED_RAW: Final = b"\x00"
_ENCODED_ZLIB: Final = b"\x01"


def encode(raw: bytes) -> bytes:
    # zlib spends ~70 ms per MiB on bytes that do not compress (binaries, archives): a
    # 4 KiB sample decides first
    sample = raw[:4096]
    if len(zlib.compress(sample, 1)) * 10 >= len(sample) * 9:
        return _ENCODED_RAW + raw
    packed = zlib.compress(raw, 1)
    if len(packed) * 10 < len(raw) * 9:
        return _ENCODED_ZLIB + packed
    return _ENCODED_RAW + raw


def decode(digest: str, stored: bytes) -> bytes:
    try:
        if stored[:1] == _ENCODED_ZLIB:
            raw = zlib.decompress(stored[1:])
        elif stored[:1] == _ENCODED_RAW:
            raw = stored[1:]
        else:
            raise ValueError("unknown encoding")
    except (zlib.error, ValueError) as exc:
        raise CorruptCheckpoint(f"chunk {digest} in the store is unreadable: {exc}") from None
    if hashlib.sha256(raw).hexdigest() != digest:
        raise CorruptCheckpoint(f"chunk {digest} in the store does not match its digest")
    return raw


@dataclass
class ChunkUploader:
    """Chunks waiting for the store, put in batches (only those it lacks). A full batch is
    put by a task in ``tg`` while the stream goes on (one batch in flight at a time), so
    the sandbox keeps reading while the store writes; the task's error is raised by the
    next :meth:`add` or :meth:`flush` (never through the task group)."""

    store: CheckpointStore
    now: float | None
    tg: Any = None
    pending: dict[str, bytes] = field(default_factory=dict)
    size: int = 0
    sent: int = 0
    _busy: anyio.Event | None = None
    _error: BaseException | None = None

    async def add(self, digest: str, raw: bytes) -> None:
        if digest in self.pending:
            return
        self.pending[digest] = raw
        self.size += len(raw)
        if self.size >= BATCH_BYTES:
            await self._wait()
            batch, self.pending, self.size = self.pending, {}, 0
            if self.tg is None:
                await self._put(batch)
            else:
                self._busy = anyio.Event()
                self.tg.start_soon(self._background, batch, self._busy)

    async def _wait(self) -> None:
        if self._busy is not None:
            await self._busy.wait()
            self._busy = None
        if self._error is not None:
            raise self._error

    async def _background(self, batch: dict[str, bytes], done: anyio.Event) -> None:
        try:
            await self._put(batch)
        except Exception as exc:  # raised in the stream's task by the next add/flush
            self._error = exc
        finally:
            done.set()

    async def _put(self, batch: dict[str, bytes]) -> None:
        missing = await self.store.missing_chunks(list(batch), now=self.now)
        if missing:
            encoded = await anyio.to_thread.run_sync(
                lambda: {d: encode(batch[d]) for d in missing})
            await self.store.put_chunks(encoded, now=self.now)
            self.sent += sum(len(v) for v in encoded.values())

    async def flush(self) -> None:
        await self._wait()
        if self.pending:
            batch, self.pending, self.size = self.pending, {}, 0
            await self._put(batch)
