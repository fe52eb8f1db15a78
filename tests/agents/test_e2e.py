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
from corral.journal._layout import JournalPaths
from corral.journal._sentinel import new_nonce
from corral.journal._supervisor import launch_supervised_async
from corral.testing._model_script import Fail, Hang, Text, shell_then_text
from corral.testing._model_server import ModelServer
from corral.testing import wait_until_async

from .conftest import (
    CLIS,
    REAL_KEY,
    base_options,
    make_harness,
    run_agent,
    upstream_for,
)

pytestmark = pytest.mark.timeout(240)

SHELL_NAME = {"claude-code": "Bash", "codex": "shell", "gemini-cli": "run_shell_command"}




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
