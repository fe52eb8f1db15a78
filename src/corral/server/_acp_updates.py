"""A run's logged AG-UI events as ACP ``session/update`` payloads, for ``corral acp``.

:class:`UpdateTranslator` turns one run's events, in log order, into the ``update`` objects
an ACP client shows (the inverse of corral's ACP client, :mod:`corral.harness._acp`):

- ``TEXT_MESSAGE_CONTENT`` → ``agent_message_chunk``; reasoning deltas →
  ``agent_thought_chunk``;
- ``TOOL_CALL_START`` → ``tool_call`` (``pending``; the kind guessed from the tool's name);
  its ``TOOL_CALL_ARGS`` are gathered and sent at ``TOOL_CALL_END`` as a
  ``tool_call_update`` (``in_progress``, ``rawInput``, a shell command as the title);
  ``TOOL_CALL_RESULT`` → ``tool_call_update`` (``completed``, the output as text content);
- ``CUSTOM sandbox.file`` / ``sandbox.file.diff`` (the workspace changes a run with file
  events logs) → a completed ``edit`` tool call naming the file (under the session's
  ``cwd``), with the patch as content;
- ``RUN_ERROR`` → an ``agent_message_chunk`` saying why the run ended.

Everything else (run and step boundaries, corral's own CUSTOM events) has no ACP form and
is left out. The events are the agent's output, so hostile: a field of the wrong type is
skipped, never an error.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any, Final

__all__ = ["UpdateTranslator", "text_chunk", "tool_kind"]

_KINDS: Final = {
    "execute": ("bash", "shell", "exec", "run_shell_command", "command", "terminal"),
    "read": ("read", "read_file", "view", "cat", "notebookread"),
    "edit": ("edit", "write", "multiedit", "notebookedit", "apply_patch", "write_file",
             "replace", "patch"),
    "search": ("grep", "glob", "search", "find", "ls", "list", "search_file_content"),
    "fetch": ("webfetch", "websearch", "fetch", "web_fetch", "google_web_search"),
    "think": ("todowrite", "think", "task"),
}
MAX_TITLE: Final = 200


def tool_kind(name: str) -> str:
    """The ACP tool kind a tool's name suggests (``other`` when none does)."""
    low = name.lower().rsplit("__", 1)[-1]
    for kind, names in _KINDS.items():
        if low in names:
            return kind
    return "other"


def text_chunk(kind: str, text: str) -> dict[str, Any]:
    """An ``agent_message_chunk`` / ``agent_thought_chunk`` / ``user_message_chunk``."""
    return {"sessionUpdate": kind, "content": {"type": "text", "text": text}}


def _short(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_TITLE else line[:MAX_TITLE - 3] + "..."


class UpdateTranslator:
    """Translates one run's events in order (it keeps the tool calls' argument deltas).
    ``cwd``: the session's directory, to name changed files the way the editor sees
    them."""

    def __init__(self, cwd: str | None = None, *, replay: bool = False) -> None:
        self.cwd = cwd
        self.replay = replay
        """Replaying history (``session/load``): the run's prompt (``CUSTOM corral.prompt``)
        is shown as the user's message; live, the editor shows what its user typed."""
        self._args: dict[str, list[str]] = {}
        self._names: dict[str, str] = {}
        self._files = 0

    def updates(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        """The ``session/update`` ``update`` objects for one logged event."""
        kind = event.get("type")
        if kind == "TEXT_MESSAGE_CONTENT":
            return self._text("agent_message_chunk", event.get("delta"))
        if kind in ("REASONING_MESSAGE_CONTENT", "THINKING_TEXT_MESSAGE_CONTENT"):
            return self._text("agent_thought_chunk", event.get("delta"))
        if kind == "TEXT_MESSAGE_CHUNK":
            return self._text("agent_message_chunk", event.get("delta"))
        call_id = event.get("toolCallId")
        if kind == "TOOL_CALL_START" and isinstance(call_id, str):
            name = event.get("toolCallName")
            name = name if isinstance(name, str) and name else "tool"
            self._names[call_id] = name
            self._args[call_id] = []
            return [{"sessionUpdate": "tool_call", "toolCallId": call_id,
                     "title": _short(name), "kind": tool_kind(name), "status": "pending"}]
        if kind == "TOOL_CALL_ARGS" and isinstance(call_id, str):
            delta = event.get("delta")
            if isinstance(delta, str):
                self._args.setdefault(call_id, []).append(delta)
            return []
        if kind == "TOOL_CALL_END" and isinstance(call_id, str):
            return [self._started(call_id)]
        if kind == "TOOL_CALL_RESULT" and isinstance(call_id, str):
            content = event.get("content")
            text = content if isinstance(content, str) else json.dumps(content)
            return [{"sessionUpdate": "tool_call_update", "toolCallId": call_id,
                     "status": "completed",
                     "content": [{"type": "content",
                                  "content": {"type": "text", "text": text}}],
                     "rawOutput": {"output": text}}]
        if kind == "RUN_ERROR":
            message = event.get("message")
            if isinstance(message, str) and message:
                return self._text("agent_message_chunk", f"\n[corral: {message}]\n")
            return []
        if kind == "CUSTOM":
            return self._custom(event.get("name"), event.get("value"))
        return []

    def _text(self, kind: str, delta: Any) -> list[dict[str, Any]]:
        return [text_chunk(kind, delta)] if isinstance(delta, str) and delta else []

    def _started(self, call_id: str) -> dict[str, Any]:
        raw = "".join(self._args.pop(call_id, []))
        update: dict[str, Any] = {"sessionUpdate": "tool_call_update", "toolCallId": call_id,
                                  "status": "in_progress"}
        try:
            args = json.loads(raw) if raw else {}
        except ValueError:
            args = {"arguments": raw}
        update["rawInput"] = args
        if isinstance(args, dict):
            command = args.get("command")
            if isinstance(command, list):
                command = " ".join(str(c) for c in command)
            if isinstance(command, str) and command:
                update["title"] = _short(command)
            path = args.get("file_path") or args.get("path")
            if isinstance(path, str) and path:
                update["locations"] = [{"path": self._where(path)}]
        return update

    def _where(self, path: str) -> str:
        """A sandbox path as the editor names it: ``/workspace/x`` and ``x`` are
        ``<cwd>/x`` (the sandbox's workspace is a copy of the session's directory)."""
        rel = path
        if path.startswith("/workspace/"):
            rel = path[len("/workspace/"):]
        elif path.startswith("/"):
            return path
        rel = posixpath.normpath(rel)
        if self.cwd is None or rel.startswith(".."):
            return path
        return posixpath.join(self.cwd, rel)

    def _custom(self, name: Any, value: Any) -> list[dict[str, Any]]:
        if not isinstance(value, dict):
            return []
        if name == "corral.prompt":
            prompt = value.get("prompt")
            return self._text("user_message_chunk", prompt) if self.replay else []
        path = value.get("path")
        if not isinstance(path, str) or not path:
            return []
        if name == "sandbox.file":
            change = value.get("type")
            verb = {"create": "created", "delete": "deleted"}.get(str(change), "changed")
            self._files += 1
            return [{"sessionUpdate": "tool_call", "toolCallId": f"corral-file-{self._files}",
                     "title": _short(f"{verb} {path}"),
                     "kind": "delete" if change == "delete" else "edit",
                     "status": "completed", "locations": [{"path": self._where(path)}]}]
        if name == "sandbox.file.diff" and self._files:
            diff = value.get("diff")
            if isinstance(diff, str) and diff:
                return [{"sessionUpdate": "tool_call_update",
                         "toolCallId": f"corral-file-{self._files}",
                         "content": [{"type": "content",
                                      "content": {"type": "text", "text": diff}}]}]
        return []
