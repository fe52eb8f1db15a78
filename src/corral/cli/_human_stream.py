"""A run's events as text for a person (``corral run`` / ``attach`` without ``--json``).

Line discipline: stdout only ever holds whole lines at every point a person or a prompt can
see it (a note on stderr, the end of a message, the end of the command), and messages are
separated by one blank line. The ``command`` harness delivers each stdout line as soon as it
is complete but carries its newline at the start of the *next* delta (see
:mod:`corral.harness._command`); with ``line_deltas`` the printer ends the line at once and
drops that leading newline when it comes. Agent harnesses stream tokens: their last line is
ended when the message ends (or before a note).

Tool calls show on stderr as ``[tool] NAME  MAIN-ARGUMENT`` once their arguments are complete
(the command of ``Bash``, the path of ``Read``, …), their results as ``[tool result] …``.
"""

from __future__ import annotations

import json
from typing import Any, Final, TextIO

__all__ = ["TextStream", "main_argument", "summary_line"]

# The argument that says what a tool call does, by the names agent CLIs give it (first found).
_MAIN_KEYS: Final = ("command", "cmd", "file_path", "path", "filePath", "pattern", "url",
                     "query", "prompt", "description", "env")
_MAX_ARG: Final = 160


def main_argument(raw_args: str) -> str:
    """The one argument worth showing of a tool call's JSON arguments, on one line and cut to
    fit (``""`` when there is none)."""
    try:
        args = json.loads(raw_args) if raw_args.strip() else {}
    except ValueError:
        value: Any = raw_args
    else:
        if not isinstance(args, dict):
            value = args
        else:
            value = next((args[k] for k in _MAIN_KEYS if args.get(k) not in (None, "")), None)
            if value is None:
                value = next((v for v in args.values() if isinstance(v, str) and v), "")
    if isinstance(value, list):
        value = " ".join(str(v) for v in value)
    text = " ".join(str(value).split())  # one line
    return text if len(text) <= _MAX_ARG else text[: _MAX_ARG - 1] + "…"


def _seconds(elapsed: float) -> str:
    if elapsed < 60:
        return f"{elapsed:.1f} s"
    minutes, seconds = divmod(int(elapsed), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    return f"{minutes // 60} h {minutes % 60} min"


def summary_line(run_id: str, status: str, exit_code: int | None, elapsed: float | None,
                 cost_usd: float | None) -> str:
    """``corral: run X completed (exit 0, 1.2 s, $0.003)``: how a followed run ended."""
    parts = []
    if exit_code is not None:
        parts.append(f"exit {exit_code}")
    if elapsed is not None:
        parts.append(_seconds(max(0.0, elapsed)))
    if cost_usd is not None:
        parts.append("$0" if cost_usd == 0 else "<$0.0001" if cost_usd < 0.0001
                     else f"${cost_usd:.4f}".rstrip("0").rstrip("."))
    detail = f" ({', '.join(parts)})" if parts else ""
    return f"corral: run {run_id} {status}{detail}"


class TextStream:
    """Writes AG-UI events as text with line discipline (see the module)."""

    def __init__(self, out: TextIO, err: TextIO, *, line_deltas: bool = False) -> None:
        self.out = out
        self.err = err
        self.line_deltas = line_deltas
        self._open = False  # stdout's last line has no newline yet
        self._owed = False  # we ended the line ourselves: the next leading "\n" is ours
        self._printed_message = False
        self._tools: dict[str, tuple[str, list[str]]] = {}

    def event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "TEXT_MESSAGE_START":
            self.end_line()
            if self._printed_message:
                self.out.write("\n")  # a blank line between messages
            self._owed = False
        elif kind == "TEXT_MESSAGE_CONTENT":
            self._text(str(event.get("delta", "")))
        elif kind == "TEXT_MESSAGE_END":
            self.end_line()
        elif kind == "TOOL_CALL_START":
            self._tools[str(event.get("toolCallId"))] = (str(event.get("toolCallName")), [])
        elif kind == "TOOL_CALL_ARGS":
            call = self._tools.get(str(event.get("toolCallId")))
            if call is not None:
                call[1].append(str(event.get("delta", "")))
        elif kind == "TOOL_CALL_END":
            self._tool_line(str(event.get("toolCallId")))
        elif kind == "TOOL_CALL_RESULT":
            self._tool_line(str(event.get("toolCallId")))
            content = " ".join(str(event.get("content", "")).split())
            self.note(f"[tool result] {content[:200]}")
        elif kind == "RUN_ERROR":
            self.note(f"[run error] {event.get('message')}")
        elif kind == "CUSTOM" and event.get("name") == "sandbox.file":
            value = event.get("value") or {}
            self.note(f"[file] {value.get('type')} {value.get('path')}")
        elif kind in ("RUN_FINISHED",):
            self.end_line()
        self.out.flush()

    def _text(self, delta: str) -> None:
        if self._owed and delta.startswith("\n"):
            delta = delta[1:]
        self._owed = False
        if not delta:
            return
        self.out.write(delta)
        self._printed_message = True
        self._open = not delta.endswith("\n")
        if self.line_deltas and self._open:
            self.end_line()

    def _tool_line(self, call_id: str) -> None:
        call = self._tools.pop(call_id, None)
        if call is not None:
            name, parts = call
            arg = main_argument("".join(parts))
            self.note(f"[tool] {name}  {arg}" if arg else f"[tool] {name}")

    def end_line(self) -> None:
        """End stdout's open line (the next delta's leading newline is then dropped)."""
        if self._open:
            self.out.write("\n")
            self._open = False
            self._owed = True
        self.out.flush()

    def note(self, text: str) -> None:
        """One line on stderr, after ending stdout's open line."""
        self.end_line()
        self.err.write(text + "\n")
        self.err.flush()

    def close(self) -> None:
        """The stream ended: ends the open line, prints tool calls that never got an end."""
        for call_id in list(self._tools):
            self._tool_line(call_id)
        self.end_line()
