"""What the scripted model server sends, per protocol: a reply as Anthropic Messages, OpenAI
Responses or Gemini SSE frames (``event: <name>\\ndata: <json>\\n\\n``), Gemini's one-shot
JSON, and the protocol's error body; and which protocol a request path speaks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from corral.testing._model_script import Fail, ModelRequest, Protocol, Text, ToolCall

__all__ = [
    "anthropic_frames",
    "error_body",
    "gemini_frames",
    "gemini_json",
    "protocol_of",
    "responses_frames",
]

def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def anthropic_frames(reply: Text | ToolCall, req: ModelRequest, n: int) -> Iterator[bytes]:
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


def responses_frames(reply: Text | ToolCall, req: ModelRequest, n: int) -> Iterator[bytes]:
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


def gemini_frames(reply: Text | ToolCall, req: ModelRequest, n: int) -> Iterator[bytes]:
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


def gemini_json(req: ModelRequest, reply: Text | ToolCall) -> dict[str, Any]:
    """A non-streamed ``generateContent``/``countTokens`` answer. JSON-mode requests (the
    CLI's model router) get an object filled from their schema (numbers are 1)."""
    if req.path.split("?", 1)[0].endswith(":countTokens"):
        return {"totalTokens": 10}
    frames = [json.loads(f[5:]) for f in gemini_frames(reply, req, 0)]
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


def error_body(protocol: Protocol, fail: Fail) -> dict[str, Any]:
    if protocol == "gemini":
        return {"error": {"code": fail.status, "message": fail.message, "status": fail.kind}}
    if protocol == "anthropic":
        return {"type": "error", "error": {"type": fail.kind, "message": fail.message}}
    return {"error": {"message": fail.message, "type": fail.kind, "code": fail.kind,
                      "param": None}}


def protocol_of(path: str) -> Protocol:
    bare = path.split("?", 1)[0].rstrip("/")
    if bare.endswith("/messages"):
        return "anthropic"
    if bare.endswith("/responses"):
        return "openai-responses"
    if bare.endswith((":streamGenerateContent", ":generateContent", ":countTokens")):
        return "gemini"
    return "other"
