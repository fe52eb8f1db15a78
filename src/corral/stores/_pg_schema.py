"""The PostgreSQL store's tables and their versions.

``corral_schema`` holds one row per applied migration; the store's version is the highest.
Opening a store reads it without a lock (the common case: up to date, nothing to do). When
it is absent or older, the opener takes a transaction-scoped advisory lock for the schema,
reads it again and applies the missing migrations in that one transaction, so hosts opening
the same store at once apply each migration exactly once (the others wait for the lock and
find the work done). A store newer than this corral is refused with one line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from corral.stores._protocols import StoreError

if TYPE_CHECKING:
    import psycopg

__all__ = ["MIGRATIONS", "SchemaTooNew", "ensure_schema", "latest_version", "qualify"]

LOCK_CLASS: Final = 0x636F7272  # "corr": the advisory-lock class of corral's schema setup

_V1: Final = """
CREATE TABLE {s}.runs (
    seq bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    run_id text PRIMARY KEY,
    thread_id text NOT NULL,
    status text NOT NULL,
    started_at double precision NOT NULL,
    unattended_since double precision,
    driver_epoch bigint NOT NULL DEFAULT 0,
    doc text NOT NULL,
    last_offset bigint NOT NULL DEFAULT 0,
    last_journal_offset bigint,
    log_closed boolean NOT NULL DEFAULT false
);
CREATE INDEX runs_thread ON {s}.runs (thread_id, started_at, seq);
CREATE INDEX runs_started ON {s}.runs (started_at, seq);
CREATE INDEX runs_status_started ON {s}.runs (status, started_at, seq);
CREATE INDEX runs_unattended ON {s}.runs (unattended_since, seq)
    WHERE status = 'running' AND unattended_since IS NOT NULL;
CREATE TABLE {s}.events (
    run_seq bigint NOT NULL,
    log_offset bigint NOT NULL,
    journal_offset bigint NOT NULL,
    event text NOT NULL,
    PRIMARY KEY (run_seq, log_offset)
);
CREATE TABLE {s}.instances (
    key text PRIMARY KEY,
    expires_at double precision,
    doc text NOT NULL
);
CREATE INDEX instances_expiry ON {s}.instances (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE {s}.locks (
    name text PRIMARY KEY,
    owner text NOT NULL,
    expires_at double precision NOT NULL
);
CREATE TABLE {s}.approvals (
    seq bigint GENERATED ALWAYS AS IDENTITY,
    run_id text NOT NULL,
    approval_id text NOT NULL,
    tool text NOT NULL,
    args text NOT NULL,
    call_id text,
    created_at double precision NOT NULL,
    expires_at double precision NOT NULL,
    decision text,
    reason text,
    answered_at double precision,
    PRIMARY KEY (run_id, approval_id)
);
CREATE INDEX approvals_pending ON {s}.approvals (run_id, created_at, seq)
    WHERE decision IS NULL;
CREATE TABLE {s}.secrets (
    name text PRIMARY KEY,
    value bytea NOT NULL
);
"""

# An append in one round trip (one autocommit statement: its own transaction). The fencing
# condition below mirrors corral.stores._logic.append_check, which stays the rule: the
# function writes only when append_check would let the append land (the run exists, its
# driver_epoch equals the writer's epoch, that epoch is >= 1, its log is not closed), and
# returns what it saw, so that when it wrote nothing the store calls append_check with that
# state to raise the error every backend raises. tests/stores/test_postgres_append.py checks
# that the two agree on every combination. The row lock serializes appenders and claimers of the
# run on every host (gap-free offsets); the notification is delivered at commit.
_V2: Final = """
CREATE FUNCTION {s}.append_events(
    p_run_id text, p_epoch bigint, p_journal bigint[], p_events text[],
    p_channel text, p_note text,
    OUT o_exists boolean, OUT o_epoch bigint, OUT o_closed boolean, OUT o_first bigint
) LANGUAGE plpgsql AS $$
DECLARE
    v_seq bigint;
    v_last bigint;
    v_count integer := coalesce(cardinality(p_events), 0);
BEGIN
    SELECT r.seq, r.driver_epoch, r.last_offset, r.log_closed
        INTO v_seq, o_epoch, v_last, o_closed
        FROM {s}.runs r WHERE r.run_id = p_run_id FOR UPDATE;
    o_exists := FOUND;
    -- _logic.append_check's rule: unknown run, lost claim (epoch < 1 never writes), closed
    IF NOT o_exists OR o_epoch <> p_epoch OR p_epoch < 1 OR o_closed THEN
        RETURN;  -- o_first stays NULL: nothing written
    END IF;
    o_first := v_last + 1;
    IF v_count = 0 THEN
        RETURN;
    END IF;
    INSERT INTO {s}.events (run_seq, log_offset, journal_offset, event)
        SELECT v_seq, v_last + t.n, t.j, t.e
        FROM unnest(p_journal, p_events) WITH ORDINALITY AS t(j, e, n);
    -- The highest journal offset, not the last: an out-of-band event (an approval request,
    -- a file event) logged at a stale offset must not send a successor back over lines
    -- logged.
    UPDATE {s}.runs SET last_offset = v_last + v_count,
        last_journal_offset = GREATEST(coalesce(last_journal_offset, 0),
                                       (SELECT max(j) FROM unnest(p_journal) AS j))
        WHERE seq = v_seq;
    PERFORM pg_notify(p_channel, p_note);
END
$$;
"""

# checkpoints (#27): content-addressed chunks shared by every checkpoint and thread, the
# manifests (zlib JSON) per thread, and which manifest names which chunk (what the
# collector keeps). Chunks are stored uncompressed by PostgreSQL (EXTERNAL): corral
# compresses what compresses. A separate entry: the integrator may renumber it.
_V_CHECKPOINTS: Final = """
CREATE TABLE {s}.chunks (
    digest text PRIMARY KEY,
    size bigint NOT NULL,
    touched_at double precision NOT NULL,
    data bytea NOT NULL
);
ALTER TABLE {s}.chunks ALTER COLUMN data SET STORAGE EXTERNAL;
CREATE INDEX chunks_touched ON {s}.chunks (touched_at);
CREATE TABLE {s}.checkpoints (
    seq bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    checkpoint_id text PRIMARY KEY,
    thread_id text NOT NULL,
    created_at double precision NOT NULL,
    manifest bytea NOT NULL
);
CREATE INDEX checkpoints_thread ON {s}.checkpoints (thread_id, created_at, seq);
CREATE TABLE {s}.checkpoint_chunks (
    checkpoint_seq bigint NOT NULL,
    digest text NOT NULL,
    PRIMARY KEY (checkpoint_seq, digest)
);
CREATE INDEX checkpoint_chunks_digest ON {s}.checkpoint_chunks (digest);
"""

# sessions (#27): agent CLIs' saved sessions, one per (thread, harness): a header row (whose
# lock serializes writers of the session) and one row per file.
_V_SESSIONS: Final = """
CREATE TABLE {s}.sessions (
    thread_id text NOT NULL,
    harness text NOT NULL,
    session_id text,
    saved_at double precision NOT NULL,
    run_id text,
    size bigint NOT NULL,
    files integer NOT NULL,
    PRIMARY KEY (thread_id, harness)
);
CREATE TABLE {s}.session_files (
    thread_id text NOT NULL,
    harness text NOT NULL,
    path text NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (thread_id, harness, path)
);
"""

MIGRATIONS: list[tuple[int, str]] = [
    (1, _V1),
    (2, _V2),
    (3, _V_CHECKPOINTS),  # checkpoints (#27)
    (4, _V_SESSIONS),  # sessions (#27)
]
"""``(version, SQL)`` in order; ``{s}`` stands for the quoted schema name. Append, never
edit: a store records which versions it has."""


class SchemaTooNew(StoreError):
    """The store was made by a newer corral than this one."""


def qualify(sql: str, schema: str) -> str:
    """``sql`` with ``{s}`` replaced by the quoted schema name (validated by the URL parser:
    lowercase letters, digits and ``_`` only)."""
    return sql.replace("{s}", f'"{schema}"')


def latest_version() -> int:
    return max(version for version, _sql in MIGRATIONS)


def _version(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> int | None:
    """The store's version; ``None`` when it has no version table yet."""
    row = conn.execute("SELECT to_regclass(%s)", (f'"{schema}".corral_schema',)).fetchone()
    if row is None or row[0] is None:
        return None
    got = conn.execute(qualify("SELECT max(version) FROM {s}.corral_schema", schema)).fetchone()
    return None if got is None or got[0] is None else int(str(got[0]))


def _refuse_newer(version: int | None, where: str) -> None:
    if version is not None and version > latest_version():
        raise SchemaTooNew(
            f"store {where} has schema version {version}, this corral understands up to "
            f"{latest_version()}; upgrade corral"
        )


def ensure_schema(
    conn: psycopg.Connection[tuple[object, ...]], schema: str, where: str, now: float
) -> int:
    """Create or migrate the store's tables (``conn`` in autocommit mode); returns the
    version. Raises :class:`SchemaTooNew` for a store made by a newer corral."""
    version = _version(conn, schema)
    _refuse_newer(version, where)
    if version == latest_version():
        return version
    with conn.transaction():
        # hashtext(schema): stores in other schemas of the database migrate independently
        conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (LOCK_CLASS, schema))
        conn.execute(qualify("CREATE SCHEMA IF NOT EXISTS {s}", schema))
        conn.execute(qualify(
            "CREATE TABLE IF NOT EXISTS {s}.corral_schema "
            "(version integer PRIMARY KEY, applied_at double precision NOT NULL)", schema))
        version = _version(conn, schema)  # again, under the lock: another host may be done
        _refuse_newer(version, where)
        for number, sql in sorted(MIGRATIONS):
            if version is not None and number <= version:
                continue
            conn.execute(qualify(sql, schema).encode())
            conn.execute(qualify("INSERT INTO {s}.corral_schema VALUES (%s, %s)", schema),
                         (number, now))
            version = number
    assert version is not None
    return version
