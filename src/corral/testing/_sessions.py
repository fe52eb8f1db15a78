"""Session store conformance kit: the :class:`~corral.abc.SessionStore` contract.

Every backend that keeps agent CLIs' saved sessions must pass it::

    from corral.testing import check_session_store

    report = await check_session_store(make_store)   # raises KitFailed naming each failure

Each check gets a fresh, empty store from the factory (closed with ``aclose()`` after it).
The checks cover the round trip (bytes exactly as given, any byte value), a put replacing
the whole session (no file of the old one left), isolation between threads and between
harnesses, listing without the bytes, deletion, the store's size limits (a refused put
writes nothing), hostile file paths refused, records that share nothing with their
callers, and concurrent writers and readers (a reader sees one whole session, never a mix;
the last write wins whole). Some checks set :attr:`SessionStore.session_limits` on their
store. They use anyio and run on asyncio or trio; ``corral.testing.pytest_checks(
SESSION_STORE_KIT, ...)`` makes one pytest test per check.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import anyio

from corral.stores._protocols import (
    InvalidSession,
    SessionInfo,
    SessionLimits,
    SessionStore,
    SessionTooLarge,
    StoredSession,
)
from corral.testing._kit import Factory, Kit, KitReport, raises

__all__ = [
    "HOSTILE_PATHS",
    "SESSION_STORE_KIT",
    "check_concurrent_writers_never_mix",
    "check_delete_all_or_one_harness",
    "check_files_are_bytes_exactly",
    "check_hostile_paths_are_refused",
    "check_isolated_between_threads_and_harnesses",
    "check_limits_refuse_and_write_nothing",
    "check_list_without_bytes",
    "check_put_replaces_the_whole_session",
    "check_records_are_not_shared_with_callers",
    "check_round_trip",
    "check_session_store",
    "session",
]

T0 = 1_700_000_000.0
DEADLINE = 30.0

HOSTILE_PATHS: tuple[str, ...] = (
    "../escape", "a/../../escape", "/etc/passwd", "a//b", "a/./b", ".", "..", "", "a/",
    "nul\x00byte", "a/b/..",
)
"""File paths every session store must refuse (they could escape the sandbox home)."""


def session(thread_id: str = "thread-1", harness: str = "claude-code",
            files: Mapping[str, bytes] | None = None, *, session_id: str | None = "sid-1",
            saved_at: float = T0, run_id: str | None = "run-1") -> StoredSession:
    """A saved session with a default transcript."""
    if files is None:
        files = {".claude/projects/p/sid-1.jsonl": b'{"type":"user"}\n'}
    return StoredSession(thread_id, harness, session_id, files, saved_at, run_id)


def _as_dict(got: StoredSession | None) -> dict[str, bytes]:
    assert got is not None, "the session is missing"
    return dict(got.files)


SESSION_STORE_KIT: Kit[SessionStore] = Kit("session store")
"""Every session store check; the subject is the store the factory makes."""


@SESSION_STORE_KIT.add
async def check_round_trip(store: SessionStore) -> None:
    assert await store.get_session("thread-1", "claude-code") is None
    assert await store.list_sessions("thread-1") == []
    files = {".claude/projects/p/s.jsonl": b'{"a":1}\n{"b":2}\n',
             ".claude/projects/p/sub/tool.json": b"{}", ".claude/todos/x": b""}
    put = await store.put_session(session(files=files, session_id="s-9", run_id="r-7",
                                          saved_at=T0 + 1.5))
    assert put == SessionInfo("thread-1", "claude-code", "s-9", sum(map(len, files.values())),
                              3, T0 + 1.5, "r-7"), put
    got = await store.get_session("thread-1", "claude-code")
    assert got is not None
    assert (got.thread_id, got.harness, got.session_id, got.saved_at, got.run_id) == (
        "thread-1", "claude-code", "s-9", T0 + 1.5, "r-7")
    assert _as_dict(got) == files
    # no session id and no files are a session too (the CLI had not named it yet)
    await store.put_session(session("thread-2", files={}, session_id=None, run_id=None))
    empty = await store.get_session("thread-2", "claude-code")
    assert empty is not None and empty.session_id is None and empty.run_id is None
    assert dict(empty.files) == {}


@SESSION_STORE_KIT.add
async def check_files_are_bytes_exactly(store: SessionStore) -> None:
    every_byte = bytes(range(256)) * 3
    big = (b'{"type":"assistant","text":"' + b"x" * 2000 + b'"}\n') * 1000  # ~2 MiB
    files = {"every/byte": every_byte, "big.jsonl": big, "caf\u00e9 \u6f22/\u00fc ber.txt": b"\x00\xff",
             "no-newline": b"end"}
    await store.put_session(session(files=files))
    assert _as_dict(await store.get_session("thread-1", "claude-code")) == files


@SESSION_STORE_KIT.add
async def check_put_replaces_the_whole_session(store: SessionStore) -> None:
    await store.put_session(session(files={"a": b"old a", "dir/b": b"old b"}, session_id="s1"))
    await store.put_session(session(files={"dir/c": b"new c"}, session_id="s2",
                                    saved_at=T0 + 5, run_id="run-2"))
    got = await store.get_session("thread-1", "claude-code")
    assert got is not None and got.session_id == "s2" and got.run_id == "run-2"
    assert dict(got.files) == {"dir/c": b"new c"}, "files of the replaced session remain"
    [info] = await store.list_sessions("thread-1")
    assert (info.session_id, info.files, info.size, info.saved_at) == ("s2", 1, 5, T0 + 5)
    # replaced by one without files: nothing remains
    await store.put_session(session(files={}, session_id="s3"))
    assert _as_dict(await store.get_session("thread-1", "claude-code")) == {}


@SESSION_STORE_KIT.add
async def check_isolated_between_threads_and_harnesses(store: SessionStore) -> None:
    keys = [("t1", "claude-code"), ("t1", "codex"), ("t2", "claude-code"), ("t1/x", "codex")]
    for t, h in keys:
        await store.put_session(session(t, h, {f"{t}-{h}".replace("/", "_"): t.encode()},
                                        session_id=f"{t}:{h}"))
    for t, h in keys:
        got = await store.get_session(t, h)
        assert got is not None and got.session_id == f"{t}:{h}", (t, h, got)
        assert dict(got.files) == {f"{t}-{h}".replace("/", "_"): t.encode()}
    assert await store.get_session("t2", "codex") is None
    assert await store.get_session("t", "claude-code") is None  # no prefix matching
    await store.put_session(session("t1", "codex", {"new": b"n"}, session_id="again"))
    got = await store.get_session("t1", "claude-code")
    assert got is not None and got.session_id == "t1:claude-code"
    t2 = await store.get_session("t2", "claude-code")
    assert t2 is not None and dict(t2.files) == {"t2-claude-code": b"t2"}


@SESSION_STORE_KIT.add
async def check_list_without_bytes(store: SessionStore) -> None:
    await store.put_session(session("t", "opencode", {"a": b"12345", "b/c": b"67"},
                                    session_id="o", saved_at=T0 + 2, run_id="r2"))
    await store.put_session(session("t", "claude-code", {"x": b"1"}, session_id="c",
                                    run_id=None))
    await store.put_session(session("other", "codex", {"x": b"1"}))
    listed = await store.list_sessions("t")
    assert listed == [
        SessionInfo("t", "claude-code", "c", 1, 1, T0, None),
        SessionInfo("t", "opencode", "o", 7, 2, T0 + 2, "r2"),
    ], listed
    assert await store.list_sessions("nobody") == []


@SESSION_STORE_KIT.add
async def check_delete_all_or_one_harness(store: SessionStore) -> None:
    for h in ("claude-code", "codex", "gemini-cli"):
        await store.put_session(session("t", h, {"f": h.encode()}))
    await store.put_session(session("keep", "codex", {"f": b"k"}))
    assert await store.delete_sessions("t", "codex") == 1
    assert await store.get_session("t", "codex") is None
    assert [i.harness for i in await store.list_sessions("t")] == ["claude-code", "gemini-cli"]
    assert await store.delete_sessions("t", "codex") == 0
    assert await store.delete_sessions("t") == 2
    assert await store.list_sessions("t") == []
    assert await store.get_session("t", "claude-code") is None
    assert await store.delete_sessions("t") == 0
    assert _as_dict(await store.get_session("keep", "codex")) == {"f": b"k"}
    # a deleted session's files do not come back with the next put
    await store.put_session(session("t", "codex", {"g": b"new"}))
    assert _as_dict(await store.get_session("t", "codex")) == {"g": b"new"}


@SESSION_STORE_KIT.add
async def check_limits_refuse_and_write_nothing(store: SessionStore) -> None:
    store.session_limits = SessionLimits(max_bytes=100, max_files=3)
    await store.put_session(session(files={"a": b"1"}, session_id="before"))
    at_limit = {"a": b"x" * 50, "b": b"y" * 50, "c": b""}
    await store.put_session(session("t-edge", files=at_limit))  # exactly at both limits
    assert _as_dict(await store.get_session("t-edge", "claude-code")) == at_limit
    with raises(SessionTooLarge, match="too large"):
        await store.put_session(session(files={"a": b"x" * 101}, session_id="bytes"))
    with raises(SessionTooLarge, match="too large"):
        await store.put_session(session(files={str(i): b"" for i in range(4)},
                                        session_id="files"))
    with raises(SessionTooLarge):
        await store.put_session(session("t-new", files={"a": b"x" * 101}))
    got = await store.get_session("thread-1", "claude-code")
    assert got is not None and got.session_id == "before" and dict(got.files) == {"a": b"1"}
    assert await store.get_session("t-new", "claude-code") is None
    assert await store.list_sessions("t-new") == []


@SESSION_STORE_KIT.add
async def check_hostile_paths_are_refused(store: SessionStore) -> None:
    for path in HOSTILE_PATHS:
        with raises(InvalidSession):
            session(files={path: b"x"})
    with raises(InvalidSession):  # a file that is also a directory
        session(files={"a": b"x", "a/b": b"y"})
    with raises(InvalidSession):
        session(thread_id="")
    with raises(InvalidSession):
        session(harness="a\x00b")
    with raises(InvalidSession):
        session(files={"a": "text, not bytes"})  # type: ignore[dict-item]
    # a record changed behind its checks is checked again by the store
    await store.put_session(session(files={"ok": b"kept"}, session_id="good"))
    for path in ("../escape", "/etc/passwd", "a/../../b"):
        sneaky = session(files={"fine": b"x"}, session_id="sneaky")
        object.__setattr__(sneaky, "files", {path: b"x"})
        with raises(InvalidSession):
            await store.put_session(sneaky)
    got = await store.get_session("thread-1", "claude-code")
    assert got is not None and got.session_id == "good" and dict(got.files) == {"ok": b"kept"}


@SESSION_STORE_KIT.add
async def check_records_are_not_shared_with_callers(store: SessionStore) -> None:
    files = {"a": b"original"}
    made = session(files=files)
    files["a"] = b"changed"
    files["b"] = b"added"
    assert dict(made.files) == {"a": b"original"}
    with raises(TypeError):
        made.files["c"] = b"x"  # type: ignore[index]
    data = bytearray(b"mutable")
    await store.put_session(session("t2", files={"m": data}))  # type: ignore[dict-item]
    data[:] = b"MUTATED"
    await store.put_session(made)
    assert _as_dict(await store.get_session("thread-1", "claude-code")) == {"a": b"original"}
    assert _as_dict(await store.get_session("t2", "claude-code")) == {"m": b"mutable"}


@SESSION_STORE_KIT.add
async def check_concurrent_writers_never_mix(store: SessionStore) -> None:
    """Writers race on one session while readers read it: every read is one writer's whole
    session, and the session left is one writer's, whole."""
    writers = 8

    def files_of(i: int) -> dict[str, bytes]:
        # each writer's own paths plus shared ones with its own contents
        own = {f"w{i}/f{k}": f"{i}:{k}".encode() * 200 for k in range(i % 3 + 1)}
        return {**own, "shared/transcript.jsonl": f'{{"writer":{i}}}\n'.encode() * 500,
                "shared/meta": str(i).encode()}

    wanted = {f"s{i}": files_of(i) for i in range(writers)}
    await store.put_session(session(files=files_of(99), session_id="s99"))
    wanted["s99"] = files_of(99)
    seen: list[StoredSession] = []
    done = anyio.Event()

    async def write(i: int) -> None:
        for round_ in range(3):
            await store.put_session(session(files=files_of(i), session_id=f"s{i}",
                                            saved_at=T0 + round_))

    async def read() -> None:
        while not done.is_set():
            got = await store.get_session("thread-1", "claude-code")
            assert got is not None, "a reader saw no session while writers replaced it"
            seen.append(got)
            await anyio.sleep(0)

    with anyio.fail_after(DEADLINE):
        async with anyio.create_task_group() as readers:
            for _ in range(2):
                readers.start_soon(read)
            async with anyio.create_task_group() as tg:
                for i in range(writers):
                    tg.start_soon(write, i)
            done.set()
    for got in seen:
        assert got.session_id in wanted, got.session_id
        assert dict(got.files) == wanted[got.session_id], (
            f"a reader saw a mix: session {got.session_id} with files "
            f"{sorted(got.files)}")
    final = await store.get_session("thread-1", "claude-code")
    assert final is not None and final.session_id in wanted
    assert dict(final.files) == wanted[final.session_id]
    [info] = await store.list_sessions("thread-1")
    assert info.session_id == final.session_id and info.files == len(final.files)
    # and sequentially, the later write wins
    await store.put_session(session(files={"last": b"1"}, session_id="last"))
    assert _as_dict(await store.get_session("thread-1", "claude-code")) == {"last": b"1"}


async def check_session_store(make_store: Factory, *, only: Iterable[str] | None = None
                              ) -> KitReport:
    """Run the session store kit against stores made by ``make_store`` (one fresh store per
    check); raise :class:`~corral.testing.KitFailed` naming every failed check, else return
    the report. ``only`` names the checks to run (all by default)."""
    return await SESSION_STORE_KIT.verify(make_store, only=only)
