"""An input's answers, applied to the run of its thread that waits for them: the frontend
call answered with the client's content, the agent's own (parallel) calls in the client's
history left alone, anything else refused in one line naming it."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from corral.server._agui import AguiInputError, Answers
from corral.server._agui_answer import apply_answers
from corral.stores._memory import MemoryStore
from corral.stores._protocols import ApprovalRequest, NewRun
from corral.tools._approvals import ApprovalSigner

CALL = [{"type": "TOOL_CALL_START", "toolCallId": "toolu_bash", "toolCallName": "Bash"},
        {"type": "TOOL_CALL_END", "toolCallId": "toolu_bash"},
        {"type": "TOOL_CALL_START", "toolCallId": "toolu_fe", "toolCallName": "pick"},
        {"type": "TOOL_CALL_END", "toolCallId": "toolu_fe"},
        {"type": "TOOL_CALL_RESULT", "messageId": "r", "toolCallId": "toolu_bash",
         "content": "ok"}]


async def _waiting_run() -> tuple[MemoryStore, str]:
    """A run on thread ``th`` whose agent ran Bash and called frontend tool ``pick``."""
    store = MemoryStore()
    await store.create(NewRun("run-a", "th", harness="claude-code"))
    claim = await store.acquire_claim("run-a", "me", 60)
    call_id = (await ApprovalSigner.for_store(store)).new_id("run-a")
    now = time.time()
    await store.add_approval(ApprovalRequest(call_id, "run-a", "frontend:pick", {}, now,
                                             now + 60, call_id="toolu_fe"))
    announce = {"type": "CUSTOM", "name": "corral.frontend_call",
                "value": {"approvalId": call_id, "toolCallId": "toolu_fe", "tool": "pick",
                          "args": {}}}
    events: list[dict[str, Any]] = [{"type": "RUN_STARTED", "threadId": "th",
                                     "runId": "run-a"}, *CALL, announce]
    await store.append("run-a", [(e, 0) for e in events], epoch=claim.epoch)
    return store, call_id


def test_the_frontend_result_is_answered_and_the_agents_own_results_are_history() -> None:
    async def main() -> None:
        store, call_id = await _waiting_run()
        answers = Answers({"toolu_bash": ("ok", None), "toolu_fe": ("teal", None)}, {})
        going_on = await apply_answers(store, "th", answers)
        assert going_on.record.run_id == "run-a" and going_on.segment == 1
        got = await store.get_approval("run-a", call_id)
        assert got is not None and got[1] is not None and got[1].reason == "teal"
        # the same input again: the first answer stands, the same AG-UI run follows
        again = await apply_answers(store, "th", Answers({"toolu_fe": ("blue", None)}, {}))
        assert again.segment == 1
        got = await store.get_approval("run-a", call_id)
        assert got is not None and got[1] is not None and got[1].reason == "teal"

    anyio.run(main)


@pytest.mark.parametrize(("answers", "says"), [
    (Answers({"toolu_fe": ("x", None), "toolu_ghost": ("x", None)}, {}),
     "tool message for toolCallId 'toolu_ghost' answers nothing corral asked on thread 'th'"),
    (Answers({"toolu_ghost": ("x", None)}, {}), "'toolu_ghost' answers nothing"),
    # an approval of another run or a forged one is not this thread's to answer
    (Answers({}, {"abc.def": (True, None)}), "resume entry for interrupt 'abc.def'"),
    (Answers({"toolu_fe": ("x", None)}, {"abc.def": (True, None)}),
     "resume entry for interrupt 'abc.def'"),
])
def test_answers_to_what_nobody_asked_are_refused(answers: Answers, says: str) -> None:
    _refused(answers, says)


def test_an_answer_of_the_wrong_kind_is_refused() -> None:
    async def main() -> None:
        store, call_id = await _waiting_run()
        with pytest.raises(AguiInputError, match="a frontend tool call; resume it with"):
            await apply_answers(store, "th", Answers({}, {call_id: (True, None)}))
        # a frontend call shown as an interrupt (beside an approval) resumes with its result
        going_on = await apply_answers(store, "th", Answers({}, outputs={
            call_id: ("teal", None)}))
        got = await store.get_approval("run-a", call_id)
        assert going_on.segment == 1 and got is not None and got[1] is not None
        assert got[1].reason == "teal"

    anyio.run(main)


def _refused(answers: Answers, says: str) -> None:
    async def main() -> None:
        store, call_id = await _waiting_run()
        with pytest.raises(AguiInputError, match=says):
            await apply_answers(store, "th", answers)
        with pytest.raises(AguiInputError, match="answers nothing"):
            await apply_answers(store, "another-thread", Answers({"toolu_fe": ("x", None)},
                                                                 {}))
        got = await store.get_approval("run-a", call_id)
        assert got is not None and got[1] is None  # nothing half-written

    anyio.run(main)
