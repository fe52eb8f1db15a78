"""PostgreSQL store URLs: corral's own options split from libpq's, and passwords masked.

A URL is a libpq connection URI (``postgresql://`` or ``postgres://``, user, password, hosts,
ports, database, and libpq's query parameters such as ``sslmode``) plus corral's options,
which are removed before the rest reaches libpq:

- ``schema=NAME``: the PostgreSQL schema holding corral's tables (default ``public``),
- ``pool_min=N`` / ``pool_max=N``: connections each store keeps open / may open (1 / 10),
- ``pool_wait=S``: seconds a call waits for a free pooled connection (30),
- ``outage_wait=S``: seconds a call keeps retrying while the server cannot be reached at all
  (a restart, a failover) before it fails with :class:`~corral.stores.StoreUnavailable`
  (600; 0 fails at once). Drivers wait an outage out instead of failing their runs.

Nothing here imports psycopg until a URL is parsed, and the masked form (the password
replaced by ``***``) is the only form that ever reaches a message or a log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import unquote

from corral._errors import ConfigError

__all__ = ["PgTarget", "mask_url", "parse_postgres_url"]

SCHEMES: Final = ("postgresql", "postgres")
CORRAL_OPTIONS: Final = ("schema", "pool_min", "pool_max", "pool_wait", "outage_wait")
_SCHEMA_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_MASK: Final = "***"


@dataclass(frozen=True)
class PgTarget:
    """Where a PostgreSQL store lives and how to reach it."""

    conninfo: str
    """The libpq URI, corral's options removed (holds the password: never print it)."""
    url: str
    """The URL as given, password masked: the store's ``url`` and the form in messages."""
    where: str
    """``scheme://user@host:port/db``, password masked, no options: for short messages."""
    schema: str = "public"
    pool_min: int = 1
    pool_max: int = 10
    pool_wait: int = 30
    outage_wait: int = 600
    password: str | None = field(default=None, repr=False)
    """The password, if the URL carries one, so messages can be scrubbed of it."""
    defaults: dict[str, str] = field(default_factory=dict)
    """libpq parameters corral sets when the URL does not (``connect_timeout``,
    ``application_name``)."""

    def dsn(self, **extra: str | int) -> str:
        """The connection string for libpq: the URI, corral's defaults and ``extra``."""
        from psycopg.conninfo import make_conninfo

        return make_conninfo(self.conninfo, **{**self.defaults, **extra})

    def scrub(self, text: str) -> str:
        """``text`` with the password (should libpq ever echo it) replaced by ``***``."""
        if self.password:
            text = text.replace(self.password, _MASK)
        return text


def _split_query(query: str) -> list[tuple[str, str, str]]:
    """``(decoded key, decoded value, raw pair)`` for each ``k=v`` of a query string, kept
    raw so the pairs corral passes on reach libpq exactly as written."""
    pairs = []
    for raw in query.split("&"):
        if not raw:
            continue
        key, _, value = raw.partition("=")
        pairs.append((unquote(key), unquote(value), raw))
    return pairs


def mask_url(url: str) -> str:
    """``url`` with any password (in the user info or a ``password=`` option) as ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    rest, qsep, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        userinfo = userinfo.partition(":")[0] + ":" + _MASK
    netloc = f"{userinfo}{at}{hosts}"
    if qsep:
        masked = []
        for key, _value, raw in _split_query(query):
            masked.append(f"{raw.partition('=')[0]}={_MASK}" if key == "password" else raw)
        query = "&".join(masked)
    return f"{scheme}://{netloc}{slash}{path}{qsep}{query}"


def _int_option(url: str, name: str, value: str, low: int, high: int) -> int:
    if not re.fullmatch(r"[0-9]{1,6}", value) or not low <= int(value) <= high:
        raise ConfigError(
            f"store URL {url}: {name} must be a whole number from {low} to {high}, got {value!r}"
        )
    return int(value)


def _libpq_keywords() -> frozenset[str]:
    from psycopg import pq

    return frozenset(o.keyword.decode() for o in pq.Conninfo.get_defaults())


def parse_postgres_url(url: str) -> PgTarget:
    """Split ``url`` into libpq's connection URI and corral's options; raises
    :class:`~corral.ConfigError` (one line, password masked) for anything libpq or corral
    would not accept."""
    shown = mask_url(url)
    scheme, sep, rest = url.partition("://")
    if scheme not in SCHEMES or not sep:
        raise ConfigError(f"store URL {shown}: expected postgresql://user@host:port/dbname")
    base, _, query = rest.partition("?")
    options: dict[str, str] = {}
    passed: list[str] = []
    passed_keys: set[str] = set()
    unknown: list[str] = []
    known = _libpq_keywords()
    for key, value, raw in _split_query(query):
        if key in CORRAL_OPTIONS:
            if key in options:
                raise ConfigError(f"store URL {shown}: option {key} is given twice")
            options[key] = value
        elif key in known:
            passed.append(raw)
            passed_keys.add(key)
        else:
            unknown.append(key)
    if unknown:
        raise ConfigError(
            f"store URL {shown}: unknown option(s) {', '.join(sorted(unknown))}; corral takes "
            f"{', '.join(CORRAL_OPTIONS)} and libpq's connection parameters (sslmode, "
            "connect_timeout, …)"
        )
    schema = options.get("schema", "public")
    if not _SCHEMA_NAME.fullmatch(schema) or schema.startswith("pg_"):
        raise ConfigError(
            f"store URL {shown}: schema must be a lowercase name of letters, digits and _ "
            f"(at most 63, not starting with a digit or pg_), got {schema!r}"
        )
    pool_min = _int_option(shown, "pool_min", options.get("pool_min", "1"), 0, 1000)
    pool_max = _int_option(shown, "pool_max", options.get("pool_max", str(max(10, pool_min))),
                           1, 1000)
    if pool_min > pool_max:
        raise ConfigError(f"store URL {shown}: pool_min ({pool_min}) is larger than pool_max "
                          f"({pool_max})")
    pool_wait = _int_option(shown, "pool_wait", options.get("pool_wait", "30"), 1, 3600)
    outage_wait = _int_option(shown, "outage_wait", options.get("outage_wait", "600"), 0,
                              86400)
    conninfo = f"{scheme}://{base}" + ("?" + "&".join(passed) if passed else "")
    try:
        from psycopg.conninfo import conninfo_to_dict

        params = conninfo_to_dict(conninfo)
    except Exception as exc:  # psycopg.ProgrammingError: libpq's parser refused it
        raise ConfigError(f"store URL {shown}: {mask_url(str(exc)).strip()}") from None
    password = params.get("password")
    defaults = {}
    if "connect_timeout" not in passed_keys:
        defaults["connect_timeout"] = "10"  # libpq waits forever for a silent host
    if "application_name" not in passed_keys:
        defaults["application_name"] = "corral"
    where = mask_url(f"{scheme}://{base}")
    return PgTarget(
        conninfo=conninfo,
        url=shown,
        where=where,
        schema=schema,
        pool_min=pool_min,
        pool_max=pool_max,
        pool_wait=pool_wait,
        outage_wait=outage_wait,
        password=str(password) if password else None,
        defaults=defaults,
    )
