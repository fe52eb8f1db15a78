"""Store URLs: the default one, and what a ``sqlite://`` URL names (the forms are listed in
:mod:`corral.stores`). Light on purpose: ``corral ls`` reads a SQLite store with no more."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qsl

from corral._errors import ConfigError
from corral._paths import corral_home

__all__ = ["default_store_url", "sqlite_location"]

SYNCHRONOUS = ("off", "normal", "full", "extra")


def default_store_url() -> str:
    """``$CORRAL_STORE``, else the SQLite file ``$CORRAL_HOME/corral.db``."""
    configured = os.environ.get("CORRAL_STORE")
    if configured:
        return configured
    return f"sqlite://{corral_home() / 'corral.db'}"


def sqlite_location(url: str) -> tuple[Path, str] | None:
    """The file and ``synchronous`` setting a ``sqlite://`` URL names; ``None`` for another
    scheme. Raises :class:`~corral.ConfigError` for a SQLite URL corral cannot use."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme != "sqlite":
        return None
    rest, _, query = rest.partition("?")
    options = dict(parse_qsl(query, keep_blank_values=True))
    if not rest:
        raise ConfigError(f"store URL {url!r} names no file; use sqlite:///path/to.db")
    if rest.startswith("//"):
        rest = rest[1:]  # sqlite:////abs/path spelled SQLAlchemy-style
    unknown = set(options) - {"synchronous"}
    if unknown:
        raise ConfigError(
            f"store URL {url!r}: unknown option(s) {sorted(unknown)}; sqlite accepts synchronous"
        )
    synchronous = options.get("synchronous", "normal")
    if synchronous.lower() not in SYNCHRONOUS:
        raise ConfigError(f"store URL {url!r}: synchronous must be off, normal, full or extra")
    return Path(rest).expanduser(), synchronous
