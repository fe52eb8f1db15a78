"""The host-tool approval flow both agent CLIs are tested with (shared by their test files)."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio

from corral.runs._runner import Runner, RunRequest
from corral.stores._protocols import Store
from corral.stores import open_store
from corral.testing._model_server import ModelRequest, ModelServer, Reply, Text, ToolCall
from corral.tools import Toolset, tool
from corral.tools._approvals import APPROVAL_REQUEST_EVENT, APPROVAL_RESOLVED_EVENT
from corral.tools._projection import TOKEN_ENV, run_tools_token
from corral.testing import wait_until_async
from tests.helpers import assert_secret_only_in_secrets_table

DEADLINE = 150.0


async def logged(store: Store, run_id: str) -> list[dict[str, Any]]:
    return [dict(e.event) for e in await store.snapshot(run_id)]


async def approval_request(store: Store, run_id: str, done: list[Any]) -> dict[str, Any]:
    """The run's approval request event, once the viewer sees it in the log (polled; fails
    if the run ends first, ``done`` being filled by its driver)."""
    found: list[dict[str, Any]] = []

    async def requested() -> bool:
        events = await logged(store, run_id)
        found[:] = [e for e in events
                    if e["type"] == "CUSTOM" and e["name"] == APPROVAL_REQUEST_EVENT]
        if not found and done:
            raise AssertionError(f"the run ended without an approval request: {events[-3:]}")
        return bool(found)

    await wait_until_async(requested, "the approval request event", timeout=DEADLINE,
                           interval=0.05)
    return found[0]


Script = Callable[[ModelRequest], Reply]


def host_tool_script(
    offered: Callable[[ModelRequest, str, dict[str, Any]], ToolCall | None],
) -> Callable[[str, dict[str, Any]], Script]:
    """``call_then_answer(tool_name, args)`` for one CLI: a model script that asks for host
    tool ``tool_name`` (the call ``offered(req, tool_name, args)`` gives, under the name the
    CLI offers it by), then answers with what it returned. Without the tool on offer
    (``offered`` gives ``None``) the answer says so (and the test fails on it)."""

    def call_then_answer(tool_name: str, args: dict[str, Any]) -> Script:
        def script(req: ModelRequest) -> Reply:
            results = req.tool_results
            if results:
                return Text("Host said: " + "\n".join(results).strip())
            call = offered(req, tool_name, args)
            if call is None:
                return Text(f"NO HOST TOOL offered; tools: {req.tools}")
            return call

        return script

    return call_then_answer


def tool_names(events: list[dict[str, Any]]) -> list[str]:
    return [e["toolCallName"] for e in events if e["type"] == "TOOL_CALL_START"]


def run_approval_flow(
    *,
    request: RunRequest,
    toolset: Toolset,
    answer: str,
    flags: list[str],
    host_env: ModelServer,
    corral_home: Path,
    corral_cmd: list[str],
    cli_env: dict[str, str],
) -> None:
    """Start ``request`` with the approval tool ``set_host_flag``; wait until the approval
    request is in the run's log (the call held: nothing ran yet), answer it with
    ``corral approve --allow|--deny``, and check what the tool and the model saw."""

    async def main() -> tuple[list[dict[str, Any]], str, subprocess.CompletedProcess[str],
                              bytes]:
        store = await open_store(f"sqlite://{corral_home / 'corral.db'}")
        try:
            runner = Runner(store, tools=toolset, approval_timeout=120)
            run_id = (await runner.start(request)).run_id
            done: list[Any] = []

            async def drive() -> None:
                done.append(await runner.drive(run_id))

            async with anyio.create_task_group() as tg:
                tg.start_soon(drive)
                pending = await approval_request(store, run_id, done)
                assert flags == []  # held until answered
                value = pending["value"]
                assert value["tool"] == "set_host_flag" and value["args"] == {"value": "on"}
                approve = await anyio.to_thread.run_sync(lambda: subprocess.run(
                    [*corral_cmd, "approve", run_id, value["approvalId"], f"--{answer}",
                     "--reason", "not today"],
                    env=cli_env, capture_output=True, text=True, timeout=60, check=False))
            return (await logged(store, run_id), done[0].record.status.value, approve,
                    await store.shared_secret("approvals"))
        finally:
            await store.aclose()

    events, status, approve, key = anyio.run(main)
    assert approve.returncode == 0, approve.stderr
    # corral's key signed the id and derived the tool token: it is in its table only
    assert_secret_only_in_secrets_table(corral_home / "corral.db", key, approve.stdout,
                                        approve.stderr)
    assert status == "completed", events[-3:]
    resolved = [e["value"] for e in events
                if e["type"] == "CUSTOM" and e["name"] == APPROVAL_RESOLVED_EVENT]
    assert [r["decision"] for r in resolved] == [answer]
    assert tool_names(events) == ["set_host_flag"]
    results = [r for req in host_env.model_requests for r in req.tool_results]
    if answer == "allow":
        assert flags == ["on"]
        assert any("flag set to on" in r for r in results)
    else:
        assert flags == []
        assert any("denied by a human: not today" in r for r in results)


def check_host_tool_round_trip(
    *, harness: str, options: dict[str, Any], host_env: ModelServer, corral_home: Path,
    tmp_path: Path,
    call_then_answer: Callable[[str, dict[str, Any]], Script],
    sandbox: Any = None,
    args_reported: bool = True,
) -> Mapping[str, Any]:
    """A Runner run of ``harness`` whose model calls the host tool ``read_host_state`` (the
    script from ``call_then_answer(tool, args)``), checked end to end: the tool ran on the
    host, its result reached the model and the events (under the tool's own name), and the
    tools token is not in the run spec; without network (the default) no egress forwarder.
    ``args_reported=False``: the agent does not report a call's arguments (gemini over
    ACP). Returns the spec."""
    secret = "host-only-" + secrets.token_hex(8)
    secret_file = tmp_path / "host-state.txt"  # on the host, outside any sandbox
    secret_file.write_text(secret)
    seen: list[str] = []

    @tool
    def read_host_state(key: str) -> str:
        """Read a value that only the host has."""
        seen.append(key)
        return f"{key}={secret_file.read_text()}"

    host_env.script = call_then_answer("read_host_state", {"key": "answer"})

    async def main() -> tuple[list[dict[str, Any]], Mapping[str, Any], str, str]:
        store = await open_store(f"sqlite://{corral_home / 'corral.db'}")
        try:
            runner = Runner(store)
            rec = await runner.start(RunRequest(
                prompt="What does the host say?", harness=harness, options=options,
                tools=Toolset([read_host_state]), sandbox=sandbox))
            with anyio.fail_after(DEADLINE):
                result = await runner.drive(rec.run_id)
            return (await logged(store, rec.run_id), result.record.spec or {},
                    result.record.status.value, await run_tools_token(store, rec.run_id))
        finally:
            await store.aclose()

    events, spec, status, token = anyio.run(main)
    offered = [r.tools for r in host_env.model_requests]
    assert status == "completed", (events[-3:], offered)
    assert seen == ["answer"], offered
    # The tool's result went back to the model in the CLI's next request.
    assert any(secret in r for req in host_env.model_requests for r in req.tool_results)
    # The events name the host tool by its own name; no server prefix leaks through.
    assert tool_names(events) == ["read_host_state"]
    start = next(e for e in events if e["type"] == "TOOL_CALL_START")
    args = "".join(e["delta"] for e in events if e["type"] == "TOOL_CALL_ARGS"
                   and e["toolCallId"] == start["toolCallId"])
    assert json.loads(args) == {"key": "answer"} if args_reported else args == ""
    results = [e["content"] for e in events if e["type"] == "TOOL_CALL_RESULT"]
    assert any(secret in r for r in results)
    text = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert "Host said:" in text and f"answer={secret}" in text.split("Host said:", 1)[1]
    info = spec["agent"]
    assert info["tools_socket"] and not any("egress" in s for s in info["sockets"])
    # The tool server's token is stored nowhere in the record.
    assert token not in json.dumps(spec) and TOKEN_ENV not in json.dumps(spec)
    return spec
