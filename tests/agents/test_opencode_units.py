"""opencode without the CLI: its ``--format json`` lines (as 1.18.33 printed them against
the scripted server) to AG-UI events, the configuration it is given, and the model proxy's
failure limit that stops opencode's endless retries."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest
from ag_ui.core import EventType
from hypothesis import given, settings
from hypothesis import strategies as st

from corral._errors import ConfigError
from corral.harness._cli_base import SESSION_EVENT
from corral.harness._events import event_to_dict
from corral.harness._opencode import OpencodeHarness, acp_reasons, opencode_config
from corral.harness._registry import build_harness
from corral.net._model_proxy import ModelProxy, Upstream
from corral.policy._policy import Policy
from corral.testing._model_script import Fail, Text
from corral.testing._model_server import ModelServer

from .test_model_proxy import ANTHROPIC_BODY, KEY, sock, with_proxy  # noqa: F401 - fixture
from .test_translators import batches, check_well_formed, journal, j, json_value, kinds, translate

SES = "ses_dca310e3fffeEEjU1eJTkUWJKy"


def part(kind: str, pid: str, **kw: Any) -> dict[str, Any]:
    return {"id": pid, "messageID": "msg_1", "sessionID": SES, "type": kind, **kw}


TOKENS = {"total": 120, "input": 100, "output": 20, "reasoning": 0,
          "cache": {"write": 0, "read": 0}}
OK = [
    j({"type": "step_start", "timestamp": 1, "sessionID": SES,
       "part": part("step-start", "prt_1")}),
    j({"type": "text", "timestamp": 2, "sessionID": SES,
       "part": part("text", "prt_2", text="I'll run a command.")}),
    j({"type": "tool_use", "timestamp": 3, "sessionID": SES, "part": {
        "type": "tool", "tool": "bash", "callID": "toolu_corral0002", "id": "prt_3",
        "sessionID": SES, "messageID": "msg_1", "state": {
            "status": "completed", "input": {"command": "echo hi > out.txt && ls",
                                             "description": "Run a command"},
            "output": "out.txt\n", "metadata": {"output": "out.txt\n", "exit": 0},
            "title": "echo hi > out.txt && ls"}}}),
    j({"type": "step_finish", "timestamp": 4, "sessionID": SES,
       "part": part("step-finish", "prt_4", reason="tool-calls", tokens=TOKENS, cost=0)}),
    j({"type": "step_start", "timestamp": 5, "sessionID": SES,
       "part": part("step-start", "prt_5")}),
    j({"type": "text", "timestamp": 6, "sessionID": SES,
       "part": part("text", "prt_6", text="Done: out.txt")}),
    j({"type": "step_finish", "timestamp": 7, "sessionID": SES,
       "part": part("step-finish", "prt_7", reason="stop", tokens=TOKENS, cost=0)}),
]
DENIED = j({"type": "tool_use", "timestamp": 3, "sessionID": SES, "part": {
    "type": "tool", "tool": "bash", "callID": "toolu_9", "id": "prt_9", "state": {
        "status": "error", "input": {"command": "rm -rf x"},
        "error": "The user has specified a rule which prevents you from using this specific "
                 "tool call."}}})
API_ERROR = j({"type": "error", "timestamp": 8, "sessionID": SES, "error": {
    "name": "APIError", "data": {"message": "corral model proxy: the model API failed 3 "
                                            "times in a row", "statusCode": 403}}})


def test_a_successful_run() -> None:
    events = translate(OpencodeHarness(), list(OK))
    check_well_formed(events)
    assert kinds(events)[:3] == ["RUN_STARTED", "CUSTOM", "STEP_STARTED"]
    session = events[1]
    assert session.name == SESSION_EVENT and session.value == {"harness": "opencode",
                                                               "sessionId": SES}
    (start,) = [e for e in events if e.type == EventType.TOOL_CALL_START]
    assert start.tool_call_name == "shell" and start.tool_call_id == "run-7-toolu_corral0002"
    args = [e.delta for e in events if e.type == EventType.TOOL_CALL_ARGS]
    assert json.loads(args[0]) == {"command": "echo hi > out.txt && ls"}
    (result,) = [e for e in events if e.type == EventType.TOOL_CALL_RESULT]
    assert result.content == "out.txt\n"
    assert [e.delta for e in events if e.type == EventType.TEXT_MESSAGE_CONTENT] == [
        "I'll run a command.", "Done: out.txt"]
    assert kinds(events).count("STEP_STARTED") == kinds(events).count("STEP_FINISHED") == 2
    end = events[-1]
    assert end.type == EventType.RUN_FINISHED
    assert end.usage[0].input_tokens == 200 and end.usage[0].output_tokens == 40
    assert end.result == {"text": "Done: out.txt", "sessionId": SES}


def test_refused_calls_errors_and_a_missing_stop_are_run_shapes() -> None:
    events = translate(OpencodeHarness(), [OK[0], DENIED, OK[3]])
    check_well_formed(events)
    (result,) = [e for e in events if e.type == EventType.TOOL_CALL_RESULT]
    assert "prevents you from using" in result.content
    # exit 0 without a step that stopped (opencode auto-rejected an ask): an error
    assert events[-1].type == EventType.RUN_ERROR
    assert events[-1].code == "opencode:no-result"
    events = translate(OpencodeHarness(), [OK[0], API_ERROR], code=1)
    check_well_formed(events)
    assert events[-1].type == EventType.RUN_ERROR
    assert events[-1].code == "opencode:APIError" and "failed 3 times" in events[-1].message


def test_host_tools_keep_their_names_and_failed_commands_show_the_exit_code() -> None:
    lines = [j({"type": "tool_use", "sessionID": SES, "part": {
        "tool": "corral_read_host_state", "callID": "c1", "state": {
            "status": "completed", "input": {"key": "k"}, "output": "k=v"}}}),
        j({"type": "tool_use", "sessionID": SES, "part": {
            "tool": "bash", "callID": "c2", "state": {
                "status": "completed", "input": {"command": "false"}, "output": "",
                "metadata": {"exit": 1}}}})]
    events = translate(OpencodeHarness(), lines)
    check_well_formed(events)
    names = [e.tool_call_name for e in events if e.type == EventType.TOOL_CALL_START]
    assert names == ["read_host_state", "shell"]
    results = [e.content for e in events if e.type == EventType.TOOL_CALL_RESULT]
    assert results == ["k=v", "exit code 1"]


opencode_types = st.sampled_from(["step_start", "step_finish", "text", "reasoning",
                                  "tool_use", "error", "x"])
oc_value = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=6),
              st.sampled_from(["bash", "completed", "error", "stop", "corral_x", SES])),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.sampled_from(["part", "state", "status", "tool", "callID", "id",
                                         "input", "output", "error", "metadata", "exit",
                                         "tokens", "reason", "text", "sessionID", "data",
                                         "message", "name"]), children, max_size=5)),
    max_leaves=20)
oc_line = st.one_of(
    st.builds(lambda t, rest: json.dumps({**rest, "type": t} if isinstance(rest, dict)
                                         else rest).encode(), opencode_types, oc_value),
    st.sampled_from([x.encode() for x in [*OK, DENIED, API_ERROR]]),
    json_value.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=30).filter(lambda b: b"\n" not in b))


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(oc_line, max_size=12), code=st.sampled_from([0, 1, 137]))
def test_property_any_output_gives_a_well_formed_run(lines: list[bytes], code: int) -> None:
    events = translate(OpencodeHarness(), list(lines), code)
    check_well_formed(events)
    if code != 0:
        assert events[-1].type == EventType.RUN_ERROR


def test_config_and_model_choice() -> None:
    h = build_harness("opencode", {"model": "openai/gpt-fake"})
    assert isinstance(h, OpencodeHarness) and h.upstream_api() == "openai"
    assert build_harness("opencode", {}).upstream_api() == "anthropic"
    cfg = opencode_config("anthropic/claude-x", "http://127.0.0.1:9/v1", "placeholder",
                          {"bash": "allow"}, {"corral": {
                              "url": "http://127.0.0.1:8/mcp",
                              "headers": {"Authorization": "Bearer ${CORRAL_TOOLS_TOKEN}"}}})
    assert cfg["provider"] == {"anthropic": {
        "options": {"baseURL": "http://127.0.0.1:9/v1", "apiKey": "placeholder"},
        "models": {"claude-x": {"name": "claude-x", "tool_call": True,
                                "limit": {"context": 200000, "output": 8192}}}}}
    assert cfg["mcp"]["corral"]["headers"] == {
        "Authorization": "Bearer {env:CORRAL_TOOLS_TOKEN}"}  # the token stays in the env
    for bad in ("gpt-4", "google/gemini", "anthropic/", "anthropic/a b", "../x/y"):
        with pytest.raises(ConfigError, match="provider/model"):
            OpencodeHarness(model=bad)
    with pytest.raises(ConfigError, match="file_write: deny with default: allow"):
        OpencodeHarness(policy=Policy(default="allow", file_write="deny"))
    h = OpencodeHarness(policy=Policy(default="deny", allow=("pytest *", "git status"),
                                      deny=("git push *",), network="deny"))
    assert h.permission == {"bash": {"*": "deny", "pytest *": "allow", "git status": "allow",
                                     "git push *": "deny"},
                            "edit": "allow", "webfetch": "deny", "external_directory": "allow"}


def test_policies_needing_approvals_route_through_opencode_acp() -> None:
    """Ask rules (and what only corral's own policy check can decide) route the run
    through `opencode acp`; allow/deny word prefixes stay with `opencode run`. The choice
    is the policy's alone, so a successor building the harness from the spec agrees."""
    assert acp_reasons(None) == []
    assert acp_reasons(Policy(default="deny", allow=("pytest *",), deny=("rm *",))) == []
    assert acp_reasons(Policy(default="ask", allow=("git*",), file_write="ask",
                              ask=("git push *",))) == [
        "ask rules ['git push *']", "default: ask", "file_write: ask",
        "patterns ['git*'] (not plain word prefixes)"]
    plain = OpencodeHarness(policy=Policy(default="allow", deny=("rm *",)),
                            permission_prompt=True)
    assert not plain.bridged and plain.acp is None and not plain.policy_mapping.permission_prompt
    assert plain.session_markers == (b"sessionID",)
    # without corral's permission prompt (a run with no tool server) there is no one to ask
    with pytest.raises(ConfigError, match=r"ask rules \['git push \*'\] are answered "
                                          r"through `opencode acp`"):
        OpencodeHarness(policy=Policy(default="allow", ask=("git push *",)))
    spec = {"model": "openai/gpt-fake", "permission_prompt": True,
            "policy": Policy(default="deny", ask=("git push *",)).to_dict()}
    routed = build_harness("opencode", spec)
    assert isinstance(routed, OpencodeHarness) and routed.bridged and routed.acp is not None
    assert routed.acp.model == "openai/gpt-fake" and routed.upstream_api() == "openai"
    assert routed.name == "opencode"  # its record, its saved sessions
    assert routed.policy_mapping.permission_prompt
    assert "`opencode acp`" in routed.policy_mapping.enforced[0]
    assert routed.session_markers == (b'"sessionId"',)
    assert routed.session_id({"acp": "recv", "msg": {"id": 2, "result": {
        "sessionId": SES}}}) == SES
    events = translate(routed, [
        j({"acp": "send", "msg": {"jsonrpc": "2.0", "id": 2, "method": "session/new",
                                  "params": {}}}),
        j({"acp": "recv", "msg": {"jsonrpc": "2.0", "id": 2, "result": {"sessionId": SES}}}),
    ])
    (session,) = [e for e in events if getattr(e, "name", None) == SESSION_EVENT]
    assert session.value == {"harness": "opencode", "sessionId": SES}
    # the result: the turn's last text message (as `opencode run`'s), not all its text
    def chunk(text: str) -> str:
        return j({"acp": "recv", "msg": {"jsonrpc": "2.0", "method": "session/update",
                  "params": {"sessionId": SES, "update": {
                      "sessionUpdate": "agent_message_chunk",
                      "content": {"type": "text", "text": text}}}}})
    turn = [
        j({"acp": "send", "msg": {"jsonrpc": "2.0", "id": 3, "method": "session/prompt",
                                  "params": {"sessionId": SES}}}),
        chunk("Step 1."),
        j({"acp": "recv", "msg": {"jsonrpc": "2.0", "method": "session/update", "params": {
            "sessionId": SES, "update": {"sessionUpdate": "tool_call", "toolCallId": "c1",
                                         "kind": "execute", "status": "completed",
                                         "rawInput": {"command": "ls"}}}}}),
        chunk("Done: "), chunk("out.txt"),
        j({"acp": "recv", "msg": {"jsonrpc": "2.0", "id": 3, "result": {
            "stopReason": "end_turn"}}}),
    ]
    finished = translate(routed, turn)[-1]
    assert finished.type == EventType.RUN_FINISHED
    assert finished.result == {"text": "Done: out.txt"}
    # the same policy without ask rules: the same harness as before
    again = build_harness("opencode", {**spec, "policy": Policy(default="deny").to_dict()})
    assert isinstance(again, OpencodeHarness) and not again.bridged


def test_proxy_failure_limit_refuses_after_failures_in_a_row(sock: Path) -> None:  # noqa: F811
    script = [Fail(500), Text("ok"), Fail(502), Fail(503), Text("never sent")]
    with ModelServer(script) as srv:
        proxy = ModelProxy(Upstream("anthropic", srv.url, KEY), max_failures=2)

        async def body(c: httpx.AsyncClient) -> list[httpx.Response]:
            return [await c.post("/v1/messages", json=ANTHROPIC_BODY) for _ in range(5)]

        statuses = [r.status_code for r in with_proxy(proxy, sock, body)]
        n = len(srv.model_requests)
    # a success resets the count; two failures in a row stop further requests
    assert statuses == [500, 200, 502, 503, 403] and n == 4
    assert proxy.usage.refused == 1
    with pytest.raises(ConfigError, match="max_failures"):
        ModelProxy(Upstream("anthropic", "http://x", KEY), max_failures=0)


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(oc_line, min_size=1, max_size=10), code=st.sampled_from([0, 1]),
       data=st.data())
def test_property_resume_at_any_logged_offset_equals_the_full_tail(
        lines: list[bytes], code: int, data: st.DataObject) -> None:
    """A successor driver translating after the last logged batch logs exactly what an
    uninterrupted one would have."""
    harness = OpencodeHarness()
    with tempfile.TemporaryDirectory() as d:
        path = journal(d, list(lines), code)
        full = batches(harness, path)
        k = data.draw(st.integers(0, len(full) - 1), label="last logged batch")
        resumed = batches(harness, path, after=full[k].journal_offset)

    def wire(bs: list[Any]) -> list[tuple[int, list[dict[str, Any]]]]:
        return [(b.journal_offset, [event_to_dict(e) for e in b.events]) for b in bs]

    assert wire(resumed) == wire(full[k + 1:])
