"""Harness kit, how a run stops: its token budget, its timeout, ``corral cancel``, and its
driver SIGKILLed then ``corral attach``."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import threading
import time

import anyio

from corral.journal._layout import JournalPaths, read_status
from corral.journal._supervisor import process_alive
from corral.testing._harness_world import HarnessWorld, world
from corral.testing._kit import Kit
from corral.testing._model_script import Hang, ModelRequest, Reply, Text, ToolCall
from corral.testing._polling import wait_until, wait_until_async
from corral.testing._harness_events import (
    every_call_has_one_result, ndjson_events, ok, steps, texts,
)

__all__ = ["STOP_CHECKS", "Gate", "kill_after_tool_result"]

STOP_CHECKS: Kit[HarnessWorld] = Kit("harness", subject=world)
"""This part's checks, in the order written (:data:`~corral.testing.HARNESS_KIT` joins the
parts)."""


@STOP_CHECKS.add
async def check_token_budget(w: HarnessWorld) -> None:
    """``--token-budget``: the model proxy refuses the model call past the budget (it
    never reaches the upstream) and the run fails saying so."""
    reached: list[bool] = []

    def script(req: ModelRequest) -> Reply:
        done = len(req.tool_results)
        if done >= 2:
            reached.append(True)
            return Text("All done.")
        return ToolCall(f"echo step {done}")

    # 120 tokens a call: the second call crosses 150, the third is refused
    w.script(script)
    out = await w.agent("b1", "run two steps", "--token-budget", "150")
    assert out.returncode != 0
    events = w.log("b1")
    assert events[-1]["type"] == "RUN_ERROR", events[-3:]
    rec = w.record("b1")
    assert rec["status"] == "failed"
    assert "token budget" in json.dumps([events[-1], rec.get("error")]), events[-1]
    assert reached == [] and rec["usage"]["requests"] == len(w.server.model_requests) >= 1


@STOP_CHECKS.add
async def check_timeout(w: HarnessWorld) -> None:
    """``--timeout``: the run's supervisor stops a CLI whose model never answers; the run
    fails at once with a RUN_ERROR."""
    w.script(lambda req: Hang())
    t0 = time.monotonic()
    out = await w.agent("t1", "hello", "--timeout", "3")
    elapsed = time.monotonic() - t0
    assert out.returncode != 0
    events = w.log("t1")
    assert events[-1]["type"] == "RUN_ERROR", events[-3:]
    assert [e["type"] for e in events].count("RUN_ERROR") == 1
    assert w.record("t1")["status"] == "failed"
    assert elapsed < 60, elapsed


def _pids_with(marker: bytes) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if marker in fh.read():
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


@STOP_CHECKS.add
async def check_cancel(w: HarnessWorld) -> None:
    """``corral cancel`` of a detached run whose tool is running: the run is aborted with
    RUN_ERROR last, and the agent, its tool's processes and the run's model proxy
    daemon all stop. Under the case's :attr:`~HarnessCase.extra_ask` rules (a policy
    corral decides live) a ``corral attach`` drives the detached run meanwhile: each
    command waits for a driver to serve the run's permission check."""
    marker = f"corral-kit-cancel-{secrets.token_hex(4)}"
    # the tool's shell keeps the marker in its command line (not a long sleep: Claude Code
    # refuses those)
    w.script(steps([f"tail -f /dev/null # {marker}"], "Woke: "))
    ok(await w.acorral(*w.run_args("c1", "--detach"), "wait a while"))
    attach = w.popen("attach", "c1", "--json") if w.case.extra_ask else None
    try:
        await wait_until_async(lambda: _pids_with(marker.encode()), "the tool to start",
                               timeout=w.case.deadline, interval=0.05)
        await _cancelled(w, marker)
    finally:
        if attach is not None:
            try:
                await anyio.to_thread.run_sync(lambda: attach.communicate(timeout=60))
            finally:
                if attach.poll() is None:
                    attach.kill()
                    attach.wait()
    if attach is not None:
        assert attach.returncode != 0  # the run it drove was aborted


async def _cancelled(w: HarnessWorld, marker: str) -> None:
    rec = w.record("c1")
    services = rec["spec"]["agent"]["services_pid"]
    status = read_status(JournalPaths.for_run(rec["journal"]["dir"], "c1").status)
    assert status is not None and status.agent_pid is not None
    agent = status.agent_pid
    assert process_alive(services) and process_alive(agent)
    ok(await w.acorral("cancel", "c1", timeout=60))
    assert w.record("c1")["status"] == "aborted"
    events = w.log("c1")
    assert events[-1]["type"] == "RUN_ERROR", events[-3:]
    every_call_has_one_result(events)  # the cut-short call too
    await wait_until_async(lambda: not process_alive(services),
                           "the model proxy daemon to stop", timeout=10)
    await wait_until_async(lambda: not process_alive(agent), "the agent to stop", timeout=10)
    await wait_until_async(lambda: not _pids_with(marker.encode()),
                           "the tool's processes to stop", timeout=10)


class Gate:
    """A script whose model call after the tool result waits until the gate opens."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.waiting = threading.Event()

    def __call__(self, req: ModelRequest) -> Reply:
        if req.tool_results:
            self.waiting.set()
            assert self.open.wait(120), "the gate was never opened"
            return Text("Finished: " + "\n".join(req.tool_results).strip())
        return ToolCall("echo step-one && echo step-two", text="Running it.")


def kill_after_tool_result(proc: subprocess.Popen[str], gate: Gate) -> None:
    """Read the driver's events until the tool result, wait for the held model call,
    then SIGKILL the driver."""
    assert proc.stdout is not None
    seen: list[str] = []
    while "TOOL_CALL_RESULT" not in seen:
        line = proc.stdout.readline()
        assert line, proc.communicate()[1][-3000:]
        seen.append(json.loads(line)["event"]["type"])
    assert gate.waiting.wait(60), "the model call after the tool never came"
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@STOP_CHECKS.add
async def check_sigkill_then_attach(w: HarnessWorld) -> None:
    """The driving process is SIGKILLed mid-run (between a tool result and the next model
    call): the agent goes on without a driver, and ``corral attach`` then prints the whole
    log once, which equals both the journal translated afresh (no lost or repeated event)
    and an uninterrupted run of the same script (ids and timings aside)."""
    prompt = "run the two steps"
    gate = Gate()
    gate.open.set()
    w.script(gate)
    ok(await w.agent("ref", prompt))
    reference = w.log("ref")

    gate = Gate()
    w.script(gate)
    proc = w.popen(*w.run_args("k1"), prompt)
    try:
        await anyio.to_thread.run_sync(lambda: kill_after_tool_result(proc, gate))
    finally:
        gate.open.set()  # nobody drives now; the model proxy daemon still answers
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert w.record("k1")["status"] == "running"
    rec = w.record("k1")
    paths = JournalPaths.for_run(rec["journal"]["dir"], "k1")

    def exited() -> bool:
        status = read_status(paths.status)
        return status is not None and status.state == "exited"

    await anyio.to_thread.run_sync(lambda: wait_until(
        exited, "the agent to finish without a driver", timeout=w.case.deadline))
    att = await w.acorral("attach", "k1", "--json")
    ok(att)
    log = w.log("k1")
    assert ndjson_events(att.stdout) == log  # attach printed it all, once
    assert log == await w.retranslated("k1", prompt)  # no duplicate, no gap
    assert w.normalized(log, "k1") == w.normalized(reference, "ref")
    assert "step-one\nstep-two" in texts(log).split("Finished: ", 1)[1]
    rec = w.record("k1")
    assert rec["status"] == "completed"
    assert rec["usage"]["requests"] == w.record("ref")["usage"]["requests"]
