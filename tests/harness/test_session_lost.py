"""A turn that was to continue a saved CLI session and did not (#27), in the parts that
need no CLI: the translators' ``corral.session_lost`` and refusal errors, the checks of a
saved session's files (hostile bytes), the ``warnings`` of a run record, and what the
thread's history says a turn must continue. The real CLIs: ``check_session_lost`` in the
harness kit and ``tests/agents/test_session_refused.py``."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from ag_ui.core import EventType
from hypothesis import given
from hypothesis import strategies as st

from corral.harness._base import RunContext
from corral.harness._claude_code import ClaudeCodeHarness, ClaudeCodeTranslator
from corral.harness._cli_base import transcript_problem
from corral.harness._opencode import OPENCODE_DB, opencode_session_problem
from corral.journal._reader import Exit, Line
from corral.runs._session_lost import expected_session, forget_sessions
from corral.stores._records import CorruptRecord, RunError, RunPatch, RunRecord, RunStatus


def _run(t: ClaudeCodeTranslator, lines: list[dict[str, Any]], exit: Exit) -> list[Any]:
    events = t.start()
    offset = 0
    for obj in lines:
        raw = json.dumps(obj).encode()
        offset += len(raw) + 1
        events += t.feed(Line(raw, offset))
    return events + t.feed(exit)


INIT = {"type": "system", "subtype": "init", "session_id": "NEW", "model": "m"}
RESULT = {"type": "result", "subtype": "success", "is_error": False, "result": "hi",
          "session_id": "NEW"}


@pytest.mark.parametrize(("resumed", "lost"), [(None, False), ("NEW", False), ("OLD", True)])
def test_a_new_session_where_one_was_to_be_resumed_is_said_before_it(
        resumed: str | None, lost: bool) -> None:
    t = ClaudeCodeTranslator(RunContext("r", "t", resumed_session=resumed))
    events = _run(t, [INIT, RESULT], Exit(0, None, 999))
    names = [e.name for e in events if e.type == EventType.CUSTOM]
    if not lost:
        assert "corral.session_lost" not in names
        return
    assert names[:2] == ["corral.session_lost", "corral.session"]
    (value,) = [e.value for e in events if e.type == EventType.CUSTOM
                and e.name == "corral.session_lost"]
    assert value["expected"] == "OLD" and value["sessionId"] == "NEW" and value["reason"]
    assert events[-1].type == EventType.RUN_FINISHED


def test_a_refused_session_is_named_in_the_error_only_when_resuming() -> None:
    said = b"\x1b[91mNo conversation found with session ID: OLD\x1b[0m\n"
    for resumed in ("OLD", None):
        t = ClaudeCodeTranslator(RunContext("r", "t", resumed_session=resumed))
        end = _run(t, [], Exit(1, None, 10, said))[-1]
        assert end.type == EventType.RUN_ERROR
        if resumed:
            assert end.code == "session_lost"
            assert end.message == ("the saved claude-code session OLD could not be resumed: "
                                   "No conversation found with session ID: OLD")
        else:
            assert end.code == "exit:1" and "session OLD could not" not in end.message
    # another failure while resuming is not taken for a refusal
    t = ClaudeCodeTranslator(RunContext("r", "t", resumed_session="OLD"))
    end = _run(t, [], Exit(1, None, 10, b"model unreachable"))[-1]
    assert end.code == "exit:1"


files_st = st.dictionaries(
    st.sampled_from([".claude/projects/-workspace/S1.jsonl", ".claude/projects/x/S1.jsonl",
                     ".claude/projects/-workspace/S2.jsonl", ".claude/other/S1.jsonl",
                     "S1.jsonl"]),
    st.one_of(st.binary(max_size=60),
              st.lists(st.sampled_from([b'{"a":1}', b"[1]", b"{", b"\xff", b"", b'"s"']),
                       max_size=4).map(b"\n".join)), max_size=4)


@given(files_st)
def test_a_transcript_is_usable_when_it_has_a_json_object_line(files: dict[str, bytes]) -> None:
    problem = transcript_problem(files, "S1", under=".claude/projects/", named="S1.jsonl")

    def readable(data: bytes) -> bool:
        for line in data.splitlines():
            try:
                if isinstance(json.loads(line), dict):
                    return True
            except ValueError:
                pass
        return False

    ours = [d for p, d in files.items() if p.startswith(".claude/projects/")
            and p.endswith("/S1.jsonl")]
    assert (problem is None) == any(readable(d) for d in ours), (files, problem)
    harness = ClaudeCodeHarness()
    assert harness.session_problem(files, "S1") == problem


def test_an_opencode_database_must_be_sqlite_and_hold_the_session() -> None:
    db = b"SQLite format 3\x00" + b"\x00" * 100 + b"ses_abc"
    assert opencode_session_problem({OPENCODE_DB: db}, "ses_abc") is None
    assert opencode_session_problem({OPENCODE_DB: db[:-7], OPENCODE_DB + "-wal": b"ses_abc"},
                                    "ses_abc") is None
    assert "not among" in str(opencode_session_problem({}, "ses_abc"))
    assert "not a SQLite" in str(opencode_session_problem({OPENCODE_DB: b"junk"}, "ses_abc"))
    assert "does not hold" in str(opencode_session_problem({OPENCODE_DB: db}, "ses_other"))


BASE = {"run_id": "r", "thread_id": "t", "status": "completed", "started_at": 1.0,
        "updated_at": 1.0}


@pytest.mark.parametrize("bad", ["x", {"code": "a", "message": "m"}, [1], [{"code": "a"}],
                                 [{"code": 1, "message": "m"}],
                                 [{"code": "a", "message": "m"}] * 21])
def test_hostile_warnings_are_refused(bad: Any) -> None:
    with pytest.raises(CorruptRecord, match="warnings"):
        RunRecord.from_dict({**BASE, "warnings": bad})
    with pytest.raises(CorruptRecord, match="warnings"):
        RunPatch(warnings=bad)


def _turn(run_id: str, started: float, session: str | None, *, harness: str = "claude-code",
          undone: bool = False, refused: bool = False) -> RunRecord:
    agent: dict[str, Any] = {}
    if session:
        agent["session"] = {"harness": harness, "id": session}
    if refused:
        agent["resumed_session"] = session
    return RunRecord.from_dict({
        **BASE, "run_id": run_id, "thread_id": "T", "started_at": started,
        "harness": harness, "spec": {"version": 1, "agent": agent},
        "undone_at": 5.0 if undone else None,
        "error": RunError("refused", "session_lost").to_dict() if refused else None})


class _Runs:
    """The two calls of a run store the history needs."""

    def __init__(self) -> None:
        self.records: dict[str, RunRecord] = {}

    async def create(self, record: RunRecord) -> None:
        self.records[record.run_id] = record

    async def list_by_thread(self, thread_id: str) -> list[RunRecord]:
        return [r for r in self.records.values() if r.thread_id == thread_id]

    async def update(self, run_id: str, patch: RunPatch) -> RunRecord:
        self.records[run_id] = patch.apply(self.records[run_id], 9.0)
        return self.records[run_id]


def test_the_thread_history_names_the_session_a_turn_must_continue() -> None:
    async def go() -> list[Any]:
        store: Any = _Runs()
        for record in (_turn("a", 1, "S1"), _turn("b", 2, "C1", harness="codex"),
                       _turn("c", 3, "S2"), _turn("d", 4, "S3", undone=True),
                       _turn("e", 5, None)):
            await store.create(record)
        seen = [await expected_session(store, "T", "new", "claude-code"),
                await expected_session(store, "T", "new", "codex"),
                await expected_session(store, "T", "new", "gemini-cli"),
                await expected_session(store, "T", "T", "claude-code")]
        await store.create(_turn("f", 6, "S2", refused=True))
        seen.append(await expected_session(store, "T", "new", "claude-code"))
        # corral threads rm keeping the runs: the next turn is a new start, not a loss
        await forget_sessions(store, await store.list_by_thread("T"))
        seen.append(await expected_session(store, "T", "new", "claude-code"))
        return seen

    assert anyio.run(go) == [("S2", None), ("C1", None), (None, None), (None, None),
                             ("S2", "S2"), (None, None)]


def test_a_record_keeps_its_warnings_as_json() -> None:
    record = RunRecord.from_dict({**BASE, "warnings": [{"code": "session_lost",
                                                        "message": "m", "expected": "S"}]})
    assert json.loads(json.dumps(record.to_dict()))["warnings"] == [
        {"code": "session_lost", "message": "m", "expected": "S"}]
    assert record.status is RunStatus.COMPLETED
