"""The AG-UI endpoint's answers: an input's frontend tool results and resume entries,
applied to the corral run on its thread that waits for them."""

from __future__ import annotations

from dataclasses import dataclass

from corral.server._agui import AguiInputError, Answers
from corral.server._agui_runs import Segments
from corral.stores._protocols import Store
from corral.stores._records import RunRecord
from corral.tools._approvals import ApprovalError, answer_approval
from corral.tools._frontend import FrontendCallError, answer_frontend_call

__all__ = ["Continuation", "apply_answers"]

MAX_RUNS = 50
"""The newest runs of a thread searched for the waits an input answers."""


@dataclass(frozen=True, slots=True)
class Continuation:
    """The corral run an input continues and the segment (AG-UI run) it gets."""

    record: RunRecord
    segment: int


async def _waits_of(store: Store, thread_id: str, ids: set[str]
                    ) -> tuple[RunRecord, Segments] | None:
    runs = list(reversed(await store.list_by_thread(thread_id)))[:MAX_RUNS]
    for record in runs:
        segments = Segments(thread_id, record.run_id, target=None)
        for logged in await store.snapshot(record.run_id):
            segments.feed(logged)
        if any(w.ids & ids for w in segments.waits()):
            return record, segments
    return None


def _unknown(kind: str, ident: str, thread_id: str) -> AguiInputError:
    return AguiInputError(
        f"{kind} {ident[:80]!r} answers nothing corral asked on thread {thread_id[:80]!r}; "
        "send only the results and resume entries of the run's last RUN_FINISHED")


async def apply_answers(store: Store, thread_id: str, answers: Answers) -> Continuation:
    """Store ``answers`` for the run of ``thread_id`` that asked for them (a repeated
    input's answers, already stored, are left as they are) and name the segment that
    follows. Every answer is checked before any is stored. Raises :class:`AguiInputError`
    for an answer to something no run of the thread asked, or of the wrong kind."""
    found = await _waits_of(store, thread_id, answers.ids)
    if found is None:
        kind, ident = (("tool message for toolCallId", next(iter(answers.results)))
                       if answers.results else
                       ("resume entry for interrupt", next(iter(answers.resumed))))
        raise _unknown(kind, ident, thread_id)
    record, segments = found
    waits = segments.waits()
    calls = {w.tool_call_id: w for w in waits if w.frontend and w.tool_call_id}
    by_id = {w.approval_id: w for w in waits}
    own_calls = segments.tool_calls()
    for call_id in answers.results:
        # the result of one of the agent's own calls (a parallel Bash call, say) is the
        # client's copy of what the stream showed: history, not an answer
        if call_id not in calls and call_id not in own_calls:
            raise _unknown("tool message for toolCallId", call_id, thread_id)
    for interrupt_id in answers.resumed:
        if interrupt_id not in by_id:
            raise _unknown("resume entry for interrupt", interrupt_id, thread_id)
        frontend = by_id[interrupt_id].frontend
        if frontend and interrupt_id in answers.decisions:
            raise AguiInputError(f"resume entry for interrupt {interrupt_id[:80]!r}: it is "
                                 'a frontend tool call; resume it with {"content": text}')
        if not frontend and interrupt_id in answers.outputs:
            raise AguiInputError(f"resume entry for interrupt {interrupt_id[:80]!r}: it is "
                                 'an approval; resume it with {"decision": "allow"|"deny"}')
    results = {calls[c].approval_id: r for c, r in answers.results.items() if c in calls}
    results.update(answers.outputs)
    results.update({i: ("", "cancelled by the client") for i in answers.cancelled
                    if by_id[i].frontend})
    for approval_id, (content, error) in results.items():
        try:
            await answer_frontend_call(store, record.run_id, approval_id, content,
                                       error=error)
        except FrontendCallError as exc:
            raise AguiInputError(f"frontend tool call {approval_id[:80]!r}: {exc}") from None
    decisions = dict(answers.decisions)
    decisions.update({i: (False, "cancelled by the client") for i in answers.cancelled
                      if not by_id[i].frontend})
    for interrupt_id, (allow, reason) in decisions.items():
        try:
            await answer_approval(store, record.run_id, interrupt_id, allow, reason=reason)
        except ApprovalError:
            # answered already (a repeated input, `corral approve`, or a race with
            # either: the first answer stands) or no longer pending (the call ended);
            # every id was checked above to be an approval this run announced
            pass
    segment = segments.segment_after(set(results) | set(decisions))
    assert segment is not None  # every answered id ended a segment
    return Continuation(record, segment)
