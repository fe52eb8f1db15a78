"""The run events → ACP session updates translation (``corral acp``): the agent's output is
hostile, so any event, of any shape, translates without an error into well-formed
updates; and a tool call's life comes out as the editor expects it."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.server._acp_updates import UpdateTranslator, tool_kind

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=10), inner, max_size=3), max_leaves=10)
TYPES = st.sampled_from(["TEXT_MESSAGE_CONTENT", "REASONING_MESSAGE_CONTENT", "TOOL_CALL_START",
                         "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT", "RUN_ERROR",
                         "CUSTOM", "RUN_STARTED", "STEP_STARTED"])
EVENT = st.fixed_dictionaries({"type": TYPES}, optional={
    "delta": JSON, "toolCallId": st.text(max_size=5) | JSON, "toolCallName": JSON,
    "content": JSON, "message": JSON, "name": st.sampled_from(
        ["sandbox.file", "sandbox.file.diff", "corral.prompt", "other"]) | JSON,
    "value": JSON | st.fixed_dictionaries({"path": JSON, "type": JSON, "diff": JSON,
                                           "prompt": JSON})})


def _well_formed(update: dict[str, Any]) -> None:
    kind = update["sessionUpdate"]
    if kind.endswith("_chunk"):
        assert isinstance(update["content"]["text"], str) and update["content"]["text"]
    else:
        assert kind in ("tool_call", "tool_call_update")
        assert isinstance(update["toolCallId"], str)
        if kind == "tool_call":
            assert isinstance(update["title"], str) and len(update["title"]) <= 200


@settings(max_examples=300, deadline=None)
@given(st.lists(EVENT, max_size=12), st.booleans())
def test_any_events_translate_into_well_formed_updates(events: list[dict[str, Any]],
                                                       replay: bool) -> None:
    translator = UpdateTranslator("/home/me/project", replay=replay)
    for event in events:
        for update in translator.updates(event):
            _well_formed(update)


def test_a_tool_calls_life() -> None:
    t = UpdateTranslator("/home/me/project")
    start = t.updates({"type": "TOOL_CALL_START", "toolCallId": "c1", "toolCallName": "Bash"})
    assert start == [{"sessionUpdate": "tool_call", "toolCallId": "c1", "title": "Bash",
                      "kind": "execute", "status": "pending"}]
    assert t.updates({"type": "TOOL_CALL_ARGS", "toolCallId": "c1",
                      "delta": '{"command": "ls"'}) == []
    t.updates({"type": "TOOL_CALL_ARGS", "toolCallId": "c1", "delta": "}"})
    (running,) = t.updates({"type": "TOOL_CALL_END", "toolCallId": "c1"})
    assert running["status"] == "in_progress" and running["title"] == "ls"
    assert running["rawInput"] == {"command": "ls"}
    (done,) = t.updates({"type": "TOOL_CALL_RESULT", "toolCallId": "c1", "content": "a\nb"})
    assert done["status"] == "completed"
    assert done["content"] == [{"type": "content", "content": {"type": "text", "text": "a\nb"}}]
    (edit,) = t.updates({"type": "TOOL_CALL_START", "toolCallId": "c2",
                         "toolCallName": "Edit"})
    assert edit["kind"] == "edit"
    t.updates({"type": "TOOL_CALL_ARGS", "toolCallId": "c2",
               "delta": '{"file_path": "/workspace/src/x.py"}'})
    (where,) = t.updates({"type": "TOOL_CALL_END", "toolCallId": "c2"})
    assert where["locations"] == [{"path": "/home/me/project/src/x.py"}]


def test_files_and_prompts() -> None:
    live = UpdateTranslator("/p")
    (changed,) = live.updates({"type": "CUSTOM", "name": "sandbox.file",
                               "value": {"type": "change", "path": "a.txt"}})
    assert changed["kind"] == "edit" and changed["locations"] == [{"path": "/p/a.txt"}]
    (patch,) = live.updates({"type": "CUSTOM", "name": "sandbox.file.diff",
                             "value": {"path": "a.txt", "diff": "@@ -1 +1 @@\n-a\n+b\n"}})
    assert patch["toolCallId"] == changed["toolCallId"]
    # a path climbing out of the workspace is shown as given, never joined under the project
    (out,) = live.updates({"type": "CUSTOM", "name": "sandbox.file",
                           "value": {"type": "create", "path": "../../etc/x"}})
    assert out["locations"] == [{"path": "../../etc/x"}]
    prompt = {"type": "CUSTOM", "name": "corral.prompt", "value": {"prompt": "fix it"}}
    assert live.updates(prompt) == []  # live, the editor shows what its user typed
    assert UpdateTranslator(replay=True).updates(prompt) == [
        {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "fix it"}}]
    assert tool_kind("mcp__corral__read_file") == "read" and tool_kind("zzz") == "other"
