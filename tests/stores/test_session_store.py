"""The session store kit on every shipped backend (memory, SQLite, PostgreSQL), on asyncio
and trio, plus what only a backend with a file or a server can show: a session written
by one store object is read whole by another on the same file or database."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.stores import open_store
from corral.testing import SESSION_STORE_KIT, pytest_checks
from corral.testing._sessions import session
from tests.helpers import STORE_FACTORIES

pytest_checks(SESSION_STORE_KIT, STORE_FACTORIES, globals())


@pytest.mark.anyio
async def test_a_session_outlives_its_store_object(tmp_path: Path, pg_url: str) -> None:
    files = {".codex/sessions/2025/x.jsonl": b'{"type":"session_meta"}\n' * 100}
    for url in (f"sqlite://{tmp_path}/s.db", pg_url):
        first = await open_store(url)
        try:
            await first.put_session(session("t", "codex", files, session_id="c-1"))
        finally:
            await first.aclose()
        second = await open_store(url)
        try:
            got = await second.get_session("t", "codex")
            assert got is not None and got.session_id == "c-1" and dict(got.files) == files
            assert [i.harness for i in await second.list_sessions("t")] == ["codex"]
        finally:
            await second.aclose()
