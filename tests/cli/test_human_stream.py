"""The human stream of ``corral run`` / ``attach`` (issue #31, item 5): whole lines at every
point a person sees it, a blank line between an agent's messages, the tool's main argument on
``[tool]`` lines, and a closing summary line on stderr. Text is checked exactly, line endings
included."""

from __future__ import annotations

import io
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from corral.cli._view import TextStream, main_argument, summary_line
from tests.corral_cli import CliHome


def _play(events: list[dict[str, Any]], *, line_deltas: bool) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    stream = TextStream(out, err, line_deltas=line_deltas)
    for event in events:
        stream.event(event)
    stream.close()
    return out.getvalue(), err.getvalue()


def _msg(mid: str, *deltas: str) -> list[dict[str, Any]]:
    return [{"type": "TEXT_MESSAGE_START", "messageId": mid, "role": "assistant"},
            *({"type": "TEXT_MESSAGE_CONTENT", "messageId": mid, "delta": d} for d in deltas),
            {"type": "TEXT_MESSAGE_END", "messageId": mid}]


def test_agent_messages_are_separated_and_tool_lines_show_the_command() -> None:
    events = [
        *_msg("m1", "I'll", " run a", " command."),
        {"type": "TOOL_CALL_START", "toolCallId": "c1", "toolCallName": "Bash"},
        {"type": "TOOL_CALL_ARGS", "toolCallId": "c1", "delta": '{"command": "ls -la",'},
        {"type": "TOOL_CALL_ARGS", "toolCallId": "c1", "delta": ' "description": "list"}'},
        {"type": "TOOL_CALL_END", "toolCallId": "c1"},
        {"type": "TOOL_CALL_RESULT", "toolCallId": "c1", "messageId": "r", "content": "a\nb"},
        *_msg("m2", "The files", " are a and b."),
        {"type": "RUN_FINISHED"},
    ]
    out, err = _play(events, line_deltas=False)
    assert out == "I'll run a command.\n\nThe files are a and b.\n"
    assert err == "[tool] Bash  ls -la\n[tool result] a b\n"


def test_command_lines_are_whole_at_once_and_never_doubled() -> None:
    # the command harness: each line's newline comes at the start of the next delta
    mid = "m0"
    out = io.StringIO()
    stream = TextStream(out, io.StringIO(), line_deltas=True)
    stream.event(_msg(mid)[0])
    for delta, seen in (("tick 0", "tick 0\n"), ("\ntick 1", "tick 0\ntick 1\n"),
                        ("\n", "tick 0\ntick 1\n")):
        stream.event({"type": "TEXT_MESSAGE_CONTENT", "messageId": mid, "delta": delta})
        assert out.getvalue() == seen  # whole lines at every moment
    stream.event({"type": "TEXT_MESSAGE_END", "messageId": mid})
    assert out.getvalue() == "tick 0\ntick 1\n"


def test_a_note_never_lands_on_an_open_line() -> None:
    out, err = _play([*_msg("m", "partial")[:2],
                      {"type": "RUN_ERROR", "message": "boom"}], line_deltas=False)
    assert out == "partial\n" and err == "[run error] boom\n"


@pytest.mark.parametrize(("raw", "shown"), [
    ('{"file_path": "/workspace/a.py", "limit": 3}', "/workspace/a.py"),
    ('{"command": ["bash", "-lc", "make  test\\n"]}', "bash -lc make test"),
    ('{"x": 1}', ""), ("not json", "not json"), ('{"env": "staging"}', "staging"),
])
def test_main_argument(raw: str, shown: str) -> None:
    assert main_argument(raw) == shown


def test_summary_line() -> None:
    assert summary_line("r1", "completed", 0, 1.23, 0.003) == \
        "corral: run r1 completed (exit 0, 1.2 s, $0.003)"
    assert summary_line("r2", "failed", 3, 125.0, None) == "corral: run r2 failed (exit 3, 2 min 5 s)"


@pytest.mark.usefixtures("need_bwrap_runs")
def test_run_and_attach_print_whole_lines_and_a_summary(
        corral_cmd: list[str], cli_env: dict[str, str], corral_home: Path) -> None:
    cli = CliHome(corral_cmd, cli_env, corral_home)
    r = cli.run("run", "--run-id", "lines", "--", "sh", "-c", "echo a; printf 'b'")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "a\nb\n"
    assert r.stderr.splitlines()[0].startswith("corral: run lines started")
    assert re.fullmatch(r"corral: run lines completed \(exit 0, \d+\.\d s\)\n",
                        r.stderr.split("\n", 1)[1]), r.stderr
    again = cli.run("attach", "lines")
    assert again.returncode == 0 and again.stdout == "a\nb\n"
    assert re.fullmatch(r"corral: run lines completed \(exit 0, \d+\.\d s\)\n", again.stderr)


@pytest.mark.usefixtures("need_bwrap_runs")
def test_detaching_ends_the_open_line_first(
        corral_cmd: list[str], cli_env: dict[str, str], corral_home: Path) -> None:
    cli = CliHome(corral_cmd, {**cli_env, "CORRAL_LEASE_TTL": "3"}, corral_home)
    proc = cli.popen("run", "--run-id", "det", "--", "sh", "-c", "echo line 5; sleep 30")
    assert proc.stdout is not None
    assert proc.stdout.readline() == "line 5\n"  # whole, before anything follows it
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and out == ""
    assert "corral: detaching" in err
    cli.run("cancel", "det")
