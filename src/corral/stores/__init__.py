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

The store protocols (:class:`Store` and its parts, among them :class:`SessionStore`: agent
CLIs' saved sessions per thread), their records and the checkpoint values
(:class:`Checkpoint`, its entries, the chunk store's errors; #27) are exported here too.

The default URL is ``$CORRAL_STORE`` if set, else ``sqlite://$CORRAL_HOME/corral.db``. A
SQLite file's directory must exist (only ``$CORRAL_HOME`` is created on first use).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral._lazy import lazy_exports

if TYPE_CHECKING:
    from corral.stores._checkpoints import (
        CHUNK_GRACE,
        Checkpoint,
        CheckpointEntry,
        CheckpointExists,
        CheckpointInfo,
        ChunkStats,
        CorruptCheckpoint,
        MissingChunks,
        SessionPart,
        ThreadHead,
        UnknownCheckpoint,
    )
    from corral.stores._memory import MemoryStore
    from corral.stores._open import open_store
    from corral.stores._url import default_store_url
    from corral.stores._postgres import PostgresStore
    from corral.stores._protocols import (
        ApprovalAnswer,
        ApprovalExists,
        ApprovalRequest,
        ApprovalStore,
        CheckpointStore,
        InvalidSession,
        SecretStore,
        SessionInfo,
        SessionLimits,
        SessionStore,
        SessionTooLarge,
        StoredSession,
        ThreadStore,
        UnknownApproval,
        Claim,
        ClaimLost,
        ClaimRefused,
        ClaimStore,
        Diagnosable,
        EventLog,
        InstanceRecord,
        InstanceStore,
        InvalidEvent,
        LockStore,
        LogClosed,
        LoggedEvent,
        LogTail,
        NewRun,
        RefusalReason,
        RunActive,
        RunExists,
        RunStore,
        SpecTooLarge,
        Store,
        StoreError,
        StoreUnavailable,
        UnknownRun,
    )
    from corral.stores._records import UNSET, RunError, RunPatch, RunRecord, RunStatus
    from corral.stores._sqlite import SQLiteStore

# Names resolve on first use (corral._lazy), named for this namespace.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(
        (
            "ApprovalAnswer",
            "ApprovalExists",
            "ApprovalRequest",
            "ApprovalStore",
            "CheckpointStore",
            "InvalidSession",
            "SecretStore",
            "SessionInfo",
            "SessionLimits",
            "SessionStore",
            "SessionTooLarge",
            "StoredSession",
            "ThreadStore",
            "UnknownApproval",
            "Claim",
            "ClaimLost",
            "ClaimRefused",
            "ClaimStore",
            "Diagnosable",
            "EventLog",
            "InstanceRecord",
            "InstanceStore",
            "InvalidEvent",
            "LockStore",
            "LogClosed",
            "LoggedEvent",
            "LogTail",
            "NewRun",
            "RefusalReason",
            "RunActive",
            "RunExists",
            "RunStore",
            "SpecTooLarge",
            "Store",
            "StoreError",
            "StoreUnavailable",
            "UnknownRun",
        ),
        "corral.stores._protocols",
    ),
    **dict.fromkeys(
        ("UNSET", "RunError", "RunPatch", "RunRecord", "RunStatus"), "corral.stores._records"
    ),
    **dict.fromkeys(
        ("CHUNK_GRACE", "Checkpoint", "CheckpointEntry", "CheckpointExists", "CheckpointInfo",
         "ChunkStats", "CorruptCheckpoint", "MissingChunks", "SessionPart", "ThreadHead",
         "UnknownCheckpoint"),
        "corral.stores._checkpoints",
    ),
    "MemoryStore": "corral.stores._memory",
    "SQLiteStore": "corral.stores._sqlite",
    "PostgresStore": "corral.stores._postgres",
    "default_store_url": "corral.stores._url",
    "open_store": "corral.stores._open",
}
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

__all__ = [
    "ApprovalAnswer",
    "ApprovalExists",
    "ApprovalRequest",
    "ApprovalStore",
    "CHUNK_GRACE",
    "Checkpoint",
    "CheckpointEntry",
    "CheckpointExists",
    "CheckpointInfo",
    "CheckpointStore",
    "ChunkStats",
    "CorruptCheckpoint",
    "MissingChunks",
    "SessionPart",
    "ThreadHead",
    "UnknownCheckpoint",
    "InvalidSession",
    "SecretStore",
    "SessionInfo",
    "SessionLimits",
    "SessionStore",
    "SessionTooLarge",
    "StoredSession",
    "ThreadStore",
    "UnknownApproval",
    "Claim",
    "ClaimLost",
    "ClaimRefused",
    "ClaimStore",
    "Diagnosable",
    "EventLog",
    "InstanceRecord",
    "InstanceStore",
    "InvalidEvent",
    "LockStore",
    "LogClosed",
    "LogTail",
    "LoggedEvent",
    "MemoryStore",
    "NewRun",
    "PostgresStore",
    "RefusalReason",
    "RunActive",
    "RunError",
    "RunExists",
    "RunPatch",
    "RunRecord",
    "RunStatus",
    "RunStore",
    "SQLiteStore",
    "SpecTooLarge",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "UNSET",
    "UnknownRun",
    "default_store_url",
    "open_store",
]
