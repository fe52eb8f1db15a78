"""The real CLIs in real bubblewrap sandboxes against the scripted model server.

Each run goes through the production path: ``prepare_agent`` (host model proxy on a unix
socket bound into the sandbox, in-sandbox forwarder), ``launch_supervised`` with the
bubblewrap handle's ``host_command``, and ``translate_run`` over the real journal.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from ag_ui.core import EventType

from corral.agents._prepare import prepare_agent
from corral.harness._base import AgentRequest, RunContext, translate_run
from corral.net._model_proxy import PLACEHOLDER_KEY
from corral.journal._layout import JournalPaths
from corral.journal._sentinel import new_nonce
from corral.journal._supervisor import kill_supervised_async, launch_supervised_async
from corral.testing._model_server import (
    Fail,
    Hang,
    ModelRequest,
    ModelServer,
    Reply,
    Text,
    ToolCall,
    shell_then_text,
)
from corral.testing import wait_until_async

from .conftest import (
    CLIS,
    REAL_KEY,
    base_options,
    assert_key_outside,
    make_harness,
    run_agent,
    upstream_for,
)

pytestmark = pytest.mark.timeout(240)

SHELL_NAME = {"claude-code": "Bash", "codex": "shell", "gemini-cli": "run_shell_command"}


@pytest.mark.parametrize("cli", CLIS)
def test_shell_tool_edits_the_workspace(cli: str, sandbox_factory: Any,
                                        model_server: ModelServer) -> None:
    model_server.script = shell_then_text(
        "printf 'edited by the agent\\n' > note.txt && cat note.txt", "All done: {output}")
    harness = make_harness(cli)

    async def go() -> Any:
        handle = await sandbox_factory()
        await handle.fs.write("/workspace/note.txt", b"original\n")
        run = await run_agent(harness, handle, "please edit note.txt", model_server)
        return run, await handle.fs.read("/workspace/note.txt")

    run, content = anyio.run(go)
    assert content == b"edited by the agent\n", run.stderr
    starts = run.of(EventType.TOOL_CALL_START)
    assert [s.tool_call_name for s in starts] == [SHELL_NAME[cli]]
    call_id = starts[0].tool_call_id
    args = "".join(e.delta for e in run.of(EventType.TOOL_CALL_ARGS) if e.tool_call_id == call_id)
    assert "note.txt" in json.loads(args)["command"]
    assert [e.tool_call_id for e in run.of(EventType.TOOL_CALL_END)] == [call_id]
    results = run.of(EventType.TOOL_CALL_RESULT)
    assert [r.tool_call_id for r in results] == [call_id]
    assert "edited by the agent" in results[0].content
    # (gemini-cli streams a message in several deltas)
    final = "".join(run.texts())
    assert "All done:" in final and "edited by the agent" in final.split("All done:")[1]
    session = [e for e in run.of(EventType.CUSTOM) if e.name == "corral.session"]
    assert len(session) == 1 and session[0].value["harness"] == cli
    assert run.events[0].type == EventType.RUN_STARTED
    terminal = run.terminal
    assert terminal.type == EventType.RUN_FINISHED, terminal
    assert terminal.usage and terminal.usage[0].output_tokens and terminal.usage[0].input_tokens
    # The proxy metered exactly what the scripted server streamed: 2 requests x (100 in, 20 out).
    assert run.report.usage.requests == 2
    assert (run.report.usage.input_tokens, run.report.usage.output_tokens) == (200, 40)
    assert run.report.session_id == session[0].value["sessionId"]
    assert [r.api_key for r in model_server.model_requests] == [REAL_KEY, REAL_KEY]


# Matches the key without containing it (the command line itself is logged by the CLIs).
KEY_PATTERN = REAL_KEY.replace("REAL", "REA[L]")


def _leak_script(cli: str) -> Any:
    probe = (
        "env; echo ---; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -i key; "
        "echo ---; timeout 60 grep -rIl --exclude-dir=proc --exclude-dir=sys "
        "--exclude-dir=dev --exclude-dir=usr --exclude-dir=opt -e '" + KEY_PATTERN + "' / "
        "2>/dev/null; echo grep-exit=$?"
    )
    return shell_then_text(probe, "Probe output: {output}")


@pytest.mark.parametrize("cli", CLIS)
def test_the_real_key_never_enters_the_sandbox(cli: str, sandbox_factory: Any,
                                               model_server: ModelServer) -> None:
    model_server.script = _leak_script(cli)
    harness = make_harness(cli)

    async def go() -> Any:
        handle = await sandbox_factory()
        run = await run_agent(harness, handle, "print your environment", model_server)
        return run, handle

    run, handle = anyio.run(go)
    assert run.terminal.type == EventType.RUN_FINISHED, (run.terminal, run.stderr)
    results = run.tool_results()
    assert len(results) == 1
    out = results[0]
    # The probe really ran: the environment was printed, the grep finished and listed no
    # file (exit 1: nothing found; 2: nothing found, some files unreadable).
    assert "PATH=" in out, out
    assert out.rsplit("---\n", 1)[1].strip() in ("grep-exit=1", "grep-exit=2"), out
    assert PLACEHOLDER_KEY in out  # what the CLI holds instead of a key
    assert REAL_KEY not in out
    assert all(REAL_KEY not in json.dumps(e.model_dump(mode="json")) for e in run.events)
    # Nothing under the sandbox's writable areas, nor the socket directory it can see.
    assert_key_outside(handle, run)
    # ... while the model server saw it on every request.
    assert len(model_server.model_requests) == 2
    assert all(r.api_key == REAL_KEY for r in model_server.model_requests)
    assert all(r.headers.get("x-api-key", REAL_KEY) == REAL_KEY
               for r in model_server.model_requests)


def _remembering_script(first_answer: str) -> Any:
    def script(req: ModelRequest) -> Reply:
        if "second" in req.last_user_text:
            return Text("second answer")
        return Text(first_answer)

    return script


@pytest.mark.parametrize("cli", CLIS)
@pytest.mark.parametrize("destroy", [False, True], ids=["same-sandbox", "fresh-sandbox"])
def test_resume_continues_the_cli_session(cli: str, destroy: bool, sandbox_factory: Any,
                                          bwrap: Any, model_server: ModelServer) -> None:
    model_server.script = _remembering_script("FIRST-ANSWER-42")
    harness = make_harness(cli)

    async def go() -> Any:
        first_box = await sandbox_factory()
        run1 = await run_agent(harness, first_box, "first prompt XYZZY-7", model_server,
                               thread_id="t-resume", run_id="r1")
        if destroy:
            await bwrap.destroy(first_box.ref)
            second_box = await sandbox_factory()
        else:
            second_box = first_box
        run2 = await run_agent(harness, second_box, "second prompt", model_server,
                               thread_id="t-resume", run_id="r2")
        return run1, run2

    run1, run2 = anyio.run(go)
    assert run1.terminal.type == EventType.RUN_FINISHED, run1.stderr
    assert run2.terminal.type == EventType.RUN_FINISHED, run2.stderr
    assert run1.report.saved is not None and run1.report.saved.files >= 1
    assert run2.prepared.resumed is not None
    sid1 = run1.report.session_id
    assert sid1 and run2.prepared.resumed.session_id == sid1
    assert run2.report.session_id == sid1  # the same CLI session continued
    last = model_server.model_requests[-1]
    assert "second prompt" in last.last_user_text
    history = "\n".join(last.texts)
    assert "first prompt XYZZY-7" in history and "FIRST-ANSWER-42" in history


@pytest.mark.parametrize("cli", CLIS)
@pytest.mark.parametrize("failure", ["error", "hang", "stall"])
def test_a_failing_model_ends_the_run_with_run_error(cli: str, failure: str,
                                                     sandbox_factory: Any,
                                                     model_server: ModelServer) -> None:
    model_server.script = {
        "error": [Fail(500, "scripted outage")],
        "hang": [Hang()],
        "stall": [Hang(after_frames=3, then=Text("this answer never completes")), Hang()],
    }[failure]
    harness = make_harness(cli)

    async def go() -> Any:
        handle = await sandbox_factory()
        return await run_agent(harness, handle, "hello", model_server, deadline=60,
                               model_idle_timeout=2.0)

    run = anyio.run(go)
    assert run.terminal.type == EventType.RUN_ERROR, run.terminal
    assert run.terminal.message
    assert run.elapsed < 30, run.elapsed
    assert len([e for e in run.events if e.type in (EventType.RUN_FINISHED,
                                                    EventType.RUN_ERROR)]) == 1
    if failure == "hang":
        assert "corral model proxy" in run.terminal.message


@pytest.mark.parametrize("cli", CLIS)
def test_token_budget_refuses_further_requests(cli: str, sandbox_factory: Any,
                                               model_server: ModelServer) -> None:
    model_server.script = [ToolCall("echo one"), Text("never reached")]
    harness = make_harness(cli)

    async def go() -> Any:
        handle = await sandbox_factory()
        return await run_agent(harness, handle, "use the shell", model_server, budget=100)

    run = anyio.run(go)
    assert run.terminal.type == EventType.RUN_ERROR, run.terminal
    assert "budget" in run.terminal.message, run.terminal.message
    assert len(model_server.model_requests) == 1  # the second one never left the host
    assert run.report.usage.refused == 1 and run.report.usage.total == 120


def test_agent_timeout_stops_a_hanging_cli(sandbox_factory: Any,
                                           model_server: ModelServer) -> None:
    # The model proxy would wait 300 s; the run's own timeout (3 s) stops the CLI first.
    model_server.script = [Hang()]
    harness = make_harness("claude-code")

    async def go() -> Any:
        handle = await sandbox_factory()
        return await run_agent(harness, handle, "hello", model_server, deadline=3)

    run = anyio.run(go)
    assert run.terminal.type == EventType.RUN_ERROR
    assert run.terminal.code == "timeout", run.terminal
    assert run.elapsed < 20


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


@pytest.mark.parametrize("cli", CLIS)
def test_cancel_stops_every_process_of_the_run(cli: str, sandbox_factory: Any,
                                               model_server: ModelServer) -> None:
    marker = f"corral-cancel-{os.getpid()}-{cli}"
    model_server.script = [ToolCall(f"tail -f /dev/null # {marker}")]
    harness = make_harness(cli)

    async def go() -> tuple[list[EventType], list[int], list[int]]:
        handle = await sandbox_factory()
        prepared = await prepare_agent(
            harness, handle, AgentRequest(prompt="wait forever", options=base_options(cli)),
            thread_id="t-cancel", run_id="r-cancel", upstream=upstream_for(harness, model_server))
        paths = JournalPaths.for_run(handle.private_dir, "r-cancel")
        nonce = new_nonce()
        kinds: list[EventType] = []
        running: list[int] = []
        async with prepared.services():
            await launch_supervised_async(prepared.agent_spec(), paths, nonce)
            with anyio.fail_after(60):
                async for batch in translate_run(harness, RunContext("r-cancel", "t-cancel"),
                                                 paths, nonce=nonce):
                    kinds += [e.type for e in batch.events]
                    if EventType.TOOL_CALL_END in kinds and not running:
                        await wait_until_async(lambda: _pids_with(marker.encode()),
                                               "the tool to start", timeout=60, interval=0.02)
                        running = _pids_with(marker.encode())
                        assert await kill_supervised_async(paths, grace=3.0)
        await wait_until_async(lambda: not _pids_with(marker.encode()),
                               "the cancelled run's processes to end", interval=0.05)
        return kinds, running, _pids_with(marker.encode())

    kinds, running, left = anyio.run(go)
    assert running, "the tool never started"
    assert left == [], "processes of the cancelled run survived"
    assert kinds[-1] == EventType.RUN_ERROR
    assert kinds.count(EventType.TOOL_CALL_RESULT) == kinds.count(EventType.TOOL_CALL_START)


@pytest.mark.parametrize("cli", CLIS)
def test_instructions_reach_the_model_through_the_clis_own_config(
        cli: str, sandbox_factory: Any, model_server: ModelServer) -> None:
    model_server.script = [Text("ok")]
    harness = make_harness(cli)

    async def go() -> Any:
        handle = await sandbox_factory()
        return await run_agent(harness, handle, "hello", model_server,
                               instructions="Always answer in the voice of a PELICAN-7781.")

    run = anyio.run(go)
    assert run.terminal.type == EventType.RUN_FINISHED, run.stderr
    body = json.dumps(model_server.model_requests[0].body)
    assert "PELICAN-7781" in body


def test_local_provider_runs_the_cli_from_its_host_path(agents_env: Path,
                                                        model_server: ModelServer) -> None:
    from corral.providers._local import LocalProvider

    model_server.script = shell_then_text("echo local > made-here.txt && pwd", "did: {output}")
    harness = make_harness("claude-code")
    provider = LocalProvider()

    async def go() -> Any:
        handle = await provider.create()
        try:
            run = await run_agent(harness, handle, "go", model_server)  # type: ignore[arg-type]
            return run, await handle.fs.read("/workspace/made-here.txt")
        finally:
            await provider.destroy(handle.ref)

    run, content = anyio.run(go)
    assert content == b"local\n"
    assert run.terminal.type == EventType.RUN_FINISHED, run.stderr
    assert all(r.api_key == REAL_KEY for r in model_server.model_requests)
    assert run.prepared.own_net_dir is not None and not run.prepared.own_net_dir.exists()


def test_detached_services_outlive_the_driver_and_stop_with_the_agent(
        sandbox_factory: Any, model_server: ModelServer) -> None:
    model_server.script = shell_then_text("echo detached > d.txt && cat d.txt", "ok {output}")
    harness = make_harness("claude-code")

    async def go() -> Any:
        handle = await sandbox_factory()
        prepared = await prepare_agent(
            harness, handle, AgentRequest(prompt="go", options=base_options("claude-code")),
            thread_id="t-det", run_id="r-det", upstream=upstream_for(harness, model_server))
        paths = JournalPaths.for_run(handle.private_dir, "r-det")
        nonce = new_nonce()
        # No in-process services: only the daemon answers the agent. It is started first and
        # waited for after the launch (the forwarder waits for its socket meanwhile).
        pending = await prepared.start_services(paths)
        await launch_supervised_async(prepared.agent_spec(), paths, nonce)
        services = await anyio.to_thread.run_sync(pending.ready)
        events = []
        with anyio.fail_after(60):
            async for batch in translate_run(harness, RunContext("r-det", "t-det"), paths,
                                             nonce=nonce):
                events += batch.events
        await wait_until_async(lambda: not os.path.exists(f"/proc/{services.pid}"),
                               "the services daemon to stop after the agent exited",
                               interval=0.05)
        gone = not os.path.exists(f"/proc/{services.pid}")
        report = await prepared.finish(paths, nonce)
        return events, services, gone, report, await handle.fs.read("/workspace/d.txt")

    events, services, gone, report, content = anyio.run(go)
    assert events[-1].type == EventType.RUN_FINISHED
    assert content == b"detached\n"
    assert gone, "the services daemon did not stop after the agent exited"
    assert (report.usage.requests, report.usage.input_tokens, report.usage.output_tokens) == (
        2, 200, 40)
    assert services.usage() is not None
    assert all(r.api_key == REAL_KEY for r in model_server.model_requests)
