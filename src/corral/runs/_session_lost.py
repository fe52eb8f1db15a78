"""A thread's turn that was to continue the conversation and began a new one (#27).

A turn of a thread continues the agent CLI's saved session. When it cannot — the session
is not in the store although the thread's last turn of that harness left one, its files
are damaged, or the agent refuses it — the run goes on as a new conversation, and that
never looks like a normal continuation: ``CUSTOM corral.session_lost`` in its log before
its first message, a ``session_lost`` warning on its record (``corral show``, the API,
``corral threads show``). With ``on_session_lost="fail"`` the run fails instead.

Found in two places: before the agent starts (:func:`corral.agents._prepare.prepare_agent`
compares the store with :func:`expected_session`; the launcher logs the event), and in
the translation (the agent reports another session than the one it was given: the
translator logs the event, :func:`record_lost` copies it onto the record when the run
ends). Everything needed travels in the run's record (``spec.agent``:
``resumed_session``, the session a run was given; ``session``, the one it ended with),
so any host tells the same story.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from corral._log import library_logger
from corral.harness._base import SESSION_LOST_EVENT, RunContext
from corral.stores._protocols import Store
from corral.stores._records import MAX_WARNINGS, RunPatch, RunRecord

__all__ = ["SESSION_LOST", "announce_lost", "expected_session", "forget_sessions", "lost_warning",
           "new_conversation", "record_lost", "run_context", "warn"]

SESSION_LOST: Final = "session_lost"
"""The warning's code on a run record (and the error code of a run that failed for it)."""

def _agent(record: RunRecord) -> Mapping[str, Any]:
    spec = record.spec or {}
    agent = spec.get("agent") if isinstance(spec, Mapping) else None
    return agent if isinstance(agent, Mapping) else {}


def run_context(record: RunRecord) -> RunContext:
    """The translation context of ``record``'s run: its ids and the saved session it was
    started to continue."""
    resumed = _agent(record).get("resumed_session")
    return RunContext(record.run_id, record.thread_id,
                      resumed_session=resumed if isinstance(resumed, str) and resumed
                      else None)


def refused(record: RunRecord) -> bool:
    """Whether ``record``'s run failed because its agent refused the saved session it was
    given (a CLI that fails loudly; an ACP agent under ``on_session_lost="fail"``)."""
    return (record.error is not None and record.error.code == SESSION_LOST
            and run_context(record).resumed_session is not None)


def ended_session(record: RunRecord) -> tuple[str, str] | None:
    """``(harness, session id)`` of the CLI session ``record``'s run ended with, if any."""
    session = _agent(record).get("session")
    if not isinstance(session, Mapping):
        return None
    harness, sid = session.get("harness"), session.get("id")
    if session.get("removed"):
        return None  # its thread's state was removed (corral threads rm): a new start
    if isinstance(harness, str) and isinstance(sid, str) and sid:
        return harness, sid
    return None


async def expected_session(store: Store, thread_id: str, run_id: str, harness: str
                           ) -> tuple[str | None, str | None]:
    """The ``harness`` session the thread's conversation is in by its history: the one
    its latest turn of that harness ended with (undone turns and this run left out), and
    that session again when that turn's agent refused it (:func:`refused`: the next turn
    must not give it the same session again). ``(None, None)`` for a thread with no such
    turn."""
    if thread_id == run_id:
        return None, None  # a run without a thread is a thread of its own: no history
    turns = [r for r in await store.list_by_thread(thread_id)
             if r.run_id != run_id and r.undone_at is None]
    for record in sorted(turns, key=lambda r: r.started_at, reverse=True):
        ended = ended_session(record)
        if ended is not None and ended[0] == harness:
            return ended[1], ended[1] if refused(record) else None
    return None, None


def lost_warning(value: Mapping[str, Any]) -> dict[str, Any]:
    """The record's warning for a ``corral.session_lost`` event's ``value``."""
    harness, expected = str(value.get("harness", "")), str(value.get("expected", ""))
    reason = str(value.get("reason", "")) or "the saved session was not resumed"
    return {"code": SESSION_LOST, "harness": harness, "expected": expected,
            "message": f"this turn started a new conversation: the thread's {harness} "
                       f"session {expected} was not continued ({reason})"}


async def warn(store: Store, run_id: str, warning: Mapping[str, Any]) -> None:
    """Add ``warning`` to the run's record (once per code and ``expected``)."""
    record = await store.get(run_id)
    if record is None:
        return
    have = list(record.warnings or ())
    key = (warning.get("code"), warning.get("expected"))
    if any((w.get("code"), w.get("expected")) == key for w in have) \
            or len(have) >= MAX_WARNINGS:
        return
    await store.update(run_id, RunPatch(warnings=[*have, dict(warning)]))


async def announce_lost(store: Store, run_id: str, lost: Mapping[str, Any], epoch: int
                        ) -> None:
    """Log ``CUSTOM corral.session_lost`` (before the agent's first event: this turn does
    not continue the conversation) and put the warning on the run's record."""
    # the AG-UI models load on the start path only, not on a takeover's (this module's)
    from ag_ui.core import CustomEvent

    from corral.harness._events import event_to_dict

    library_logger("corral.runs._runner").info("run %s: %s", run_id,
                                               lost_warning(lost)["message"])
    await store.append(run_id, [(event_to_dict(CustomEvent(
        name=SESSION_LOST_EVENT, value=dict(lost))), 0)], epoch=epoch)
    await warn(store, run_id, lost_warning(lost))


async def record_lost(store: Store, record: RunRecord, ended_with: str | None) -> None:
    """At the run's end: when it was to continue a saved session and ended in another one
    (``ended_with``), copy the ``corral.session_lost`` event its translation logged onto
    the record as a warning."""
    resumed = run_context(record).resumed_session
    if resumed is None or ended_with is None or ended_with == resumed:
        return
    value: Mapping[str, Any] | None = None
    # (a rare path: the whole log once; the event comes before the first message)
    for logged in await store.snapshot(record.run_id):
        event = logged.event
        if event.get("type") == "CUSTOM" and event.get("name") == SESSION_LOST_EVENT:
            found = event.get("value")
            value = found if isinstance(found, Mapping) else None
            break
    await warn(store, record.run_id, lost_warning(value or {
        "harness": record.harness or "", "expected": resumed,
        "reason": f"the agent went on in session {ended_with}"}))


async def forget_sessions(store: Store, records: list[RunRecord]) -> None:
    """``corral threads rm`` keeping the runs: their sessions are gone on purpose, so the
    thread's next turn is a new conversation, not a lost one."""
    for record in records:
        if ended_session(record) is None or not isinstance(record.spec, Mapping):
            continue
        spec = dict(record.spec)
        agent = dict(_agent(record))
        agent["session"] = {**dict(agent["session"]), "removed": True}
        spec["agent"] = agent
        await store.update(record.run_id, RunPatch(spec=spec))


def new_conversation(record: RunRecord) -> bool:
    """Whether ``record``'s turn began a new conversation instead of continuing the
    thread's (its record carries the ``session_lost`` warning)."""
    return any(w.get("code") == SESSION_LOST for w in record.warnings or ())
