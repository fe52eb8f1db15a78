"""What the harness checks share: a run's events as ``corral run`` printed them or the
store logged them, what they say (texts, tool results, CUSTOM values), and the model
scripts the checks drive a CLI with."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

from corral.stores._protocols import Store
from corral.testing._harness_world import (
    HostToolCall,
    HarnessWorld,
)
from corral.testing._model_script import ModelRequest, Reply, Text, ToolCall
from corral.testing._polling import wait_until_async
from corral.tools._approvals import (
    APPROVAL_REQUEST_EVENT,
)

__all__ = [
    "approval_request",
    "call_then_answer",
    "customs",
    "every_call_has_one_result",
    "logged_events",
    "ndjson_events",
    "ok",
    "refused",
    "results",
    "steps",
    "texts",
    "tool_names",
]


def ndjson_events(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line)["event"] for line in stdout.splitlines() if line.strip()]


def texts(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


def results(events: list[dict[str, Any]]) -> list[str]:
    return [str(e["content"]) for e in events if e["type"] == "TOOL_CALL_RESULT"]


def tool_names(events: list[dict[str, Any]]) -> list[str]:
    return [e["toolCallName"] for e in events if e["type"] == "TOOL_CALL_START"]


def customs(events: list[dict[str, Any]], name: str) -> list[Any]:
    return [e["value"] for e in events if e["type"] == "CUSTOM" and e["name"] == name]


def every_call_has_one_result(events: list[dict[str, Any]]) -> None:
    ids = {k: [e["toolCallId"] for e in events if e["type"] == k]
           for k in ("TOOL_CALL_START", "TOOL_CALL_END", "TOOL_CALL_RESULT")}
    assert sorted(ids["TOOL_CALL_START"]) == sorted(ids["TOOL_CALL_END"]) == \
        sorted(ids["TOOL_CALL_RESULT"]), ids


def ok(out: subprocess.CompletedProcess[str]) -> None:
    assert out.returncode == 0, out.stderr[-3000:]


def call_then_answer(offered: HostToolCall, tool_name: str, args: dict[str, Any]
                     ) -> Callable[[ModelRequest], Reply]:
    """A model script that calls host tool ``tool_name`` with ``args`` (as ``offered``
    finds it on offer, see :attr:`HarnessCase.host_tool_call`), then answers ``Host said:``
    and what it returned; without the tool on offer it answers saying so (and a check
    fails on it)."""

    def script(req: ModelRequest) -> Reply:
        if req.tool_results:
            return Text("Host said: " + "\n".join(req.tool_results).strip())
        call = offered(req, tool_name, args)
        return call if call is not None else Text(f"NO HOST TOOL offered: {req.tools}")

    return script


def steps(commands: Sequence[str], final: str) -> Callable[[ModelRequest], Reply]:
    """One shell command per model turn (the results so far say which), then ``final``
    followed by every result."""

    def script(req: ModelRequest) -> Reply:
        done = len(req.tool_results)
        if done < len(commands):
            return ToolCall(commands[done], text=f"Step {done + 1}.")
        return Text(final + "\n".join(req.tool_results).strip())

    return script


async def refused(w: HarnessWorld, feature: str, toml: str) -> None:
    """A policy using ``feature`` the harness cannot enforce: ``corral run`` refuses it in
    one line naming it (exit 2, no traceback), before any model call."""
    ws = w.workspace(f"refused-{feature}", toml=toml)
    out = await w.agent(f"refused-{feature}", "hello", "--workspace", str(ws))
    assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert feature in lines[0], lines[0]
    assert w.server.model_requests == []


async def logged_events(store: Store, run_id: str) -> list[dict[str, Any]]:
    """The run's log as the store holds it now (event dicts)."""
    return [dict(e.event) for e in await store.snapshot(run_id)]


async def approval_request(store: Store, run_id: str, n: int, ended: Callable[[], bool],
                        timeout: float) -> dict[str, Any]:
    """The run's ``n``-th approval request (0-based), once its log holds it; fails if the
    run ends first (``ended``)."""
    found: list[dict[str, Any]] = []

    async def requested() -> bool:
        events = await logged_events(store, run_id)
        found[:] = customs(events, APPROVAL_REQUEST_EVENT)
        if len(found) <= n and ended():
            raise AssertionError(f"the run ended without approval request #{n + 1}: "
                                 f"{events[-3:]}")
        return len(found) > n

    await wait_until_async(requested, f"approval request #{n + 1}", timeout=timeout,
                           interval=0.05)
    return found[n]
