"""Store backends, opened by URL.

- ``memory://`` — one process (:class:`MemoryStore`).
- ``sqlite:///abs/path.db`` (or ``sqlite://relative.db``) — the embedded default
  (:class:`SQLiteStore`); query option ``?synchronous=full``.
- ``postgresql://user:password@host:5432/dbname`` (or ``postgres://…``) — many hosts share
  runs (:class:`PostgresStore`; needs ``pip install 'corral[postgres]'``). Any libpq URI:
  several ``host:port`` pairs, and libpq's parameters (``?sslmode=verify-full``,
  ``connect_timeout``, ``options``…) pass through. corral's own options: ``schema=NAME``
  (the PostgreSQL schema for corral's tables, default ``public``), ``pool_min=N`` and
  ``pool_max=N`` (connections each store keeps open / may open, default 1 and 10). Messages
  show the URL with its password masked.

The store protocols (``Store`` and its parts, among them ``SessionStore``: agent CLIs' saved
sessions per thread) are in :mod:`corral.abc`; their records, errors and the checkpoint values
(:class:`Checkpoint`, its entries, the chunk store's errors; #27) are exported here.

The default URL is ``$CORRAL_STORE`` if set, else ``sqlite://$CORRAL_HOME/corral.db``. A
SQLite file's directory must exist (only ``$CORRAL_HOME`` is created on first use).
"""

from __future__ import annotations

from corral._lazy import TYPE_CHECKING, lazy_namespace

# Protocols live in corral.abc only: their old names here resolve with a warning
_MOVED = dict.fromkeys((
    "ApprovalStore", "CheckpointStore", "SecretStore", "SessionStore", "ClaimStore",
    "Diagnosable", "EventLog", "InstanceStore", "LockStore", "RunStore", "Store",
), "corral.abc")

# The public names, listed once: resolved on first use (corral._lazy)
if TYPE_CHECKING or not lazy_namespace(globals(), moved=_MOVED):
    from corral.stores._checkpoints import (
        CHUNK_GRACE as CHUNK_GRACE,
        Checkpoint as Checkpoint,
        CheckpointEntry as CheckpointEntry,
        CheckpointExists as CheckpointExists,
        CheckpointInfo as CheckpointInfo,
        ChunkStats as ChunkStats,
        CorruptCheckpoint as CorruptCheckpoint,
        MissingChunks as MissingChunks,
        SessionPart as SessionPart,
        ThreadHead as ThreadHead,
        UnknownCheckpoint as UnknownCheckpoint,
    )
    from corral.stores._memory import MemoryStore as MemoryStore
    from corral.stores._open import open_store as open_store
    from corral.stores._url import default_store_url as default_store_url
    from corral.stores._postgres import PostgresStore as PostgresStore
    from corral.stores._protocols import (
        ApprovalAnswer as ApprovalAnswer,
        ApprovalExists as ApprovalExists,
        ApprovalRequest as ApprovalRequest,
        InvalidSession as InvalidSession,
        SessionInfo as SessionInfo,
        SessionLimits as SessionLimits,
        SessionTooLarge as SessionTooLarge,
        StoredSession as StoredSession,
        UnknownApproval as UnknownApproval,
        Claim as Claim,
        ClaimLost as ClaimLost,
        ClaimRefused as ClaimRefused,
        InstanceRecord as InstanceRecord,
        InvalidEvent as InvalidEvent,
        LogClosed as LogClosed,
        LoggedEvent as LoggedEvent,
        LogTail as LogTail,
        NewRun as NewRun,
        RefusalReason as RefusalReason,
        RunActive as RunActive,
        RunExists as RunExists,
        SpecTooLarge as SpecTooLarge,
        StoreError as StoreError,
        StoreUnavailable as StoreUnavailable,
        UnknownRun as UnknownRun,
    )
    from corral.stores._records import (
        UNSET as UNSET,
        RunError as RunError,
        RunPatch as RunPatch,
        RunRecord as RunRecord,
        RunStatus as RunStatus,
    )
    from corral.stores._sqlite import SQLiteStore as SQLiteStore
