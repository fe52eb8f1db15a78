"""Harness kit, the agent's commands: the tool loop through the sandbox, the model key kept
out of it, the command policy's ``deny`` and ``ask`` rules, and the egress allowlist."""

from __future__ import annotations

import json

import anyio

from corral.agents._services import PROXY_TOKEN_NAME
from corral.testing._harness_world import HarnessWorld, world
from corral.testing._hello import LoopbackHello
from corral.testing._kit import Kit
from corral.testing._leaks import assert_no_secrets
from corral.testing._model_script import Text, ToolCall
from corral.tools._approvals import APPROVAL_RESOLVED_EVENT, answer_approval
from corral.testing._harness_events import (
    approval_request, customs, every_call_has_one_result, logged_events, ndjson_events, ok,
    refused, results, steps, texts,
)

__all__ = ["COMMAND_CHECKS"]

EDIT = "printf 'edited by the agent\\n' > note.txt && cat note.txt"
TOOL_EVENTS = ("TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT")

COMMAND_CHECKS: Kit[HarnessWorld] = Kit("harness", subject=world)
"""This part's checks, in the order written (:data:`~corral.testing.HARNESS_KIT` joins the
parts)."""


@COMMAND_CHECKS.add
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
    ok(out)
    events = w.log("rt1")
    assert ndjson_events(out.stdout) == events
    kinds = [e["type"] for e in events]
    assert kinds[0] == "RUN_STARTED" and kinds[-1] == "RUN_FINISHED", kinds
    for kind in TOOL_EVENTS:
        assert kinds.count(kind) == 1, (kind, kinds)
    assert [kinds.index(k) for k in TOOL_EVENTS] == sorted(kinds.index(k) for k in TOOL_EVENTS)
    every_call_has_one_result(events)
    (result,) = results(events)
    assert "edited by the agent" in result  # the tool ran in the workspace copy
    final = texts(events).split("All done:", 1)
    assert len(final) == 2 and "edited by the agent" in final[1]  # the model saw it
    files = [(f["type"], f["path"]) for f in customs(events, "sandbox.file")]
    assert files == [("change", "note.txt")], files
    (patch,) = [d["diff"] for d in customs(events, "sandbox.file.diff")]
    assert "-original" in patch and "+edited by the agent" in patch
    rec = w.record("rt1")
    assert rec["status"] == "completed" and rec["harness"] == w.case.harness
    reqs = w.server.model_requests
    assert rec["usage"]["requests"] == len(reqs) >= 2
    assert (rec["usage"]["input_tokens"], rec["usage"]["output_tokens"]) == (
        100 * len(reqs), 20 * len(reqs))
    assert all(r.api_key == w.key for r in reqs)
    assert w.key not in out.stdout + out.stderr


@COMMAND_CHECKS.add
async def check_key_never_inside(w: HarnessWorld) -> None:
    """The model key stays on the host: a command in the sandbox finds it in no process's
    environment and no file (the CLI holds the run's token), and nothing corral wrote (store,
    journal, events, saved session, sandbox files) holds it, while the upstream got it on
    every request."""
    probe = ("env; echo ---; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -i key; "
             "echo ---; timeout 60 grep -rIl --exclude-dir=proc --exclude-dir=sys "
             "--exclude-dir=dev --exclude-dir=usr --exclude-dir=opt -e '"
             + w.key_pattern + "' / 2>/dev/null; echo grep-exit=$?")
    w.script(steps([probe], "Probe output: "))
    out = await w.agent("k1", "print your environment")
    ok(out)
    events = w.log("k1")
    assert events[-1]["type"] == "RUN_FINISHED", events[-3:]
    (found,) = results(events)
    # the probe really ran: the environment was printed and the grep listed no file
    # (exit 1: nothing found; 2: nothing found, some files unreadable)
    # the CLI's key is the run's token, which the run's log redacts
    assert "PATH=" in found and f"[REDACTED:{PROXY_TOKEN_NAME}]" in found, found
    assert found.rsplit("---\n", 1)[1].strip() in ("grep-exit=1", "grep-exit=2"), found
    assert w.key not in json.dumps(events) + out.stdout + out.stderr
    assert_no_secrets([w.home, w.files], {"MODEL_KEY": w.key})
    reqs = w.server.model_requests
    assert reqs and all(r.api_key == w.key for r in reqs)


@COMMAND_CHECKS.add
async def check_denied_command(w: HarnessWorld) -> None:
    """A command a ``deny`` rule names never runs (the model is told, the run goes on);
    a harness that cannot enforce deny rules refuses the policy at definition time."""
    toml = '[policy]\ndefault = "allow"\ndeny = ["rm *"]\n'
    if "deny" not in w.case.enforces:
        await refused(w, "deny", toml)
        return
    ws = w.workspace("deny", {"precious": "keep me\n"}, toml)
    w.script(steps(["rm -f precious", "cat precious"], "After: "))
    out = await w.agent("d1", "clean up", "--workspace", str(ws))
    ok(out)
    events = w.log("d1")
    assert events[-1]["type"] == "RUN_FINISHED", events[-3:]
    every_call_has_one_result(events)
    # what the model saw after each step (a CLI may log no tool call for a command its
    # hook refused: codex); the conversation's last turn carries every result (not the
    # last request: the Claude ACP adapter may ask for the session's title after it)
    seen = max(w.server.model_requests, key=lambda r: len(r.tool_results)).tool_results
    assert len(seen) == 2, seen
    assert "keep me" in seen[1], seen  # the rm never ran
    assert any("keep me" in r for r in results(events))
    assert w.record("d1")["spec"]["policy"]["deny"] == ["rm *"]
    # the refusal is in the events whatever the CLI logs of it: corral's check logs it (a
    # CLI enforcing the rule itself, like opencode's own permissions, shows it in the
    # call's result)
    denied = customs(events, "corral.policy_denied")
    refused_call = [e for e in events if e["type"] == "TOOL_CALL_ARGS"
                    and "rm -f precious" in e["delta"]]
    assert [(d["tool"], d["rule"]) for d in denied] == [("Bash", "deny: rm *")] or (
        not denied and refused_call), (denied, refused_call)


@COMMAND_CHECKS.add
async def check_approval(w: HarnessWorld) -> None:
    """A command an ``ask`` rule names waits for a corral approval: allowed, it runs;
    denied, it does not (the model is told); a harness that cannot hold a command for an
    approval refuses the policy at definition time."""
    toml = '[policy]\ndefault = "allow"\nask = ["touch *"]\n'
    if "ask" not in w.case.enforces:
        await refused(w, "ask", toml)
        return
    ws = w.workspace("ask", toml=toml)
    w.script(steps(["touch allowed-file", "touch denied-file", "ls"], "Listed: "))
    proc = w.popen(*w.run_args("a1", "--workspace", str(ws)), "make two files")
    try:
        async with w.store() as store:
            def ended() -> bool:
                return proc.poll() is not None

            allow = await approval_request(store, "a1", 0, ended, w.case.deadline)
            assert "touch allowed-file" in json.dumps(allow["args"]), allow
            assert results(await logged_events(store, "a1")) == []  # held until answered
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
    assert [r["decision"] for r in customs(events, APPROVAL_RESOLVED_EVENT)] == \
        ["allow", "deny"]
    every_call_has_one_result(events)
    listing = results(events)[-1]
    assert "allowed-file" in listing and "denied-file" not in listing, listing


@COMMAND_CHECKS.add
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
        w.script(steps([fetch], "Fetched: "))
        # loopback hosts may be allowed only by a config the user names
        out = await w.agent("e1", "fetch both", "--workspace", str(ws), "--config",
                            str(ws / "corral.toml"))
        ok(out)
        hits = (a.hits, b.hits)
    finally:
        a.stop()
        b.stop()
    events = w.log("e1")
    assert events[-1]["type"] == "RUN_FINISHED", events[-3:]
    (result,) = results(events)
    assert f"hello from {a.port}" in result, result
    assert f"corral egress proxy: connections to {host}:{b.port} are not allowed" in result
    assert "direct-failed" in result  # the sandbox has no network of its own
    assert hits == (1, 0)
    assert any("/egress-" in s for s in w.record("e1")["spec"]["agent"]["sockets"])
