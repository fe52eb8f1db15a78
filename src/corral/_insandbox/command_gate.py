"""The command gate: a PreToolUse hook that puts every Bash command through corral's policy.

Claude Code and Codex both run PreToolUse hooks (same input: ``tool_name``, ``tool_input``
with ``command``, ``tool_use_id``; same answers: ``hookSpecificOutput.permissionDecision``
or exit status 2 with the reason on stderr). Claude Code runs commands it judges read-only
(``echo``, ``cat``, ``ls`` ...) without asking its permission prompt tool, and ``codex
exec`` has no per-command rules at all; this hook closes both gaps. The CLI runs it before
*every* Bash call. It sends the call to the run's ``corral`` MCP server (``tools/call
permission_prompt``: :meth:`corral.policy._policy.Policy.evaluate`, then a corral approval
for ``ask``) and answers:

* allowed: ``permissionDecision: "allow"`` (Claude Code then does not ask its prompt tool
  a second time);
* denied, or anything going wrong (bad answer, no token, an HTTP error): exit status 2
  with the reason on stderr, which the CLI treats as a block and shows the model. The gate
  fails closed.

No driver serving the run's tool socket (it was SIGKILLed or detached while an approval was
pending, and the forwarder found nothing to connect to or lost the connection mid-answer) is
no answer: the gate asks again, backing off to 1 s, for up to ``PATIENCE`` seconds (the
second argument: the run's timeout), and a successor (``corral attach``) answers. The
approval is keyed by the tool call, so the successor finds the same request and any answer
given meanwhile; the same question is never announced twice.

Gemini CLI runs the same gate as a ``BeforeTool`` hook on ``run_shell_command`` (input:
``hook_event_name: "BeforeTool"``, ``tool_name``, ``tool_input`` with ``command``, no call
id): the gate asks about it as a Bash command, keyed by a digest of the hook's input (it
carries the session and a timestamp, so each call has its own key and a retry the same
one). Gemini reads exit status 2 with text on stderr as ``decision: deny`` with that text
as the reason, and any other failure of the hook as *no objection*: the gate therefore
never exits otherwise than 0 (allowed, ``{"decision": "allow"}``) or 2.

It runs inside the sandbox as ``python3 -I -S -c <this file's source> URL`` (stdlib only:
the sandbox has the system Python, not corral), with the token from the CLI's environment
(``CORRAL_TOOLS_TOKEN``). The command line lives in the CLI's argv (Claude Code
``--settings``, Codex ``-c hooks.PreToolUse``), so nothing the agent can write changes it.
:func:`corral.harness._cli_base.bash_gate_command` builds it.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
from typing import Any

TOKEN_ENV = "CORRAL_TOOLS_TOKEN"
TOOL = "permission_prompt"
SHELL_TOOLS = {"Bash": "PreToolUse", "run_shell_command": "BeforeTool"}
"""The shell tool of each CLI, and the hook event it comes in (Claude Code and Codex:
``Bash``/``PreToolUse``; Gemini CLI: ``run_shell_command``/``BeforeTool``)."""
PATIENCE = 3600.0
"""Seconds the gate keeps asking while no driver answers (a run without a timeout); the
CLI's hook timeout (``GATE_TIMEOUT``) is longer, since a hook that times out lets the
command run unchecked."""


def _post(url: str, body: bytes, token: str, timeout: float) -> bytes:
    """POST ``body`` to ``http://host:port/path`` and return the response body (HTTP/1.1 by
    hand: ``urllib`` would cost ~50 ms of imports on every command). No answer, a cut one or
    a 5xx (the driver stopped mid-answer) raise ``ConnectionError``: worth asking again."""
    if not url.startswith("http://"):
        raise RuntimeError(f"unsupported URL {url!r}")
    hostport, _, path = url[len("http://"):].partition("/")
    host, _, port = hostport.rpartition(":")
    head = (f"POST /{path} HTTP/1.1\r\nHost: {hostport}\r\n"
            "Content-Type: application/json\r\n"
            "Accept: application/json, text/event-stream\r\n"
            f"Authorization: Bearer {token}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=timeout) as conn:
        conn.sendall(head + body)
        chunks = []
        while data := conn.recv(65536):
            chunks.append(data)
    return parse_response(b"".join(chunks))


def parse_response(raw: bytes) -> bytes:
    """The body of a complete HTTP/1.1 response (``Content-Length``, chunked, or up to
    the end); anything but a 200 raises."""
    header, sep, payload = raw.partition(b"\r\n\r\n")
    if not sep:
        raise ConnectionError("no answer" if not raw else "truncated answer")
    lines = header.decode("latin-1").split("\r\n")
    status = lines[0].split(" ", 2)
    if len(status) < 2 or status[1] != "200":
        if status[1:2] and status[1].startswith("5"):
            raise ConnectionError(f"the run's MCP server answered {lines[0][:100]!r}")
        raise RuntimeError(f"the run's MCP server answered {lines[0][:100]!r}")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    if "chunked" in headers.get("transfer-encoding", "").lower():
        out = b""
        while True:
            size_line, sep, payload = payload.partition(b"\r\n")
            if not sep:
                raise ConnectionError("truncated chunked answer")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                return out
            if len(payload) < size + 2:
                raise ConnectionError("truncated chunked answer")
            out += payload[:size]
            payload = payload[size + 2:]
    if "content-length" in headers:
        length = int(headers["content-length"])
        if len(payload) < length:
            raise ConnectionError("truncated answer")
        return payload[:length]
    return payload


def _ask(url: str, hook: dict[str, Any], patience: float) -> dict[str, Any]:
    token = os.environ.get(TOKEN_ENV)
    if not token:
        raise RuntimeError(f"{TOKEN_ENV} is not set")
    call_id = hook.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        # Gemini CLI gives no call id: its input (session, timestamp, command) keys the call
        call_id = "h-" + hashlib.sha256(json.dumps(hook, sort_keys=True).encode()).hexdigest()[:32]
    body = json.dumps({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": TOOL, "arguments": {
            "tool_name": "Bash", "input": hook.get("tool_input"),
            "tool_use_id": call_id}},
    }).encode()
    deadline = time.monotonic() + patience
    delay = 0.05
    while True:
        try:
            raw = _post(url, body, token, max(deadline - time.monotonic(), 0.1))
            break
        except OSError:  # no driver now (ConnectionError, a timeout): a successor answers
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
    answer = json.loads(raw)
    result = answer["result"]
    text = "".join(c.get("text", "") for c in result.get("content", []))
    if result.get("isError"):
        raise RuntimeError(text or "the permission check failed")
    verdict = json.loads(text)
    if not isinstance(verdict, dict):
        raise RuntimeError("malformed answer")
    return verdict


def main(argv: list[str]) -> int:
    try:
        hook = json.loads(sys.stdin.read())
        if hook.get("tool_name") not in SHELL_TOOLS:
            return 0  # only shell commands are routed here; anything else takes the CLI's path
        verdict = _ask(argv[1], hook, float(argv[2]) if len(argv) > 2 else PATIENCE)
    except Exception as exc:  # noqa: BLE001 - any failure blocks the command
        sys.stderr.write(f"corral could not check this command against the sandbox policy "
                         f"({exc.__class__.__name__}: {exc}); it was not run\n")
        return 2
    if verdict.get("behavior") == "allow":
        if hook.get("hook_event_name") == "BeforeTool":
            sys.stdout.write(json.dumps({"decision": "allow"}))
            return 0
        sys.stdout.write(json.dumps({"hookSpecificOutput": {
            "hookEventName": "PreToolUse", "permissionDecision": "allow",
            "permissionDecisionReason": "allowed by corral policy"}}))
        return 0
    sys.stderr.write(str(verdict.get("message") or "denied by corral policy") + "\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
