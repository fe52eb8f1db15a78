"""Harness conformance kit: what every agent harness (``--harness NAME``) must do, as
plain checks run against the real CLI in a real sandbox.

    from corral.testing import HarnessCase, check_harness

    await check_harness(lambda: HarnessCase("gemini-cli", {"model": "gemini-fake"},
                                            enforces=frozenset()))

An ACP agent plugs in the same way, e.g. ``HarnessCase("acp", {"agent": "gemini", "model":
"gemini-fake"}, enforces=frozenset({...}))`` (``run_args`` default to ``--agent gemini
--model gemini-fake``); see ``tests/agents/test_harness_kit.py`` for the four CLIs' cases.

How a harness plugs in: give a factory of a :class:`HarnessCase` naming the harness as
``corral run --harness`` knows it (registered in :mod:`corral.harness._registry`), the
options a :class:`~corral.runs._request.RunRequest` takes for it (``model``, ``agent`` …),
which command-policy :data:`FEATURES` it enforces (the rest must be refused at definition
time), and, where its CLI differs, how the scripted model answers its side requests
(``side_reply``) and calls host tools (``host_tool_call``). The CLI must be installed
(``corral agents install``; ``agents_dir`` or ``$CORRAL_AGENTS_DIR``) and bubblewrap must
work. Each check runs in a fresh :class:`~corral.testing._harness_world.HarnessWorld`: a
scripted model server on 127.0.0.1 speaking the CLI's own wire format is every model
upstream (``ANTHROPIC_BASE_URL``, ``OPENAI_BASE_URL``, ``GOOGLE_GEMINI_BASE_URL`` with a
per-world key), with a private ``$CORRAL_HOME``; the kit sets these in ``os.environ``
while a check runs (a Runner in this process reads them), so run checks one at a time.

What the harness must give for the checks to hold: AG-UI events where every tool call has
a start, an end and one result; the model's shell tool is one
:class:`~corral.testing._model_server.ToolCall` finds (``req.shell_tool``); a
``corral.session`` CUSTOM event carrying ``sessionId`` per run (the thread's CLI
session); host tools offered under a name ending with the tool's own name; and a
journal a successor can translate afresh to the same events (``corral attach``).

:data:`HARNESS_KIT` lists the checks; :func:`check_harness` runs them all and raises
:class:`~corral.testing.KitFailed`; ``pytest_checks(HARNESS_KIT, {...}, globals())`` makes
one pytest test per check and harness.
"""

# Checks wait on subprocesses and read small files in worker threads or directly, on
# purpose (the SQLite log is read as stored).
# ruff: noqa: ASYNC230

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import anyio

from corral.journal._layout import JournalPaths, read_status
from corral.journal._supervisor import process_alive
from corral.agents._services import PROXY_TOKEN_NAME
from corral.runs._runner import Runner
from corral.runs._request import RunRequest
from corral.sandbox._definition import Sandbox
from corral.sandbox._lifecycle import Lifecycle
from corral.stores._protocols import Store
from corral.testing._harness_world import (
    FEATURES,
    HarnessCase,
    HostToolCall,
    HarnessWorld,
    host_tool_by_suffix,
    normalized,
    world,
)
from corral.testing._hello import LoopbackHello
from corral.testing._kit import Factory, Kit, KitReport
from corral.testing._leaks import assert_no_secrets
from corral.testing._model_server import Hang, ModelRequest, Reply, Text, ToolCall
from corral.testing._polling import wait_until, wait_until_async
from corral.tools import Toolset, tool
from corral.tools._approvals import (
    APPROVAL_REQUEST_EVENT,
    APPROVAL_RESOLVED_EVENT,
    answer_approval,
)
from corral.tools._projection import TOKEN_ENV, run_tools_token

__all__ = [
    "FEATURES",
    "Gate",
    "HARNESS_KIT",
    "HarnessCase",
    "HarnessWorld",
    "approval_request",
    "call_then_answer",
    "check_approval",
    "check_cancel",
    "check_denied_command",
    "check_egress_allowlist",
    "check_harness",
    "check_host_tool",
    "check_host_tool_approval",
    "check_key_never_inside",
    "check_resume_on_thread",
    "check_session_lost",
    "check_sigkill_then_attach",
    "check_timeout",
    "check_token_budget",
    "check_tool_round_trip",
    "host_tool_by_suffix",
    "kill_after_tool_result",
    "logged_events",
    "normalized",
]

EDIT = "printf 'edited by the agent\\n' > note.txt && cat note.txt"
TOOL_EVENTS = ("TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT")


# ----------------------------------------------------------------------------- helpers


def _ndjson(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line)["event"] for line in stdout.splitlines() if line.strip()]


def _texts(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


def _results(events: list[dict[str, Any]]) -> list[str]:
    return [str(e["content"]) for e in events if e["type"] == "TOOL_CALL_RESULT"]


def _tool_names(events: list[dict[str, Any]]) -> list[str]:
    return [e["toolCallName"] for e in events if e["type"] == "TOOL_CALL_START"]


def _customs(events: list[dict[str, Any]], name: str) -> list[Any]:
    return [e["value"] for e in events if e["type"] == "CUSTOM" and e["name"] == name]


def _every_call_has_one_result(events: list[dict[str, Any]]) -> None:
    ids = {k: [e["toolCallId"] for e in events if e["type"] == k]
           for k in ("TOOL_CALL_START", "TOOL_CALL_END", "TOOL_CALL_RESULT")}
    assert sorted(ids["TOOL_CALL_START"]) == sorted(ids["TOOL_CALL_END"]) == \
        sorted(ids["TOOL_CALL_RESULT"]), ids


def _ok(out: subprocess.CompletedProcess[str]) -> None:
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


def _steps(commands: Sequence[str], final: str) -> Callable[[ModelRequest], Reply]:
    """One shell command per model turn (the results so far say which), then ``final``
    followed by every result."""

    def script(req: ModelRequest) -> Reply:
        done = len(req.tool_results)
        if done < len(commands):
            return ToolCall(commands[done], text=f"Step {done + 1}.")
        return Text(final + "\n".join(req.tool_results).strip())

    return script


async def _refused(w: HarnessWorld, feature: str, toml: str) -> None:
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
        found[:] = _customs(events, APPROVAL_REQUEST_EVENT)
        if len(found) <= n and ended():
            raise AssertionError(f"the run ended without approval request #{n + 1}: "
                                 f"{events[-3:]}")
        return len(found) > n

    await wait_until_async(requested, f"approval request #{n + 1}", timeout=timeout,
                           interval=0.05)
    return found[n]


# ----------------------------------------------------------------------------- checks


HARNESS_KIT: Kit[HarnessWorld] = Kit("harness", subject=world)
"""Every harness check; the subject is a :class:`HarnessWorld` around the factory's
:class:`HarnessCase`."""


@HARNESS_KIT.add
async def check_tool_round_trip(w: HarnessWorld) -> None:
    """``corral run`` drives the CLI through a shell tool call that edits the workspace:
    the events (printed and logged alike) run RUN_STARTED … RUN_FINISHED with one tool
    call start/args/end/result in order, the model sees the result, the edit shows as a
    ``sandbox.file`` event with its diff, and the model proxy metered exactly the requests
    the upstream got, each with the real key."""
    w.script(lambda req: Text("All done: " + "\n".join(req.tool_results).strip())
             if req.tool_results else ToolCall(EDIT, text="I'll edit the file."))
    ws = w.workspace("rt", {"note.txt": "original\n"})
    out = await w.agent("rt1", "please edit note.txt", "--workspace", str(ws),
                        "--file-events", "diff")
    _ok(out)
    events = w.log("rt1")
    assert _ndjson(out.stdout) == events
    kinds = [e["type"] for e in events]
    assert kinds[0] == "RUN_STARTED" and kinds[-1] == "RUN_FINISHED", kinds
    for kind in TOOL_EVENTS:
        assert kinds.count(kind) == 1, (kind, kinds)
    assert [kinds.index(k) for k in TOOL_EVENTS] == sorted(kinds.index(k) for k in TOOL_EVENTS)
    _every_call_has_one_result(events)
    (result,) = _results(events)
    assert "edited by the agent" in result  # the tool ran in the workspace copy
    final = _texts(events).split("All done:", 1)
    assert len(final) == 2 and "edited by the agent" in final[1]  # the model saw it
    files = [(f["type"], f["path"]) for f in _customs(events, "sandbox.file")]
    assert files == [("change", "note.txt")], files
    (patch,) = [d["diff"] for d in _customs(events, "sandbox.file.diff")]
    assert "-original" in patch and "+edited by the agent" in patch
    rec = w.record("rt1")
    assert rec["status"] == "completed" and rec["harness"] == w.case.harness
    reqs = w.server.model_requests
    assert rec["usage"]["requests"] == len(reqs) >= 2
    assert (rec["usage"]["input_tokens"], rec["usage"]["output_tokens"]) == (
        100 * len(reqs), 20 * len(reqs))
    assert all(r.api_key == w.key for r in reqs)
    assert w.key not in out.stdout + out.stderr


@HARNESS_KIT.add
async def check_key_never_inside(w: HarnessWorld) -> None:
    """The model key stays on the host: a command in the sandbox finds it in no process's
    environment and no file (the CLI holds the run's token), and nothing corral wrote (store,
    journal, events, saved session, sandbox files) holds it, while the upstream got it on
    every request."""
    probe = ("env; echo ---; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -i key; "
             "echo ---; timeout 60 grep -rIl --exclude-dir=proc --exclude-dir=sys "
             "--exclude-dir=dev --exclude-dir=usr --exclude-dir=opt -e '"
             + w.key_pattern + "' / 2>/dev/null; echo grep-exit=$?")
    w.script(_steps([probe], "Probe output: "))
    out = await w.agent("k1", "print your environment")
    _ok(out)
    events = w.log("k1")
    assert events[-1]["type"] == "RUN_FINISHED", events[-3:]
    (found,) = _results(events)
    # the probe really ran: the environment was printed and the grep listed no file
    # (exit 1: nothing found; 2: nothing found, some files unreadable)
    # the CLI's key is the run's token, which the run's log redacts
    assert "PATH=" in found and f"[REDACTED:{PROXY_TOKEN_NAME}]" in found, found
    assert found.rsplit("---\n", 1)[1].strip() in ("grep-exit=1", "grep-exit=2"), found
    assert w.key not in json.dumps(events) + out.stdout + out.stderr
    assert_no_secrets([w.home, w.files], {"MODEL_KEY": w.key})
    reqs = w.server.model_requests
    assert reqs and all(r.api_key == w.key for r in reqs)


@HARNESS_KIT.add
async def check_denied_command(w: HarnessWorld) -> None:
    """A command a ``deny`` rule names never runs (the model is told, the run goes on);
    a harness that cannot enforce deny rules refuses the policy at definition time."""
    toml = '[policy]\ndefault = "allow"\ndeny = ["rm *"]\n'
    if "deny" not in w.case.enforces:
        await _refused(w, "deny", toml)
        return
    ws = w.workspace("deny", {"precious": "keep me\n"}, toml)
    w.script(_steps(["rm -f precious", "cat precious"], "After: "))
    out = await w.agent("d1", "clean up", "--workspace", str(ws))
    _ok(out)
    events = w.log("d1")
    assert events[-1]["type"] == "RUN_FINISHED", events[-3:]
    _every_call_has_one_result(events)
    # what the model saw after each step (a CLI may log no tool call for a command its
    # hook refused: codex); the conversation's last turn carries every result (not the
    # last request: the Claude ACP adapter may ask for the session's title after it)
    seen = max(w.server.model_requests, key=lambda r: len(r.tool_results)).tool_results
    assert len(seen) == 2, seen
    assert "keep me" in seen[1], seen  # the rm never ran
    assert any("keep me" in r for r in _results(events))
    assert w.record("d1")["spec"]["policy"]["deny"] == ["rm *"]
    # the refusal is in the events whatever the CLI logs of it: corral's check logs it (a
    # CLI enforcing the rule itself, like opencode's own permissions, shows it in the
    # call's result)
    denied = _customs(events, "corral.policy_denied")
    refused_call = [e for e in events if e["type"] == "TOOL_CALL_ARGS"
                    and "rm -f precious" in e["delta"]]
    assert [(d["tool"], d["rule"]) for d in denied] == [("Bash", "deny: rm *")] or (
        not denied and refused_call), (denied, refused_call)


@HARNESS_KIT.add
async def check_approval(w: HarnessWorld) -> None:
    """A command an ``ask`` rule names waits for a corral approval: allowed, it runs;
    denied, it does not (the model is told); a harness that cannot hold a command for an
    approval refuses the policy at definition time."""
    toml = '[policy]\ndefault = "allow"\nask = ["touch *"]\n'
    if "ask" not in w.case.enforces:
        await _refused(w, "ask", toml)
        return
    ws = w.workspace("ask", toml=toml)
    w.script(_steps(["touch allowed-file", "touch denied-file", "ls"], "Listed: "))
    proc = w.popen(*w.run_args("a1", "--workspace", str(ws)), "make two files")
    try:
        async with w.store() as store:
            def ended() -> bool:
                return proc.poll() is not None

            allow = await approval_request(store, "a1", 0, ended, w.case.deadline)
            assert "touch allowed-file" in json.dumps(allow["args"]), allow
            assert _results(await logged_events(store, "a1")) == []  # held until answered
            await answer_approval(store, "a1", allow["approvalId"], True)
            deny = await approval_request(store, "a1", 1, ended, w.case.deadline)
            assert "touch denied-file" in json.dumps(deny["args"]), deny
            await answer_approval(store, "a1", deny["approvalId"], False, reason="not today")
        _out, err = await anyio.to_thread.run_sync(
            lambda: proc.communicate(timeout=w.case.deadline))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    events = w.log("a1")
    assert [r["decision"] for r in _customs(events, APPROVAL_RESOLVED_EVENT)] == \
        ["allow", "deny"]
    _every_call_has_one_result(events)
    listing = _results(events)[-1]
    assert "allowed-file" in listing and "denied-file" not in listing, listing


@HARNESS_KIT.add
async def check_host_tool(w: HarnessWorld) -> None:
    """A host tool (a Python function of the driving process, served over MCP) called by
    the model runs on the host, also under a policy denying every command; its result
    reaches the model and the events under the tool's own name; its bearer token is in no
    record or event."""
    secret = "host-only-" + secrets.token_hex(8)
    seen: list[str] = []

    @tool
    def read_host_state(key: str) -> str:
        """Read a value that only the host has."""
        seen.append(key)
        return f"{key}={secret}"

    w.script(call_then_answer(w.case.host_tool_call, "read_host_state", {"key": "answer"}))
    # host tools are corral's own, not commands: a policy denying every command (where
    # the harness enforces one) still lets them run
    sandbox = Sandbox(provider=w.case.provider, lifecycle=Lifecycle(reuse="none"),
                      policy=w.policy("deny")) if "deny" in w.case.enforces else None
    async with w.store() as store:
        runner = Runner(store)
        rec = await runner.start(RunRequest(
            prompt="What does the host say?", harness=w.case.harness,
            options=dict(w.case.options), tools=Toolset([read_host_state]),
            provider=w.case.provider, sandbox=sandbox))
        with anyio.fail_after(w.case.deadline):
            result = await runner.drive(rec.run_id)
        events = await logged_events(store, rec.run_id)
        token = await run_tools_token(store, rec.run_id)
        spec = result.record.spec or {}
    offered = [r.tools for r in w.server.model_requests]
    assert result.record.status.value == "completed", (events[-3:], offered)
    assert seen == ["answer"], offered
    assert any(secret in r for req in w.server.model_requests for r in req.tool_results)
    assert _tool_names(events) == ["read_host_state"]  # no server prefix leaks through
    start = next(e for e in events if e["type"] == "TOOL_CALL_START")
    args = "".join(e["delta"] for e in events if e["type"] == "TOOL_CALL_ARGS"
                   and e["toolCallId"] == start["toolCallId"])
    assert json.loads(args) == {"key": "answer"}
    assert any(secret in r for r in _results(events))
    assert f"answer={secret}" in _texts(events).split("Host said:", 1)[-1]
    assert token not in json.dumps(spec) + json.dumps(events)
    assert TOKEN_ENV not in json.dumps(spec)


@HARNESS_KIT.add
async def check_host_tool_approval(w: HarnessWorld) -> None:
    """A host tool marked ``approval=True`` is held until a corral approval: allowed, it
    runs; denied, it does not and the model gets the reason."""
    flags: list[str] = []

    @tool(approval=True)
    def set_host_flag(value: str) -> str:
        """Set a flag on the host (needs a human's approval)."""
        flags.append(value)
        return f"flag set to {value}"

    call = w.case.host_tool_call

    def script(req: ModelRequest) -> Reply:
        # by what came back (a CLI may send more than one result part for one call)
        done = len([r for r in req.tool_results if "flag set to" in r or "denied" in r])
        if done >= 2:
            return Text("Host said: " + "\n".join(req.tool_results).strip())
        made = call(req, "set_host_flag", {"value": ("on", "off")[done]})
        return made if made is not None else Text(f"NO HOST TOOL offered: {req.tools}")

    w.script(script)
    async with w.store() as store:
        runner = Runner(store, tools=Toolset([set_host_flag]), approval_timeout=120)
        sandbox = Sandbox(provider=w.case.provider, lifecycle=Lifecycle(reuse="none"),
                          policy=w.policy()) if w.case.extra_ask else None
        run_id = (await runner.start(RunRequest(
            prompt="Set the flag on, then off.", harness=w.case.harness,
            options=dict(w.case.options), provider=w.case.provider,
            sandbox=sandbox))).run_id
        done: list[Any] = []

        async def drive() -> None:
            done.append(await runner.drive(run_id))

        with anyio.fail_after(w.case.deadline * 2):
            async with anyio.create_task_group() as tg:
                tg.start_soon(drive)
                first = await approval_request(store, run_id, 0, lambda: bool(done),
                                            w.case.deadline)
                assert flags == []  # held until answered
                assert first["tool"] == "set_host_flag" and first["args"] == {"value": "on"}
                await answer_approval(store, run_id, first["approvalId"], True)
                second = await approval_request(store, run_id, 1, lambda: bool(done),
                                             w.case.deadline)
                assert second["args"] == {"value": "off"}
                await answer_approval(store, run_id, second["approvalId"], False,
                                      reason="not today")
        events = await logged_events(store, run_id)
    assert done[0].record.status.value == "completed", events[-3:]
    assert flags == ["on"]
    assert [r["decision"] for r in _customs(events, APPROVAL_RESOLVED_EVENT)] == \
        ["allow", "deny"]
    assert _tool_names(events) == ["set_host_flag", "set_host_flag"]
    results = [r for req in w.server.model_requests for r in req.tool_results]
    assert any("flag set to on" in r for r in results), results
    assert any("denied by a human: not today" in r for r in results), results


@HARNESS_KIT.add
async def check_resume_on_thread(w: HarnessWorld) -> None:
    """A thread's next prompt continues the CLI's own session: in the thread's sandbox,
    and again after that sandbox is destroyed (the session saved in the store is restored
    into a fresh one); the model gets the whole history each time. Nothing of the session
    is kept under ``$CORRAL_HOME/sessions``."""

    def script(req: ModelRequest) -> Reply:
        last = req.last_user_text
        return Text("THIRD-ANSWER" if "third" in last else
                    "SECOND-ANSWER" if "second" in last else "FIRST-ANSWER-42")

    w.script(script)
    ws = w.workspace("resume", toml='[lifecycle]\nreuse = "thread"\n')
    common = ("--thread", "T", "--workspace", str(ws))
    _ok(await w.agent("s1", "first prompt XYZZY-7", *common))
    _ok(await w.agent("s2", "second prompt", *common))
    box = w.record("s1")["sandbox_ref"]["id"]
    assert w.record("s2")["sandbox_ref"]["id"] == box
    history = "\n".join(w.server.model_requests[-1].texts)
    assert "first prompt XYZZY-7" in history and "FIRST-ANSWER-42" in history, history
    _ok(await w.acorral("sandboxes", "rm", box, timeout=60))
    _ok(await w.agent("s3", "third prompt", *common))
    assert w.record("s3")["sandbox_ref"]["id"] != box
    last = w.server.model_requests[-1]
    assert "third prompt" in last.last_user_text
    history = "\n".join(last.texts)
    for said in ("first prompt XYZZY-7", "FIRST-ANSWER-42", "second prompt", "SECOND-ANSWER"):
        assert said in history, (said, history)
    sessions = [s["sessionId"] for r in ("s1", "s2", "s3")
                for s in _customs(w.log(r), "corral.session")]
    assert len(sessions) == 3 and len(set(sessions)) == 1, sessions  # one CLI session
    for r in ("s1", "s2", "s3"):  # a continuation says nothing was lost
        assert not _customs(w.log(r), "corral.session_lost") and not w.record(r).get(
            "warnings"), r
    async with w.store() as store:
        saved = await store.list_sessions("T")
    assert [i.session_id for i in saved] == [sessions[0]], saved  # in the store...
    assert not (w.home / "sessions").exists()  # ...and nowhere else


async def _damage_sessions(w: HarnessWorld, thread: str) -> list[str]:
    """Every file of the thread's saved sessions replaced by bytes no CLI can read (in
    the store, as a broken disk or a bad restore would leave them); their ids."""
    async with w.store() as store:
        ids = []
        for info in await store.list_sessions(thread):
            saved = await store.get_session(thread, info.harness)
            assert saved is not None and saved.session_id, info
            ids.append(saved.session_id)
            await store.put_session(dataclasses.replace(
                saved, files={rel: b"\x00 not a transcript \xff\n" for rel in saved.files}))
    assert ids, "the first turn saved no session"
    return ids


def _lost_before_first_message(events: list[dict[str, Any]], expected: str) -> str:
    """The run's ``corral.session_lost`` event names ``expected`` and comes before its
    first message or tool call; returns its reason."""
    kinds = [(e["type"], e.get("name")) for e in events]
    at = kinds.index(("CUSTOM", "corral.session_lost"))
    first = min((i for i, (k, _n) in enumerate(kinds)
                 if k in ("TEXT_MESSAGE_START", "TOOL_CALL_START")), default=len(kinds))
    assert at < first, kinds
    (value,) = _customs(events, "corral.session_lost")
    assert value["expected"] == expected and value["reason"], value
    return str(value["reason"])


@HARNESS_KIT.add
async def check_session_lost(w: HarnessWorld) -> None:
    """A turn of a thread that cannot continue the thread's saved CLI session never looks
    like a continuation. Damaged in the store: the turn still answers, in a new
    conversation, with ``CUSTOM corral.session_lost`` (naming the session it was to
    continue) before its first message, a ``session_lost`` warning on its record and
    ``new_conversation`` in ``corral threads show``; gone from the store: the same,
    and ``corral run``'s text stream prints one warning line; with ``--on-session-lost
    fail`` the turn fails with one line naming the session instead, before the model
    is asked anything."""

    def script(req: ModelRequest) -> Reply:
        last = req.last_user_text
        return Text("FIRST-ANSWER-42" if "first" in last else "ANOTHER-ANSWER")

    w.script(script)
    thread = ("--thread", "LOST")
    _ok(await w.agent("l1", "first prompt XYZZY-7", *thread))
    (sid1,) = _customs(w.log("l1"), "corral.session")
    (damaged,) = await _damage_sessions(w, "LOST")
    assert damaged == sid1["sessionId"]
    # damaged: answered in a new conversation, and said so
    out = await w.agent("l2", "second prompt", *thread)
    _ok(out)
    events = w.log("l2")
    assert _ndjson(out.stdout) == events
    reason = _lost_before_first_message(events, damaged)
    assert "ANOTHER-ANSWER" in _texts(events)
    history = "\n".join(w.server.model_requests[-1].texts)
    assert "XYZZY-7" not in history, history  # it is a new conversation indeed
    (sid2,) = [s["sessionId"] for s in _customs(events, "corral.session")]
    assert sid2 != damaged
    rec = w.record("l2")
    assert rec["status"] == "completed"
    (warning,) = rec["warnings"]
    assert warning["code"] == "session_lost" and warning["expected"] == damaged, warning
    assert reason in warning["message"]
    shown = await w.acorral("show", "l2")
    _ok(shown)
    assert "started a new conversation" in shown.stdout and damaged in shown.stdout
    # gone from the store: the thread's history says which session it was in
    async with w.store() as store:
        await store.delete_sessions("LOST")
    text_args = [a for a in w.run_args("l3", *thread) if a != "--json"]
    out = await w.acorral(*text_args, "third prompt")
    _ok(out)
    warned = [line for line in out.stderr.splitlines() if "new conversation" in line]
    assert len(warned) == 1 and sid2 in warned[0], out.stderr
    assert "not in the store" in _lost_before_first_message(w.log("l3"), sid2)
    assert "ANOTHER-ANSWER" in out.stdout
    detail = json.loads((await w.acorral("threads", "show", "LOST", "--json")).stdout)
    marked = {r["run_id"]: bool(r.get("new_conversation")) for r in detail["runs"]}
    assert marked == {"l1": False, "l2": True, "l3": True}, marked
    # on_session_lost = "fail": one line naming the session, nothing asked of the model
    (sid3,) = [s["sessionId"] for s in _customs(w.log("l3"), "corral.session")]
    (damaged,) = await _damage_sessions(w, "LOST")
    assert damaged == sid3
    asked = len(w.server.model_requests)
    out = await w.agent("l4", "fourth prompt", *thread, "--on-session-lost", "fail")
    assert out.returncode != 0, out.stdout[-2000:]
    rec = w.record("l4")
    assert rec["status"] == "failed" and rec["error"]["code"] == "session_lost", rec
    message = rec["error"]["message"]
    assert damaged in message and "\n" not in message, message
    assert len(w.server.model_requests) == asked, "the model was asked"
    assert not _customs(w.log("l4"), "corral.session_lost")  # failed, not continued


@HARNESS_KIT.add
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


@HARNESS_KIT.add
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


@HARNESS_KIT.add
async def check_egress_allowlist(w: HarnessWorld) -> None:
    """``allow_hosts``: a command reaches an allowed host through corral's egress proxy,
    another host gets the proxy's refusal, and there is no way around the proxy."""
    host = "127.0.0.2"  # host loopback, not the sandbox's own 127.0.0.1
    a, b = LoopbackHello(host), LoopbackHello(host)
    try:
        toml = (f'[policy]\ndefault = "allow"\nnetwork = "allow"\n'
                f'allow_hosts = ["{host}:{a.port}"]\n')
        ws = w.workspace("egress", toml=toml)
        fetch = (f"curl -s -m 5 http://{host}:{a.port}/; echo; curl -s -m 5 "
                 f"http://{host}:{b.port}/; echo; curl -s -m 3 --noproxy '*' "
                 f"http://{host}:{a.port}/ || echo direct-failed")
        w.script(_steps([fetch], "Fetched: "))
        # loopback hosts may be allowed only by a config the user names
        out = await w.agent("e1", "fetch both", "--workspace", str(ws), "--config",
                            str(ws / "corral.toml"))
        _ok(out)
        hits = (a.hits, b.hits)
    finally:
        a.stop()
        b.stop()
    events = w.log("e1")
    assert events[-1]["type"] == "RUN_FINISHED", events[-3:]
    (result,) = _results(events)
    assert f"hello from {a.port}" in result, result
    assert f"corral egress proxy: connections to {host}:{b.port} are not allowed" in result
    assert "direct-failed" in result  # the sandbox has no network of its own
    assert hits == (1, 0)
    assert any("/egress-" in s for s in w.record("e1")["spec"]["agent"]["sockets"])


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


@HARNESS_KIT.add
async def check_cancel(w: HarnessWorld) -> None:
    """``corral cancel`` of a detached run whose tool is running: the run is aborted with
    RUN_ERROR last, and the agent, its tool's processes and the run's model proxy
    daemon all stop. Under the case's :attr:`~HarnessCase.extra_ask` rules (a policy
    corral decides live) a ``corral attach`` drives the detached run meanwhile: each
    command waits for a driver to serve the run's permission check."""
    marker = f"corral-kit-cancel-{secrets.token_hex(4)}"
    # the tool's shell keeps the marker in its command line (not a long sleep: Claude Code
    # refuses those)
    w.script(_steps([f"tail -f /dev/null # {marker}"], "Woke: "))
    _ok(await w.acorral(*w.run_args("c1", "--detach"), "wait a while"))
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
    _ok(await w.acorral("cancel", "c1", timeout=60))
    assert w.record("c1")["status"] == "aborted"
    events = w.log("c1")
    assert events[-1]["type"] == "RUN_ERROR", events[-3:]
    _every_call_has_one_result(events)  # the cut-short call too
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


@HARNESS_KIT.add
async def check_sigkill_then_attach(w: HarnessWorld) -> None:
    """The driving process is SIGKILLed mid-run (between a tool result and the next model
    call): the agent goes on without a driver, and ``corral attach`` then prints the whole
    log once, which equals both the journal translated afresh (no lost or repeated event)
    and an uninterrupted run of the same script (ids and timings aside)."""
    prompt = "run the two steps"
    gate = Gate()
    gate.open.set()
    w.script(gate)
    _ok(await w.agent("ref", prompt))
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
    _ok(att)
    log = w.log("k1")
    assert _ndjson(att.stdout) == log  # attach printed it all, once
    assert log == await w.retranslated("k1", prompt)  # no duplicate, no gap
    assert w.normalized(log, "k1") == w.normalized(reference, "ref")
    assert "step-one\nstep-two" in _texts(log).split("Finished: ", 1)[1]
    rec = w.record("k1")
    assert rec["status"] == "completed"
    assert rec["usage"]["requests"] == w.record("ref")["usage"]["requests"]


async def check_harness(make_case: Factory, *, only: Iterable[str] | None = None
                        ) -> KitReport:
    """Run the harness kit (a fresh world per check) for the :class:`HarnessCase` that
    ``make_case`` makes; raise :class:`~corral.testing.KitFailed` naming every failed
    check, else return the report."""
    return await HARNESS_KIT.verify(make_case, only=only)

