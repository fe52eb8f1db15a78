"""A scripted model server for tests: Anthropic Messages, OpenAI Responses and Gemini
``generateContent``, streamed.

It runs on ``127.0.0.1`` (an ephemeral port) or a unix socket in a background thread, so
sync tests, async tests and benchmarks can all use it. Every request is recorded
(:attr:`ModelServer.requests`: method, path, headers with the API key, parsed body) and
answered by a *script*: a function of the :class:`ModelRequest` that returns a reply, or a
list of replies used in order.

Replies: :class:`Text` (a final answer), :class:`ToolCall` (ask the agent to run a shell
command), :class:`Fail` (an HTTP error in the protocol's error shape), :class:`Hang`
(never answer, optionally after part of a stream), and any reply can be slowed down with
``delay`` (seconds between SSE frames) and carry ``reasoning`` text.

The wire formats are exactly what the real CLIs were seen to accept (see the
``harness-cli-facts`` reference): ``event: <name>\\ndata: <json>\\n\\n`` frames sent with
``Connection: close`` and no content length. The stock script :func:`shell_then_text`
mirrors the stateless rule that works for every CLI: the last user turn carries a tool
result → final text, otherwise → call the shell tool.

Example::

    with ModelServer(shell_then_text("echo hi > out.txt", "done: {output}")) as srv:
        env = {"ANTHROPIC_BASE_URL": srv.url, "ANTHROPIC_API_KEY": "k"}
        ...
        assert srv.requests[0].api_key == "k"
"""

from __future__ import annotations

import json
import os
import socketserver
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, Self

from corral.testing._polling import wait_until

__all__ = [
    "Fail",
    "Hang",
    "ModelRequest",
    "ModelServer",
    "Reply",
    "Script",
    "Text",
    "ToolCall",
    "shell_then_text",
]

Protocol = Literal["anthropic", "openai-responses", "gemini", "other"]
SHELL_TOOLS = ("Bash", "bash", "exec_command", "shell_command", "shell", "run_shell_command")


# ---------------------------------------------------------------- replies


@dataclass(frozen=True)
class Text:
    """A final text answer (``end_turn`` / a completed response)."""

    text: str
    reasoning: str | None = None
    delay: float = 0.0
    """Seconds to wait before each SSE frame (a slow stream)."""
    input_tokens: int = 100
    output_tokens: int = 20


@dataclass(frozen=True)
class ToolCall:
    """Ask the agent to run ``command`` with its shell tool (preceded by ``text`` if set)."""

    command: str
    text: str | None = None
    reasoning: str | None = None
    tool: str | None = None
    """Tool name; default: the first shell-like tool the request offers."""
    args: dict[str, Any] | None = None
    """The tool's input as given (instead of the shell arguments built from ``command``)."""
    namespace: str | None = None
    """Responses API only: the tool namespace the tool is offered in (Codex offers MCP
    tools as ``{"type": "namespace", "name": "mcp__<server>", "tools": [...]}``); the
    function call then carries ``namespace`` and the bare ``tool`` name."""
    delay: float = 0.0
    input_tokens: int = 100
    output_tokens: int = 20


@dataclass(frozen=True)
class Fail:
    """An HTTP error with the protocol's error body."""

    status: int = 500
    message: str = "scripted failure"
    kind: str = "api_error"


@dataclass(frozen=True)
class Hang:
    """Never answer (until the server stops). With ``after_frames`` > 0, first stream that
    many frames of ``then`` (a reply), then stall mid-stream."""

    after_frames: int = 0
    then: Text | ToolCall | None = None


Reply = Text | ToolCall | Fail | Hang


@dataclass
class ModelRequest:
    """One recorded request."""

    method: str
    path: str
    headers: dict[str, str]
    """Lower-cased header names."""
    body: Any
    """Parsed JSON body (``None`` when empty or not JSON)."""
    raw: bytes
    protocol: Protocol
    reply: str = ""
    """What the server answered (a short description, filled in after scripting)."""
    arrived: float = 0.0
    """``time.perf_counter()`` when the request's head had been read (for benchmarks)."""
    answered: float = 0.0
    """``time.perf_counter()`` when the answer's last byte was written (``0.0``: not yet, or
    never: a hang)."""

    @property
    def api_key(self) -> str | None:
        """The credential the client sent (``x-api-key``, ``x-goog-api-key`` or
        ``Authorization: Bearer``)."""
        for header in ("x-api-key", "x-goog-api-key"):
            if header in self.headers:
                return self.headers[header]
        auth = self.headers.get("authorization", "")
        return auth[7:] if auth.lower().startswith("bearer ") else (auth or None)

    @property
    def model(self) -> str:
        if self.protocol == "gemini":  # /v1beta/models/<model>:<method>
            return self.path.split("?", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]
        return str(self.body.get("model", "")) if isinstance(self.body, dict) else ""

    @property
    def tools(self) -> list[str]:
        """Names of the tools the request offers."""
        if not isinstance(self.body, dict):
            return []
        out: list[str] = []
        for tool in self.body.get("tools") or []:
            if isinstance(tool, dict) and isinstance(tool.get("functionDeclarations"), list):
                out += [str(d.get("name")) for d in tool["functionDeclarations"]
                        if isinstance(d, dict) and isinstance(d.get("name"), str)]
            elif isinstance(tool, dict):
                name = tool.get("name") or (tool.get("function") or {}).get("name")
                if isinstance(name, str):
                    out.append(name)
        return out

    @property
    def namespaced_tools(self) -> dict[str, list[str]]:
        """Responses API tool namespaces offered: ``{namespace: [tool names]}``."""
        if not isinstance(self.body, dict):
            return {}
        out: dict[str, list[str]] = {}
        for tool in self.body.get("tools") or []:
            if isinstance(tool, dict) and tool.get("type") == "namespace" \
                    and isinstance(tool.get("name"), str):
                out[tool["name"]] = [t["name"] for t in tool.get("tools") or []
                                     if isinstance(t, dict) and isinstance(t.get("name"), str)]
        return out

    @property
    def shell_tool(self) -> str | None:
        """The first shell-like tool offered, if any."""
        names = self.tools
        return next((t for t in SHELL_TOOLS if t in names), None)

    def _turns(self) -> list[tuple[str, Any]]:
        """(role, content) of the conversation, protocol-independent."""
        if not isinstance(self.body, dict):
            return []
        if self.protocol == "anthropic":
            return [
                (str(m.get("role")), m.get("content"))
                for m in self.body.get("messages") or []
                if isinstance(m, dict)
            ]
        if self.protocol == "gemini":
            return _gemini_turns(self.body.get("contents"))
        items = self.body.get("input")
        if isinstance(items, str):
            return [("user", items)]
        turns: list[tuple[str, Any]] = []
        for item in items or []:
            if not isinstance(item, dict):
                continue
            kind = item.get("type", "message")
            if kind == "message":
                turns.append((str(item.get("role")), item.get("content")))
            elif kind == "function_call_output":
                turns.append(("tool", item.get("output")))
            elif kind == "function_call":
                turns.append(("assistant-tool", item.get("arguments")))
        return turns

    @property
    def texts(self) -> list[str]:
        """Every text of the conversation (user, assistant, tool results), in order."""
        out: list[str] = []
        for _role, content in self._turns():
            out.extend(_texts(content))
        return out

    @property
    def tool_results(self) -> list[str]:
        """Tool results after the last real user message (what the agent just ran)."""
        results: list[str] = []
        for role, content in self._turns():
            if role == "tool":
                results.extend(_texts(content))
            elif role == "user":
                found = _tool_results(content)
                if found is None:
                    results = []  # a new user message: earlier results are history
                else:
                    results.extend(found)
        return results

    @property
    def last_user_text(self) -> str:
        """The text of the last user message that is not a tool result."""
        last = ""
        for role, content in self._turns():
            if role == "user" and _tool_results(content) is None:
                texts = _texts(content)
                if texts:
                    last = "\n".join(texts)
        return last


def _gemini_turns(contents: Any) -> list[tuple[str, Any]]:
    """Gemini ``contents``: a user turn of ``functionResponse`` parts is a tool turn."""
    turns: list[tuple[str, Any]] = []
    for c in contents if isinstance(contents, list) else []:
        if not isinstance(c, dict):
            continue
        parts = [p for p in c.get("parts") or [] if isinstance(p, dict)]
        responses = [p["functionResponse"] for p in parts
                     if isinstance(p.get("functionResponse"), dict)]
        if responses:
            for r in responses:
                resp = r.get("response")
                out = resp.get("output", resp) if isinstance(resp, dict) else resp
                turns.append(("tool", out if isinstance(out, str) else json.dumps(out)))
            continue
        role = "assistant" if c.get("role") == "model" else str(c.get("role"))
        texts = [p["text"] for p in parts if isinstance(p.get("text"), str)]
        if texts:
            turns.append((role, texts))
        if any(isinstance(p.get("functionCall"), dict) for p in parts):
            turns.append(("assistant-tool", None))
    return turns


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    out: list[str] = []
    if isinstance(content, list):
        for block in content:
            if isinstance(block, str):
                out.append(block)
            elif isinstance(block, dict):
                if isinstance(block.get("text"), str):
                    out.append(block["text"])
                elif block.get("type") == "tool_result":
                    out.extend(_texts(block.get("content")))
    return out


def _tool_results(content: Any) -> list[str] | None:
    """Texts of an Anthropic user turn's tool_result blocks; ``None`` if it has none."""
    if not isinstance(content, list):
        return None
    blocks = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
    if not blocks:
        return None
    out: list[str] = []
    for b in blocks:
        out.extend(_texts(b.get("content")))
    return out


Script = Callable[[ModelRequest], Reply] | Sequence[Reply]


def shell_then_text(command: str, final: str = "Done. Output: {output}") -> Callable[
    [ModelRequest], Reply
]:
    """The stateless two-step script: run ``command`` with the shell tool, then answer
    ``final`` (``{output}`` is replaced by the tool result). Prompts containing ``notool``
    get a text answer right away."""

    def script(req: ModelRequest) -> Reply:
        results = req.tool_results
        if results:
            return Text(final.replace("{output}", "\n".join(results).strip()))
        if "notool" in req.last_user_text or req.shell_tool is None:
            return Text(final.replace("{output}", ""))
        return ToolCall(command, text="I'll run a command.")

    return script


# ---------------------------------------------------------------- SSE frames


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _anthropic_frames(reply: Text | ToolCall, req: ModelRequest, n: int) -> Iterator[bytes]:
    model = req.model or "claude-fake"
    msg_id = f"msg_corral{n:04d}"
    usage = {
        "input_tokens": reply.input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 1,
    }
    yield _sse("message_start", {"type": "message_start", "message": {
        "id": msg_id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": usage}})
    yield _sse("ping", {"type": "ping"})
    index = 0
    if reply.reasoning:
        yield _sse("content_block_start", {"type": "content_block_start", "index": index,
                   "content_block": {"type": "thinking", "thinking": "", "signature": ""}})
        yield _sse("content_block_delta", {"type": "content_block_delta", "index": index,
                   "delta": {"type": "thinking_delta", "thinking": reply.reasoning}})
        yield _sse("content_block_delta", {"type": "content_block_delta", "index": index,
                   "delta": {"type": "signature_delta", "signature": "c2lnbmF0dXJl"}})
        yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
        index += 1
    text = reply.text
    if text:
        yield _sse("content_block_start", {"type": "content_block_start", "index": index,
                   "content_block": {"type": "text", "text": ""}})
        for part in _halves(text):
            yield _sse("content_block_delta", {"type": "content_block_delta", "index": index,
                       "delta": {"type": "text_delta", "text": part}})
        yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
        index += 1
    stop = "end_turn"
    if isinstance(reply, ToolCall):
        stop = "tool_use"
        tool = reply.tool or req.shell_tool or "Bash"
        args = json.dumps(reply.args if reply.args is not None else
                          {"command": reply.command, "description": "Run a command"})
        yield _sse("content_block_start", {"type": "content_block_start", "index": index,
                   "content_block": {"type": "tool_use", "id": f"toolu_corral{n:04d}",
                                     "name": tool, "input": {}}})
        for part in _halves(args):
            yield _sse("content_block_delta", {"type": "content_block_delta", "index": index,
                       "delta": {"type": "input_json_delta", "partial_json": part}})
        yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
    yield _sse("message_delta", {"type": "message_delta",
               "delta": {"stop_reason": stop, "stop_sequence": None},
               "usage": {"output_tokens": reply.output_tokens}})
    yield _sse("message_stop", {"type": "message_stop"})


def _halves(s: str) -> list[str]:
    if len(s) < 2:
        return [s]
    mid = len(s) // 2
    return [s[:mid], s[mid:]]


def _shell_args(tool: str, command: str) -> dict[str, Any]:
    if tool == "exec_command":
        return {"cmd": command}
    if tool == "shell":
        return {"command": ["bash", "-lc", command]}
    return {"command": command}


def _responses_frames(reply: Text | ToolCall, req: ModelRequest, n: int) -> Iterator[bytes]:
    model = req.model or "gpt-fake"
    resp_id = f"resp_corral{n:04d}"
    seq = 0

    def frame(kind: str, **data: Any) -> bytes:
        nonlocal seq
        out = _sse(kind, {"type": kind, "sequence_number": seq, **data})
        seq += 1
        return out

    base = {"id": resp_id, "object": "response", "created_at": 1796040000 + n,
            "model": model, "output": []}
    yield frame("response.created", response={**base, "status": "in_progress"})
    yield frame("response.in_progress", response={**base, "status": "in_progress"})
    output: list[dict[str, Any]] = []
    if reply.reasoning:
        idx, item_id = len(output), f"rs_corral{n:04d}"
        yield frame("response.output_item.added", output_index=idx,
                    item={"id": item_id, "type": "reasoning", "summary": []})
        part = {"type": "summary_text", "text": ""}
        yield frame("response.reasoning_summary_part.added", item_id=item_id,
                    output_index=idx, summary_index=0, part=part)
        yield frame("response.reasoning_summary_text.delta", item_id=item_id,
                    output_index=idx, summary_index=0, delta=reply.reasoning)
        yield frame("response.reasoning_summary_text.done", item_id=item_id,
                    output_index=idx, summary_index=0, text=reply.reasoning)
        done_part = {"type": "summary_text", "text": reply.reasoning}
        yield frame("response.reasoning_summary_part.done", item_id=item_id,
                    output_index=idx, summary_index=0, part=done_part)
        item = {"id": item_id, "type": "reasoning", "summary": [done_part]}
        yield frame("response.output_item.done", output_index=idx, item=item)
        output.append(item)
    if reply.text:
        idx, item_id = len(output), f"msg_corral{n:04d}"
        yield frame("response.output_item.added", output_index=idx, item={
            "id": item_id, "type": "message", "status": "in_progress", "role": "assistant",
            "content": []})
        yield frame("response.content_part.added", item_id=item_id, output_index=idx,
                    content_index=0, part={"type": "output_text", "text": "", "annotations": []})
        for part_text in _halves(reply.text):
            yield frame("response.output_text.delta", item_id=item_id, output_index=idx,
                        content_index=0, delta=part_text)
        yield frame("response.output_text.done", item_id=item_id, output_index=idx,
                    content_index=0, text=reply.text)
        full = {"type": "output_text", "text": reply.text, "annotations": []}
        yield frame("response.content_part.done", item_id=item_id, output_index=idx,
                    content_index=0, part=full)
        item = {"id": item_id, "type": "message", "status": "completed", "role": "assistant",
                "content": [full]}
        yield frame("response.output_item.done", output_index=idx, item=item)
        output.append(item)
    if isinstance(reply, ToolCall):
        idx, item_id = len(output), f"fc_corral{n:04d}"
        tool = reply.tool or req.shell_tool or "exec_command"
        args = json.dumps(reply.args if reply.args is not None
                          else _shell_args(tool, reply.command))
        call = {"id": item_id, "type": "function_call", "status": "in_progress",
                "call_id": f"call_corral{n:04d}", "name": tool, "arguments": ""}
        if reply.namespace is not None:
            call["namespace"] = reply.namespace
        yield frame("response.output_item.added", output_index=idx, item=call)
        for part_text in _halves(args):
            yield frame("response.function_call_arguments.delta", item_id=item_id,
                        output_index=idx, delta=part_text)
        yield frame("response.function_call_arguments.done", item_id=item_id,
                    output_index=idx, arguments=args)
        item = {**call, "status": "completed", "arguments": args}
        yield frame("response.output_item.done", output_index=idx, item=item)
        output.append(item)
    usage = {"input_tokens": reply.input_tokens, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens": reply.output_tokens,
             "output_tokens_details": {"reasoning_tokens": 0},
             "total_tokens": reply.input_tokens + reply.output_tokens}
    yield frame("response.completed", response={**base, "status": "completed",
                                                "output": output, "usage": usage})


def _gemini_frames(reply: Text | ToolCall, req: ModelRequest, n: int) -> Iterator[bytes]:
    """``streamGenerateContent?alt=sse``: unnamed ``data:`` frames of
    GenerateContentResponse; the last carries ``finishReason`` and ``usageMetadata``."""

    def frame(parts: list[dict[str, Any]], last: bool = False) -> bytes:
        cand: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        data: dict[str, Any] = {"candidates": [cand], "modelVersion": req.model or "gemini-fake",
                                "responseId": f"corral{n:04d}"}
        if last:
            cand["finishReason"] = "STOP"
            data["usageMetadata"] = {
                "promptTokenCount": reply.input_tokens,
                "candidatesTokenCount": reply.output_tokens,
                "totalTokenCount": reply.input_tokens + reply.output_tokens}
        return f"data: {json.dumps(data, separators=(',', ':'))}\r\n\r\n".encode()

    if reply.reasoning:
        yield frame([{"text": reply.reasoning, "thought": True}])
    if isinstance(reply, Text):
        *head, tail = [q for h in _halves(reply.text) for q in _halves(h)]
        for part_text in head:
            yield frame([{"text": part_text}])
        yield frame([{"text": tail}], last=True)
        return
    if reply.text:
        yield frame([{"text": reply.text}])
    tool = reply.tool or req.shell_tool or "run_shell_command"
    args = reply.args if reply.args is not None else {"command": reply.command,
                                                      "description": "scripted"}
    yield frame([{"functionCall": {"name": tool, "args": args}}], last=True)


def _gemini_json(req: ModelRequest, reply: Text | ToolCall) -> dict[str, Any]:
    """A non-streamed ``generateContent``/``countTokens`` answer. JSON-mode requests (the
    CLI's model router) get an object filled from their schema (numbers are 1)."""
    if req.path.split("?", 1)[0].endswith(":countTokens"):
        return {"totalTokens": 10}
    frames = [json.loads(f[5:]) for f in _gemini_frames(reply, req, 0)]
    config = req.body.get("generationConfig") if isinstance(req.body, dict) else None
    schema = config.get("responseJsonSchema") or config.get("responseSchema") \
        if isinstance(config, dict) else None
    if isinstance(schema, dict):
        filled = {k: (1 if str(v.get("type", "")).lower() in ("integer", "number") else "x")
                  for k, v in (schema.get("properties") or {}).items() if isinstance(v, dict)}
        frames[-1]["candidates"][0]["content"]["parts"] = [{"text": json.dumps(filled)}]
        return dict(frames[-1])
    parts = [p for f in frames for p in f["candidates"][0]["content"]["parts"]
             if "text" not in p or p.get("thought")]
    text = "".join(p["text"] for f in frames for p in f["candidates"][0]["content"]["parts"]
                   if "text" in p and not p.get("thought"))
    parts = [*([{"text": text}] if text else []), *parts]
    last = dict(frames[-1])
    last["candidates"][0]["content"]["parts"] = parts
    return last


def _error_body(protocol: Protocol, fail: Fail) -> dict[str, Any]:
    if protocol == "gemini":
        return {"error": {"code": fail.status, "message": fail.message, "status": fail.kind}}
    if protocol == "anthropic":
        return {"type": "error", "error": {"type": fail.kind, "message": fail.message}}
    return {"error": {"message": fail.message, "type": fail.kind, "code": fail.kind,
                      "param": None}}


# ---------------------------------------------------------------- the server


def _protocol(path: str) -> Protocol:
    bare = path.split("?", 1)[0].rstrip("/")
    if bare.endswith("/messages"):
        return "anthropic"
    if bare.endswith("/responses"):
        return "openai-responses"
    if bare.endswith((":streamGenerateContent", ":generateContent", ":countTokens")):
        return "gemini"
    return "other"


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_HEAD(self) -> None:
        self._handle()

    def _handle(self) -> None:
        req = self._answer(time.perf_counter())
        if not req.reply.startswith("hang"):
            req.answered = time.perf_counter()

    def _answer(self, arrived: float) -> ModelRequest:
        """Record and answer the request (which this returns)."""
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        req = ModelRequest(
            method=self.command,
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
            raw=raw,
            protocol=_protocol(self.path),
            arrived=arrived,
        )
        owner = self.server.owner
        reply = owner._next_reply(req)
        owner._record(req)
        if req.protocol == "other" or reply is None:
            req.reply = "empty"
            self._send_json(200, {})
            return req
        if isinstance(reply, Fail):
            req.reply = f"fail {reply.status}"
            self._send_json(reply.status, _error_body(req.protocol, reply))
            return req
        if isinstance(reply, Hang) and reply.after_frames == 0:
            req.reply = "hang"
            owner._stopping.wait()
            return req
        frames_of = {"anthropic": _anthropic_frames,
                     "gemini": _gemini_frames}.get(req.protocol, _responses_frames)
        stall_after: int | None = None
        if isinstance(reply, Hang):
            stall_after = reply.after_frames
            inner: Text | ToolCall = reply.then or Text("partial answer")
            req.reply = f"hang after {stall_after} frames"
        else:
            inner = reply
            req.reply = "tool_call" if isinstance(reply, ToolCall) else "text"
        if req.protocol == "gemini" and ":streamGenerateContent" not in self.path:
            self._send_json(200, _gemini_json(req, inner))
            return req
        wants_stream = not isinstance(body, dict) or body.get("stream", True)
        if not wants_stream:
            self._send_json(200, {"error": "the scripted model server only streams"})
            return req
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.send_header("request-id", f"req_corral{owner._count:04d}")
        self.end_headers()
        self.close_connection = True
        for i, chunk in enumerate(frames_of(inner, req, owner._count)):
            if stall_after is not None and i >= stall_after:
                owner._stopping.wait()
                return req
            if inner.delay:
                time.sleep(inner.delay)
            try:
                self.wfile.write(chunk)
                self.wfile.flush()
            except OSError:
                return req
        return req

    def _send_json(self, status: int, data: dict[str, Any]) -> None:
        payload = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            self.wfile.write(payload)
        except OSError:
            pass


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    owner: ModelServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hangs up mid-stream is normal here


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    owner: ModelServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


class _UnixHandler(_Handler):
    def address_string(self) -> str:
        return "unix"

    def setup(self) -> None:
        super().setup()
        self.client_address = ("unix", 0)


class ModelServer:
    """A scripted model server (see the module docstring). Use as a context manager, or
    call :meth:`start` and :meth:`stop`.

    ``script``: a function ``ModelRequest -> Reply``, or a sequence of replies used in
    order (a request past the end gets a 500 "script exhausted"). Requests that are not
    model calls (``GET``s, unknown paths) get ``200 {}`` and are recorded too. ``unix``:
    serve on that unix socket path instead of ``127.0.0.1``.
    """

    def __init__(self, script: Script | None = None, *, unix: str | None = None) -> None:
        self.script: Script = script if script is not None else shell_then_text(
            "echo hi > out.txt && ls"
        )
        self.unix = unix
        self.requests: list[ModelRequest] = []
        self._lock = threading.Lock()
        self._count = 0
        self._stopping = threading.Event()
        self._server: _HTTPServer | _UnixHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle
    def start(self) -> Self:
        if self._server is not None:
            return self
        self._stopping.clear()
        if self.unix is not None:
            if os.path.exists(self.unix):
                os.unlink(self.unix)
            server: _HTTPServer | _UnixHTTPServer = _UnixHTTPServer(self.unix, _UnixHandler)
        else:
            server = _HTTPServer(("127.0.0.1", 0), _Handler)
        server.owner = self
        # A client that resets before accept() must not block the accept loop (and stop()).
        server.socket.settimeout(0.5)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="corral-model-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; releases hanging replies (their connections are closed)."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses
    @property
    def port(self) -> int:
        if self._server is None or self.unix is not None:
            raise RuntimeError("the model server is not serving on TCP")
        addr = self._server.server_address
        assert isinstance(addr, tuple)
        return int(addr[1])

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` (the Anthropic base URL)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_url(self) -> str:
        """``http://127.0.0.1:<port>/v1`` (an OpenAI-style base URL)."""
        return f"{self.url}/v1"

    @property
    def gemini_url(self) -> str:
        """``http://127.0.0.1:<port>`` (a ``GOOGLE_GEMINI_BASE_URL``; requests keep their
        ``/v1beta/...`` path)."""
        return self.url

    # -- scripting
    def _next_reply(self, req: ModelRequest) -> Reply | None:
        if req.protocol == "other":
            return None
        with self._lock:
            self._count += 1
            n = self._count
        script = self.script
        if callable(script):
            return script(req)
        if n - 1 < len(script):
            return script[n - 1]
        return Fail(500, f"scripted model server: script exhausted after {n - 1} replies")

    def _record(self, req: ModelRequest) -> None:
        with self._lock:
            self.requests.append(req)

    @property
    def model_requests(self) -> list[ModelRequest]:
        """Recorded requests that were model calls (``/messages``, ``/responses`` or
        Gemini's ``:generateContent`` family)."""
        with self._lock:
            return [r for r in self.requests if r.protocol != "other"]

    def wait_for_requests(self, n: int, timeout: float = 10.0) -> list[ModelRequest]:
        """Block until at least ``n`` model calls were recorded (or raise
        :class:`~corral.testing.WaitTimeout`)."""
        wait_until(lambda: len(self.model_requests) >= n, f"{n} model requests",
                   timeout=timeout)
        return self.model_requests

