"""An agent run's prompt is logged after RUN_STARTED as ``CUSTOM corral.prompt``, inside the
start batch (so it is there exactly once, whoever drives the run later)."""

from __future__ import annotations

from corral.harness._events import event_to_dict, run_started
from corral.runs._launch import PROMPT_EVENT, with_prompt
from corral.runs._request import RunRequest


def test_the_prompt_follows_run_started() -> None:
    hostile = "<img src=x onerror=alert(1)>\n</script>"
    start = [run_started("t", "r")]
    got = [event_to_dict(e) for e in with_prompt(start, RunRequest(prompt=hostile,
                                                                   harness="claude-code"))]
    assert got == [{"type": "RUN_STARTED", "threadId": "t", "runId": "r"},
                   {"type": "CUSTOM", "name": PROMPT_EVENT, "value": {"prompt": hostile}}]


def test_command_runs_log_no_prompt() -> None:
    start = [run_started("t", "r")]
    assert with_prompt(start, RunRequest(command=["true"])) == start
