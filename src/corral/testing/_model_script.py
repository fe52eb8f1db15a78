"""What a script of the scripted model server (:mod:`corral.testing._model_server`) sees and
answers: the recorded :class:`ModelRequest` (read the same way whatever the protocol: its
key, model, tools, turns, tool results) and the replies (:class:`Text`, :class:`ToolCall`,
:class:`Fail`, :class:`Hang`); :func:`shell_then_text` is the stock script."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal


__all__ = [
    "SHELL_TOOLS",
    "Fail",
    "Hang",
    "ModelRequest",
    "Protocol",
    "Reply",
    "Script",
    "Text",
    "ToolCall",
    "shell_then_text",
]

Protocol = Literal["anthropic", "openai-responses", "gemini", "other"]
SHELL_TOOLS = ("Bash", "bash", "exec_command", "shell_command", "shell", "run_shell_command")


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
