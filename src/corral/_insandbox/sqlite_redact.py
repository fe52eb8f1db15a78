"""Redact secrets inside the SQLite databases of an agent's session, in the sandbox.

A CLI that keeps its session in SQLite (opencode) cannot be redacted as bytes: a
replacement of another length breaks the write-ahead log's checksums (the history after it
is lost on resume), and a value split across two pages is not found at all. So, before its
session is copied out, this script runs in the sandbox with the sandbox's Python
(``python3 -I -S``, stdlib only): for every SQLite file under the given directories it
merges the WAL, replaces each hidden string in every text and blob value through SQL
(``[REDACTED:NAME]``, as the byte redaction writes), rebuilds any full-text index from the
redacted text, and ``VACUUM`` s the file so that no old page keeps the value. The copy out is still redacted as bytes afterwards (a safety net).

Input on stdin (never argv: the values are secrets): ``{"dirs": [...], "table": {hidden
string: secret name}}``. Output: one JSON line per database, ``{"path", "ok"}`` or
``{"path", "error"}``; the host only logs it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from typing import Any

MAGIC = b"SQLite format 3\x00"


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _is_database(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def redact_database(path: str, table: dict[str, str]) -> None:
    """Replace every hidden string of ``table`` in ``path``'s values, then compact it."""
    conn = sqlite3.connect(path, timeout=10, isolation_level=None)
    try:
        conn.execute("PRAGMA secure_delete = ON")
        busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy is not None and busy[0]:
            raise RuntimeError("the database is in use")
        names = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
        hidden = sorted(table, key=len, reverse=True)  # an encoding may contain a shorter one
        conn.execute("BEGIN IMMEDIATE")
        for name in names:
            try:
                columns = [r[1] for r in conn.execute(f"PRAGMA table_info({_quoted(name)})")]
            except sqlite3.Error:
                continue
            for column in columns:
                c = _quoted(column)
                for value in hidden:
                    mark = f"[REDACTED:{table[value]}]"
                    try:
                        conn.execute(
                            f"UPDATE {_quoted(name)} SET {c} = CASE typeof({c}) "
                            f"WHEN 'blob' THEN CAST(replace(CAST({c} AS TEXT), ?1, ?2) AS BLOB) "
                            f"ELSE replace({c}, ?1, ?2) END "
                            f"WHERE typeof({c}) IN ('text', 'blob') AND instr({c}, ?1) > 0",
                            (value, mark))
                    except sqlite3.Error:
                        pass  # a generated or virtual column: the byte pass still sees it
        for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE "
                "'CREATE VIRTUAL TABLE%USING fts%'").fetchall():
            try:  # a full-text index keeps the old tokens: build it again from the text
                conn.execute(f"INSERT INTO {_quoted(name)}({_quoted(name)}) VALUES ('rebuild')")
            except sqlite3.Error:
                pass
        conn.execute("COMMIT")
        conn.execute("VACUUM")  # no free page keeps an old value
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def main() -> int:
    request: dict[str, Any] = json.loads(sys.stdin.read())
    table = {str(k): str(v) for k, v in request["table"].items()}
    for top in request["dirs"]:
        for dirpath, _dirs, files in os.walk(top):  # symlinks to directories not followed
            for name in sorted(files):
                path = os.path.join(dirpath, name)
                if os.path.islink(path) or not _is_database(path):
                    continue
                try:
                    redact_database(path, table)
                    line: dict[str, Any] = {"path": path, "ok": True}
                except Exception as exc:  # noqa: BLE001 - reported; the byte pass still runs
                    line = {"path": path, "error": f"{exc.__class__.__name__}: {exc}"[:300]}
                sys.stdout.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
