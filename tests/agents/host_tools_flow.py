"""The host-tool round trip the ACP agents' tests run (the four CLIs run the conformance kit's
``check_host_tool`` instead; kept for the agents over ACP until they run the kit)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio

from corral.runs._runner import Runner, RunRequest
from corral.stores._protocols import Store
from corral.stores import open_store
from corral.testing._model_script import ModelRequest, Reply, Text, ToolCall
from corral.testing._model_server import ModelServer
from corral.tools import Toolset, tool
from corral.tools._projection import TOKEN_ENV, run_tools_token

DEADLINE = 150.0


async def logged(store: Store, run_id: str) -> list[dict[str, Any]]:
    return [dict(e.event) for e in await store.snapshot(run_id)]




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




def check_host_tool_round_trip(
    *, harness: str, options: dict[str, Any], host_env: ModelServer, corral_home: Path,
    tmp_path: Path,
    call_then_answer: Callable[[str, dict[str, Any]], Script],
    sandbox: Any = None,
) -> Mapping[str, Any]:
    """A Runner run of ``harness`` whose model calls the host tool ``read_host_state`` (the
    script from ``call_then_answer(tool, args)``), checked end to end: the tool ran on the
    host, its result reached the model and the events (under the tool's own name), and the
    tools token is not in the run spec; without network (the default) no egress forwarder.
    Returns the spec."""
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
    assert json.loads(args) == {"key": "answer"}
    results = [e["content"] for e in events if e["type"] == "TOOL_CALL_RESULT"]
    assert any(secret in r for r in results)
    text = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert "Host said:" in text and f"answer={secret}" in text.split("Host said:", 1)[1]
    info = spec["agent"]
    assert info["tools_socket"] and not any("egress" in s for s in info["sockets"])
    # The tool server's token is stored nowhere in the record.
    assert token not in json.dumps(spec) and TOKEN_ENV not in json.dumps(spec)
    return spec
