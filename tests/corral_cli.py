"""``python -m corral`` against one CORRAL_HOME, with raw reads of its SQLite store.

The end-to-end suites drive the real CLI and check what it left in the store; this is the
one helper they share (suites subclass it for their own views).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

from corral.journal._layout import JournalPaths


class CliHome:
    def __init__(self, cmd: list[str], env: dict[str, str], home: Path) -> None:
        self.cmd = cmd
        self.env = env
        self.home = home
        self.db = home / "corral.db"

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.cmd, *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False, cwd=self.home)

    def popen(self, *args: str, quiet: bool = False) -> subprocess.Popen[str]:
        """Start a command; ``quiet`` drops its output instead of piping it."""
        out = subprocess.DEVNULL if quiet else subprocess.PIPE
        return subprocess.Popen([*self.cmd, *args], env=self.env, stdout=out, stderr=out,
                                text=True, cwd=self.home)

    def _one(self, sql: str, *args: object) -> Any:
        if not self.db.exists():
            return None
        with sqlite3.connect(self.db) as conn:
            try:
                return conn.execute(sql, args).fetchone()
            except sqlite3.OperationalError:
                return None  # the schema is not there yet

    def raw(self, run_id: str) -> dict[str, Any] | None:
        """The run record as stored, ``None`` before it exists."""
        row = self._one("SELECT doc FROM runs WHERE run_id = ?", run_id)
        return None if row is None else dict(json.loads(row[0]))

    def log(self, run_id: str) -> list[dict[str, Any]]:
        """The run's events in offset order (asserting the offsets are gap-free)."""
        with sqlite3.connect(self.db) as conn:
            rows = conn.execute("SELECT offset, event FROM events WHERE run_id = ? "
                                "ORDER BY offset", (run_id,)).fetchall()
        assert [r[0] for r in rows] == list(range(1, len(rows) + 1)), "offsets must be gap-free"
        return [json.loads(r[1]) for r in rows]

    def closed(self, run_id: str) -> bool:
        row = self._one("SELECT log_closed FROM runs WHERE run_id = ?", run_id)
        return bool(row and row[0])

    def text(self, run_id: str) -> str:
        return "".join(e["delta"] for e in self.log(run_id) if e["type"] == "TEXT_MESSAGE_CONTENT")

    def journal(self, run_id: str) -> JournalPaths:
        return JournalPaths.for_run(self.home / "journals", run_id)
