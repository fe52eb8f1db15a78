"""Store backends, opened by URL.

- ``memory://`` — one process (:class:`~corral.stores._memory.MemoryStore`).
- ``sqlite:///abs/path.db`` (or ``sqlite://relative.db``) — the embedded default
  (:class:`~corral.stores._sqlite.SQLiteStore`); query option ``?synchronous=full``.

The store protocols (:class:`Store` and its parts) and the run records are exported here
too.

The default URL is ``$CORRAL_STORE`` if set, else ``sqlite://$CORRAL_HOME/corral.db``. A
SQLite file's directory must exist (only ``$CORRAL_HOME`` is created on first use).
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qsl

from corral._errors import ConfigError
from corral._paths import corral_home
from corral.stores._protocols import (
    Claim,
    ClaimLost,
    ClaimRefused,
    ClaimStore,
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
    RunExists,
    RunStore,
    SpecTooLarge,
    Store,
    StoreError,
    UnknownRun,
)
from corral.stores._records import UNSET, RunError, RunPatch, RunRecord, RunStatus

__all__ = [
    "UNSET",
    "Claim",
    "ClaimLost",
    "ClaimRefused",
    "ClaimStore",
    "EventLog",
    "InstanceRecord",
    "InstanceStore",
    "InvalidEvent",
    "LockStore",
    "LogClosed",
    "LogTail",
    "LoggedEvent",
    "NewRun",
    "RefusalReason",
    "RunError",
    "RunExists",
    "RunPatch",
    "RunRecord",
    "RunStatus",
    "RunStore",
    "SpecTooLarge",
    "Store",
    "StoreError",
    "UnknownRun",
    "default_store_url",
    "open_store",
]


def default_store_url() -> str:
    """``$CORRAL_STORE``, else the SQLite file ``$CORRAL_HOME/corral.db``."""
    configured = os.environ.get("CORRAL_STORE")
    if configured:
        return configured
    return f"sqlite://{corral_home() / 'corral.db'}"


async def open_store(url: str | None = None) -> Store:
    """Open the store at ``url`` (default: :func:`default_store_url`).

    Raises :class:`~corral._errors.ConfigError` for a URL corral cannot use, naming the forms
    it accepts.
    """
    url = url or default_store_url()
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ConfigError(f"store URL {url!r} has no scheme; use sqlite:///path/to.db or memory://")
    rest, _, query = rest.partition("?")
    options = dict(parse_qsl(query, keep_blank_values=True))
    if scheme == "memory":
        if rest or options:
            raise ConfigError(f"store URL {url!r}: memory:// takes no path or options")
        from corral.stores._memory import MemoryStore

        return MemoryStore()
    if scheme == "sqlite":
        if not rest:
            raise ConfigError(f"store URL {url!r} names no file; use sqlite:///path/to.db")
        if rest.startswith("//"):
            rest = rest[1:]  # sqlite:////abs/path spelled SQLAlchemy-style
        unknown = set(options) - {"synchronous"}
        if unknown:
            raise ConfigError(
                f"store URL {url!r}: unknown option(s) {sorted(unknown)}; sqlite accepts synchronous"
            )
        from corral.stores._sqlite import SQLiteStore

        synchronous = options.get("synchronous", "normal")
        if synchronous.upper() not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
            raise ConfigError(
                f"store URL {url!r}: synchronous must be off, normal, full or extra"
            )
        path = Path(rest).expanduser()
        # A typo in a URL must not grow a directory tree and an empty store somewhere:
        # only the default store's directory (CORRAL_HOME) is created, by corral_home().
        if not path.parent.is_dir():
            raise ConfigError(
                f"store URL {url!r}: directory {path.parent} does not exist; create it first "
                "or fix the path"
            )
        return SQLiteStore(path, synchronous=synchronous)
    if scheme in {"postgres", "postgresql", "redis"}:
        raise ConfigError(f"store URL {url!r}: the {scheme} backend is not available yet")
    raise ConfigError(f"store URL {url!r}: unknown scheme {scheme!r}; use sqlite:// or memory://")
