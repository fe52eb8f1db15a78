"""The session store kit on every shipped backend (memory, SQLite, PostgreSQL), on asyncio
and trio, plus what only a backend with a file or a server can show: a session written
by one store object is read whole by another on the same file or database."""

from __future__ import annotations

import posixpath
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.stores import InvalidSession, open_store
from corral.stores._protocols import check_session_path
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


@settings(max_examples=500, deadline=None)
@given(st.one_of(
    st.text(max_size=40),
    st.lists(st.sampled_from(["a", "..", ".", "", "b c", "\x00", "é", "/"]),
             max_size=6).map("/".join),
))
def test_an_accepted_path_stays_under_the_home(path: str) -> None:
    """Whatever string a session names, either it is refused, or joining it to the sandbox
    home lands strictly inside the home with nothing for normalization to change."""
    try:
        check_session_path(path)
    except InvalidSession:
        return
    joined = posixpath.join("/home/agent", path)
    assert posixpath.normpath(joined) == joined
    assert joined.startswith("/home/agent/") and "\x00" not in joined
