"""Opening a store by URL (the forms are listed in :mod:`corral.stores`)."""

from __future__ import annotations

from urllib.parse import parse_qsl

from corral._errors import ConfigError
from corral.stores._protocols import Store
from corral.stores._sqlite import SQLiteStore
from corral.stores._url import default_store_url, sqlite_location

__all__ = ["open_store"]


async def open_store(url: str | None = None) -> Store:
    """Open the store at ``url`` (default: :func:`default_store_url`).

    Raises :class:`corral.ConfigError` for a URL corral cannot use, naming the forms
    it accepts, and :class:`~corral.stores.StoreError` for a store it cannot open (a
    PostgreSQL server out of reach, a store made by a newer corral), in one line with any
    password masked.
    """
    url = url or default_store_url()
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ConfigError(
            f"store URL {_masked(url)!r} has no scheme; use sqlite:///path/to.db, "
            "postgresql://user@host/dbname or memory://"
        )
    rest, _, query = rest.partition("?")
    options = dict(parse_qsl(query, keep_blank_values=True))
    if scheme == "memory":
        if rest or options:
            raise ConfigError(f"store URL {url!r}: memory:// takes no path or options")
        from corral.stores._memory import MemoryStore  # start-up cost: see _masked

        return MemoryStore()
    if scheme == "sqlite":
        location = sqlite_location(url)
        assert location is not None  # the scheme is sqlite
        path, synchronous = location
        # A typo in a URL must not grow a directory tree and an empty store somewhere:
        # only the default store's directory (CORRAL_HOME) is created, by corral_home().
        if not path.parent.is_dir():
            raise ConfigError(
                f"store URL {url!r}: directory {path.parent} does not exist; create it first "
                "or fix the path"
            )
        return SQLiteStore(path, synchronous=synchronous)
    if scheme in {"postgres", "postgresql"}:
        return await _open_postgres(url)
    if scheme == "redis":
        raise ConfigError(f"store URL {url!r}: the {scheme} backend is not available yet")
    raise ConfigError(
        f"store URL {_masked(url)!r}: unknown scheme {scheme!r}; use sqlite://, "
        "postgresql:// or memory://"
    )


def _masked(url: str) -> str:
    # Imported when a message needs it (a PostgreSQL URL may hold a password): start-up
    # cost of every command that opens a SQLite store (``corral attach``'s takeover: ~2%
    # of its imports with the memory store, measured).
    from corral.stores._pg_url import mask_url

    return mask_url(url)


async def _open_postgres(url: str) -> Store:
    # psycopg is imported here, on first use: sqlite users and `corral --version` never pay
    # for it (tests/test_cli_imports.py pins that).
    try:
        from corral.stores._postgres import PostgresStore
    except ImportError as exc:
        raise ConfigError(
            f"store URL {_masked(url)}: the PostgreSQL store needs psycopg ({exc.name} is "
            "not installed); pip install 'corral[postgres]'"
        ) from None
    return await PostgresStore.open(url)
