"""Harness kit, a thread's CLI session: continued turn after turn (also in a fresh sandbox,
from the store), and a turn that cannot continue it saying so."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from corral.testing._harness_world import HarnessWorld, world
from corral.testing._kit import Kit
from corral.testing._model_script import ModelRequest, Reply, Text
from corral.testing._harness_events import customs, ndjson_events, ok, texts

__all__ = ["SESSION_CHECKS"]

SESSION_CHECKS: Kit[HarnessWorld] = Kit("harness", subject=world)
"""This part's checks, in the order written (:data:`~corral.testing.HARNESS_KIT` joins the
parts)."""


@SESSION_CHECKS.add
async def check_resume_on_thread(w: HarnessWorld) -> None:
    """A thread's next prompt continues the CLI's own session: in the thread's sandbox,
    and again after that sandbox is destroyed (the session saved in the store is restored
    into a fresh one); the model gets the whole history each time. Nothing of the session
    is kept under ``$CORRAL_HOME/sessions``."""

    def script(req: ModelRequest) -> Reply:
        last = req.last_user_text
        return Text("THIRD-ANSWER" if "third" in last else
                    "SECOND-ANSWER" if "second" in last else "FIRST-ANSWER-42")

    w.script(script)
    ws = w.workspace("resume", toml='[lifecycle]\nreuse = "thread"\n')
    common = ("--thread", "T", "--workspace", str(ws))
    ok(await w.agent("s1", "first prompt XYZZY-7", *common))
    ok(await w.agent("s2", "second prompt", *common))
    box = w.record("s1")["sandbox_ref"]["id"]
    assert w.record("s2")["sandbox_ref"]["id"] == box
    history = "\n".join(w.server.model_requests[-1].texts)
    assert "first prompt XYZZY-7" in history and "FIRST-ANSWER-42" in history, history
    ok(await w.acorral("sandboxes", "rm", box, timeout=60))
    ok(await w.agent("s3", "third prompt", *common))
    assert w.record("s3")["sandbox_ref"]["id"] != box
    last = w.server.model_requests[-1]
    assert "third prompt" in last.last_user_text
    history = "\n".join(last.texts)
    for said in ("first prompt XYZZY-7", "FIRST-ANSWER-42", "second prompt", "SECOND-ANSWER"):
        assert said in history, (said, history)
    sessions = [s["sessionId"] for r in ("s1", "s2", "s3")
                for s in customs(w.log(r), "corral.session")]
    assert len(sessions) == 3 and len(set(sessions)) == 1, sessions  # one CLI session
    for r in ("s1", "s2", "s3"):  # a continuation says nothing was lost
        assert not customs(w.log(r), "corral.session_lost") and not w.record(r).get(
            "warnings"), r
    async with w.store() as store:
        saved = await store.list_sessions("T")
    assert [i.session_id for i in saved] == [sessions[0]], saved  # in the store...
    assert not (w.home / "sessions").exists()  # ...and nowhere else


async def _damage_sessions(w: HarnessWorld, thread: str) -> list[str]:
    """Every file of the thread's saved sessions replaced by bytes no CLI can read (in
    the store, as a broken disk or a bad restore would leave them); their ids."""
    async with w.store() as store:
        ids = []
        for info in await store.list_sessions(thread):
            saved = await store.get_session(thread, info.harness)
            assert saved is not None and saved.session_id, info
            ids.append(saved.session_id)
            await store.put_session(dataclasses.replace(
                saved, files={rel: b"\x00 not a transcript \xff\n" for rel in saved.files}))
    assert ids, "the first turn saved no session"
    return ids


def _lost_before_first_message(events: list[dict[str, Any]], expected: str) -> str:
    """The run's ``corral.session_lost`` event names ``expected`` and comes before its
    first message or tool call; returns its reason."""
    kinds = [(e["type"], e.get("name")) for e in events]
    at = kinds.index(("CUSTOM", "corral.session_lost"))
    first = min((i for i, (k, _n) in enumerate(kinds)
                 if k in ("TEXT_MESSAGE_START", "TOOL_CALL_START")), default=len(kinds))
    assert at < first, kinds
    (value,) = customs(events, "corral.session_lost")
    assert value["expected"] == expected and value["reason"], value
    return str(value["reason"])


@SESSION_CHECKS.add
async def check_session_lost(w: HarnessWorld) -> None:
    """A turn of a thread that cannot continue the thread's saved CLI session never looks
    like a continuation. Damaged in the store: the turn still answers, in a new
    conversation, with ``CUSTOM corral.session_lost`` (naming the session it was to
    continue) before its first message, a ``session_lost`` warning on its record and
    ``new_conversation`` in ``corral threads show``; gone from the store: the same,
    and ``corral run``'s text stream prints one warning line; with ``--on-session-lost
    fail`` the turn fails with one line naming the session instead, before the model
    is asked anything."""

    def script(req: ModelRequest) -> Reply:
        last = req.last_user_text
        return Text("FIRST-ANSWER-42" if "first" in last else "ANOTHER-ANSWER")

    w.script(script)
    thread = ("--thread", "LOST")
    ok(await w.agent("l1", "first prompt XYZZY-7", *thread))
    (sid1,) = customs(w.log("l1"), "corral.session")
    (damaged,) = await _damage_sessions(w, "LOST")
    assert damaged == sid1["sessionId"]
    # damaged: answered in a new conversation, and said so
    out = await w.agent("l2", "second prompt", *thread)
    ok(out)
    events = w.log("l2")
    assert ndjson_events(out.stdout) == events
    reason = _lost_before_first_message(events, damaged)
    assert "ANOTHER-ANSWER" in texts(events)
    history = "\n".join(w.server.model_requests[-1].texts)
    assert "XYZZY-7" not in history, history  # it is a new conversation indeed
    (sid2,) = [s["sessionId"] for s in customs(events, "corral.session")]
    assert sid2 != damaged
    rec = w.record("l2")
    assert rec["status"] == "completed"
    (warning,) = rec["warnings"]
    assert warning["code"] == "session_lost" and warning["expected"] == damaged, warning
    assert reason in warning["message"]
    shown = await w.acorral("show", "l2")
    ok(shown)
    assert "started a new conversation" in shown.stdout and damaged in shown.stdout
    # gone from the store: the thread's history says which session it was in
    async with w.store() as store:
        await store.delete_sessions("LOST")
    text_args = [a for a in w.run_args("l3", *thread) if a != "--json"]
    out = await w.acorral(*text_args, "third prompt")
    ok(out)
    warned = [line for line in out.stderr.splitlines() if "new conversation" in line]
    assert len(warned) == 1 and sid2 in warned[0], out.stderr
    assert "not in the store" in _lost_before_first_message(w.log("l3"), sid2)
    assert "ANOTHER-ANSWER" in out.stdout
    detail = json.loads((await w.acorral("threads", "show", "LOST", "--json")).stdout)
    marked = {r["run_id"]: bool(r.get("new_conversation")) for r in detail["runs"]}
    assert marked == {"l1": False, "l2": True, "l3": True}, marked
    # on_session_lost = "fail": one line naming the session, nothing asked of the model
    (sid3,) = [s["sessionId"] for s in customs(w.log("l3"), "corral.session")]
    (damaged,) = await _damage_sessions(w, "LOST")
    assert damaged == sid3
    asked = len(w.server.model_requests)
    out = await w.agent("l4", "fourth prompt", *thread, "--on-session-lost", "fail")
    assert out.returncode != 0, out.stdout[-2000:]
    rec = w.record("l4")
    assert rec["status"] == "failed" and rec["error"]["code"] == "session_lost", rec
    message = rec["error"]["message"]
    assert damaged in message and "\n" not in message, message
    assert len(w.server.model_requests) == asked, "the model was asked"
    assert not customs(w.log("l4"), "corral.session_lost")  # failed, not continued
