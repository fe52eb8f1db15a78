"""A hostile ACP agent for the bridge's protocol-edge tests (what no real agent does on
purpose): it speaks the real wire format (newline-delimited JSON-RPC 2.0) but also writes
garbage and an oversized line, asks for client methods corral does not offer, and asks
permission for a tool call it never announced (as gemini --acp does). Scenario from argv[1].
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

SID = "sess-fake-1"
OPTIONS = [
    {"optionId": "yes-always", "name": "Allow once", "kind": "allow_always"},  # a lying name
    {"optionId": "yes", "name": "Reject", "kind": "allow_once"},
    {"optionId": "no", "name": "Allow", "kind": "reject_once"},
]


def out(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def read() -> dict[str, Any]:
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    msg: dict[str, Any] = json.loads(line)
    return msg


def update(session_update: str, **fields: Any) -> None:
    out({"jsonrpc": "2.0", "method": "session/update",
         "params": {"sessionId": SID, "update": {"sessionUpdate": session_update, **fields}}})


def say(text: str) -> None:
    update("agent_message_chunk", content={"type": "text", "text": text})


def ask(req_id: Any, method: str, params: dict[str, Any]) -> dict[str, Any]:
    out({"jsonrpc": "2.0", "id": req_id, "method": method, "params": params})
    while True:
        msg = read()
        if msg.get("id") == req_id and "method" not in msg:
            return msg


def reopen(mode: str) -> None:
    """Scenarios ``resume`` (advertises session/resume and session/close), ``resume-fails``
    (advertises session/resume, which then fails; session/load works), ``both-fail`` (the
    session is gone: resume and load fail) and ``load`` (only loadSession): a loaded
    session replays its history first; the prompt says ``fresh``."""
    while True:
        msg = read()
        method, mid = msg.get("method"), msg.get("id")
        if method == "initialize":
            caps: dict[str, Any] = {"loadSession": True}
            if mode != "load":
                caps["sessionCapabilities"] = {"resume": {}, "close": {}}
            out({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": 1,
                                                          "agentCapabilities": caps}})
        elif method == "session/resume":
            if mode in ("resume-fails", "both-fail"):
                out({"jsonrpc": "2.0", "id": mid,
                     "error": {"code": -32002, "message": "no such session"}})
            else:
                out({"jsonrpc": "2.0", "id": mid, "result": {}})
        elif method == "session/load" and mode == "both-fail":
            out({"jsonrpc": "2.0", "id": mid,
                 "error": {"code": -32002, "message": "no such session"}})
        elif method == "session/load":
            say("old history")
            out({"jsonrpc": "2.0", "id": mid, "result": {}})
        elif method == "session/new":
            out({"jsonrpc": "2.0", "id": mid, "result": {"sessionId": "sess-new"}})
        elif method == "session/prompt":
            say("fresh")
            out({"jsonrpc": "2.0", "id": mid, "result": {"stopReason": "end_turn"}})
        elif method == "session/close":
            out({"jsonrpc": "2.0", "id": mid, "result": {}})


def main() -> None:
    scenario = sys.argv[1]
    if scenario.startswith("reopen:"):
        reopen(scenario.split(":", 1)[1])
        return
    prompt_id = None
    while prompt_id is None:
        msg = read()
        method, mid = msg.get("method"), msg.get("id")
        if method == "initialize":
            out({"jsonrpc": "2.0", "id": mid, "result": {
                "protocolVersion": 1, "agentCapabilities": {"loadSession": False}}})
        elif method == "session/new":
            out({"jsonrpc": "2.0", "id": mid, "result": {"sessionId": SID}})
        elif method == "session/prompt":
            prompt_id = mid
    if scenario == "hang":
        while True:
            msg = read()
            if msg.get("method") == "session/cancel":
                say("cancel seen")
                out({"jsonrpc": "2.0", "id": prompt_id, "result": {"stopReason": "cancelled"}})
                time.sleep(60)
    sys.stdout.write("this is not json\n")
    sys.stdout.write("[1, 2, 3]\n")
    sys.stdout.write("x" * (int(sys.argv[2]) + 10) + "\n")
    sys.stdout.flush()
    answer = ask("fs1", "fs/read_text_file", {"sessionId": SID, "path": "/etc/passwd"})
    say(f"fs: {answer.get('error', {}).get('code')}")
    answer = ask("t9", "terminal/create", {"sessionId": SID, "command": "id"})
    say(f" terminal: {answer.get('error', {}).get('code')}")
    for call, kind, title, command in (
            ("c1", "execute", "Read", "rm -rf /workspace"),
            ("c2", "execute", "Read", ["echo", "hi there"]),
            ("c3", "other", "lookup (corral MCP Server)", None),  # a host tool (gemini)
            ("c4", "other", "Read", None)):
        # permission first, no tool_call update before it
        got = ask(f"p-{call}", "session/request_permission", {
            "sessionId": SID, "options": OPTIONS,
            "toolCall": {"toolCallId": call, "title": title, "kind": kind,
                         "rawInput": {"command": command} if command else {}}})
        outcome = got.get("result", {}).get("outcome", {})
        chosen = outcome.get("optionId")
        say(f" {call}: {chosen}")
        if chosen == "yes":
            update("tool_call", toolCallId=call, title="run", kind="execute",
                   status="completed", rawInput={"command": command},
                   content=[{"type": "content", "content": {"type": "text", "text": "ran"}}])
    update("plan", entries=[{"content": "step", "priority": "high", "status": "pending"}])
    out({"jsonrpc": "2.0", "id": prompt_id, "result": {"stopReason": "end_turn"}})


if __name__ == "__main__":
    main()
