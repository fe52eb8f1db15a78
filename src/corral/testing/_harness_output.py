"""Structured output conformance kit: a run asked for a result matching a JSON Schema
(``corral run --output-schema FILE``) gets one from every agent harness, the real CLI in
a real sandbox against the scripted model server.

The scripted model answers each CLI the way that CLI takes a structured result: Claude
Code's ``StructuredOutput`` tool (``--json-schema``), Codex's final message under
``--output-schema`` (the Responses request carries ``text.format`` ``json_schema``), and
for every other CLI the run's host tool ``submit_result`` (MCP server ``corral``).

    pytest_checks(OUTPUT_KIT, {"codex": lambda: HarnessCase("codex", {...})}, globals())
"""

# The world reads the SQLite store directly, on purpose.
# ruff: noqa: ASYNC230

from __future__ import annotations

import json
import signal
import subprocess
import threading
from collections.abc import Callable
from typing import Any, Final

import anyio
import httpx

from corral.server._app import create_app
from corral.server._config import ServerConfig
from corral.testing._harness_world import HarnessWorld, world
from corral.testing._kit import Kit
from corral.testing._model_script import ModelRequest, Reply, Text, ToolCall
from corral.testing._polling import wait_until_async

__all__ = [
    "OUTPUT_KIT",
    "SCHEMA",
    "check_output_exhausted",
    "check_output_retries_survive_a_takeover",
    "check_output_retry",
    "check_output_valid",
    "structured_answer",
]

SCHEMA: Final = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}, "city": {"type": "string"}},
    "required": ["answer", "city"],
    "additionalProperties": False,
}
VALID: Final = {"answer": 42, "city": "Oslo"}
INVALID: Final = {"answer": "forty-two", "city": "Oslo"}
ACCEPTED = ("Result accepted", "Structured output provided successfully")
CLI_CHECKS_TOOL_ARGS: Final = frozenset({"gemini-cli"})
"""Harnesses whose CLI checks a tool call's arguments against the tool's input schema
itself (answering the model with its own error): an invalid result never reaches corral.
A case says so of its own with :attr:`HarnessCase.checks_tool_args` (``acp`` with gemini)."""
GIVE_UP = ("No tries are left", "no more tries")


def _native_codex(req: ModelRequest) -> bool:
    text = req.body.get("text") if isinstance(req.body, dict) else None
    fmt = text.get("format") if isinstance(text, dict) else None
    return isinstance(fmt, dict) and fmt.get("type") == "json_schema"


def structured_answer(w: HarnessWorld, req: ModelRequest, value: dict[str, Any]
                      ) -> Reply:
    """The model giving ``value`` as the run's result, the way this CLI takes one."""
    if "StructuredOutput" in req.tools:
        return ToolCall("", tool="StructuredOutput", args=value)
    if _native_codex(req):
        return Text(json.dumps(value))
    call = w.case.host_tool_call(req, "submit_result", value)
    return call if call is not None else Text(f"NO submit_result offered: {req.tools}")


def _script(w: HarnessWorld, answers: Callable[[int], dict[str, Any]]
            ) -> Callable[[ModelRequest], Reply]:
    """Answer ``answers(n)`` where ``n`` counts the results refused so far; once one is
    accepted, end the turn."""

    def script(req: ModelRequest) -> Reply:
        results = req.tool_results
        if results and any(a in results[-1] for a in ACCEPTED):
            return Text("Done.")
        if results and any(a in results[-1] for a in GIVE_UP):
            return Text("I cannot give a valid result.")
        return structured_answer(w, req, answers(len(results)))

    return script


async def _run(w: HarnessWorld, run_id: str) -> tuple[Any, list[dict[str, Any]]]:
    schema = w.scratch / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    out = await w.agent(run_id, "Which city, and what is the answer?",
                        "--output-schema", str(schema))
    return out, w.log(run_id)


async def _api_output(w: HarnessWorld, run_id: str) -> Any:
    """``GET /v1/runs/{id}`` of an app on the world's store: its ``output``."""
    app = create_app(config=ServerConfig(store_url=f"sqlite://{w.db}"))
    async with app.running():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            r = await c.get(f"/v1/runs/{run_id}")
    assert r.status_code == 200, r.text
    return r.json().get("output")


def _ends_with_output(events: list[dict[str, Any]], value: dict[str, Any]) -> None:
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "RUN_FINISHED", events[-3:]
    assert events[-2] == {"type": "CUSTOM", "name": "corral.output", "value": value}, \
        events[-3:]
    names = [e.get("name") for e in events if e["type"] == "CUSTOM"]
    assert names.count("corral.output") == 1
    assert "corral.output_candidate" not in names  # taken out of the log


OUTPUT_KIT: Kit[HarnessWorld] = Kit("output", subject=world)
"""The structured-output checks; the subject is a :class:`HarnessWorld`."""


@OUTPUT_KIT.add
async def check_output_valid(w: HarnessWorld) -> None:
    """A valid result on the first answer: the run completes, its record (``corral show
    --json`` and ``GET /v1/runs/{id}``) holds the object, and ``CUSTOM corral.output``
    carries it just before ``RUN_FINISHED``."""
    w.script(_script(w, lambda n: VALID))
    out, events = await _run(w, "so1")
    assert out.returncode == 0, (out.stderr[-2000:], events[-3:])
    _ends_with_output(events, VALID)
    show = await w.acorral("show", "so1", "--json")
    assert show.returncode == 0, show.stderr
    assert json.loads(show.stdout)["output"] == VALID
    assert await _api_output(w, "so1") == VALID
    assert w.record("so1")["status"] == "completed"


@OUTPUT_KIT.add
async def check_output_retry(w: HarnessWorld) -> None:
    """A first answer that does not match the schema is answered with the validation
    error; the second, valid one is the run's result. (Codex takes one final message and
    no second try: there the run fails naming the mismatch.)"""
    w.script(_script(w, lambda n: INVALID if n == 0 else VALID))
    out, events = await _run(w, "so2")
    rec = w.record("so2")
    if w.case.harness == "codex":
        assert out.returncode != 0 and rec["status"] == "failed", events[-3:]
        assert rec["error"]["code"] == "output_invalid", rec["error"]
        assert "answer" in rec["error"]["message"] and "integer" in rec["error"]["message"]
        assert "output" not in rec
        return
    assert out.returncode == 0, (out.stderr[-2000:], events[-3:])
    _ends_with_output(events, VALID)
    assert rec["output"] == VALID
    told = [r for req in w.server.model_requests for r in req.tool_results]
    assert any("integer" in r for r in told), told  # the agent heard what was wrong


@OUTPUT_KIT.add
async def check_output_exhausted(w: HarnessWorld) -> None:
    """Every answer invalid: after the bounded retries the run ends ``failed``, its error
    naming the validation error, with no output."""
    w.script(_script(w, lambda n: INVALID))
    out, events = await _run(w, "so3")
    rec = w.record("so3")
    assert out.returncode != 0 and rec["status"] == "failed", events[-3:]
    assert "output" not in rec
    assert "corral.output" not in [e.get("name") for e in events]
    message = rec["error"]["message"]
    assert rec["error"]["code"] in ("output_invalid", "claude-code:structured_output_retry_"
                                    "exhausted", "claude-code:error_max_structured_output_"
                                    "retries"), rec["error"]
    if w.case.checks_tool_args or w.case.harness in CLI_CHECKS_TOOL_ARGS:
        # the CLI refused every call itself, so none reached corral to be named
        assert "never gave one" in message, rec["error"]
        return
    assert "answer" in message and "integer" in message, rec["error"]
    offered = sum(1 for req in w.server.model_requests if req.tools)
    assert offered <= 4, offered  # three answers, at most one more turn


async def check_output_retries_survive_a_takeover(w: HarnessWorld) -> None:
    """The bounded retries are the run's, not one driving process's: the driver is
    SIGKILLed after the agent's first invalid answer was refused, ``corral attach`` takes
    the run over, and the agent gets the tries that were left (``1 try left``, then none),
    not fresh ones; the run ends ``failed`` after three invalid answers in all. For the
    harnesses whose results reach corral through ``submit_result`` (not Claude Code's or
    Codex's native output, not gemini-cli, which checks a call's arguments itself)."""
    held, release = threading.Event(), threading.Event()

    def script(req: ModelRequest) -> Reply:
        results = req.tool_results
        if results and any(a in results[-1] for a in GIVE_UP):
            return Text("I cannot give a valid result.")
        if len(results) == 1:  # the first answer was refused: hold until the takeover
            held.set()
            if not release.wait(120):
                return Text("the test never released the model")
        return structured_answer(w, req, INVALID)

    w.script(script)
    schema = w.scratch / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    proc = w.popen(*w.run_args("so4", "--output-schema", str(schema)),
                   "Which city, and what is the answer?")
    attach: subprocess.Popen[str] | None = None
    try:
        await anyio.to_thread.run_sync(lambda: held.wait(w.case.deadline))
        assert held.is_set(), "the model call after the first refused result never came"
        before = w.record("so4")
        assert before["output_tries"]["invalid"] == 1, before.get("output_tries")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        attach = w.popen("attach", "so4", "--json")

        def taken_over() -> bool:
            rec = w.record("so4")
            return rec["driver_epoch"] > before["driver_epoch"] and \
                rec.get("claim_owner") is not None

        await wait_until_async(taken_over, "corral attach to take the run over",
                               timeout=60, interval=0.05)
        release.set()  # the successor serves submit_result now
        await anyio.to_thread.run_sync(lambda: attach.wait(w.case.deadline))
    finally:
        release.set()
        for p in (proc, attach):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert attach is not None and attach.returncode != 0
    rec = w.record("so4")
    assert rec["status"] == "failed" and rec["error"]["code"] == "output_invalid", rec
    assert rec["output_tries"]["invalid"] == 3, rec["output_tries"]
    # the whole conversation's tool results, in order (the last request carries them all)
    last = max(w.server.model_requests, key=lambda req: len(req.tool_results))
    told = [r for r in last.tool_results if "match the schema" in r]
    said = [next((m for m in ("2 tries left", "1 try left", "No tries are left") if m in r),
                 r[:200]) for r in told]
    assert said == ["2 tries left", "1 try left", "No tries are left"], told


