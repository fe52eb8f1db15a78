"""`--harness opencode` under a policy with ask rules: `opencode run` has no approval
channel, so corral runs the same opencode as `opencode acp` under its ACP bridge, and
corral's policy answers every command (allow, deny, ask → a corral approval). The real
opencode (opencode-ai, pinned) in bubblewrap against the scripted model server; the user
only ever says `--harness opencode`. (The harness kit's `opencode-ask` case runs every
kit check this way: resume, usage, cancel, SIGKILL then attach, structured output.)"""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from corral.agents._installs import InstalledAgent
from corral.testing import wait_until
from corral.testing._model_script import ModelRequest, Reply, Text, ToolCall
from corral.tools._approvals import APPROVAL_REQUEST_EVENT, APPROVAL_RESOLVED_EVENT

from tests.helpers import trusted

from .test_acp import approve_when_asked, customs, opencode_install, results  # noqa: F401
from .test_runner_agents import (  # noqa: F401 - the corral fixture
    Corral,
    corral,
    ndjson,
    texts,
)

pytestmark = [pytest.mark.timeout(300)]

OPENCODE = ["--harness", "opencode", "--model", "anthropic/claude-fake"]


def oc_run(c: Corral, run_id: str, prompt: str, *extra: str) -> Any:
    return c.run("run", *OPENCODE, "--run-id", run_id, "--json", *extra, prompt)


def hostile_workspace(tmp_path: Path, name: str, policy: str) -> Path:
    """A workspace whose corral.toml (trusted with --config) has ``policy``, and whose own
    opencode configuration allows every command: it must change nothing."""
    ws = tmp_path / name
    ws.mkdir()
    (ws / "corral.toml").write_text(f'id = "{name}"\n[policy]\n{policy}\n')
    loosen = {"permission": {"bash": "allow", "edit": "allow", "webfetch": "allow"}}
    (ws / "opencode.json").write_text(json.dumps(loosen))
    (ws / ".opencode").mkdir()
    (ws / ".opencode" / "opencode.json").write_text(json.dumps(loosen))
    return ws


def steps(*commands: str) -> Any:
    """One shell command per model turn, then a text with every result."""
    def script(req: ModelRequest) -> Reply:
        if not req.tools:
            return Text("a title")  # opencode's tool-less title request
        done = len(req.tool_results)
        if done < len(commands):
            return ToolCall(commands[done], text=f"Step {done + 1}.")
        return Text("after: " + "\n".join(req.tool_results))
    return script


def sessions(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return customs(events, "corral.session")


def test_allowed_and_denied_commands_under_ask_rules(
        opencode_install: InstalledAgent, corral: Corral, tmp_path: Path) -> None:  # noqa: F811
    """Allow and deny rules hold while ask rules route the run: an allowed command runs, a
    denied one never does (the model is told, the turn goes on), whatever the repository's
    opencode.json says, and nothing waits for an approval."""
    ws = hostile_workspace(tmp_path, "ad", 'default = "deny"\nallow = ["echo *", "cat *"]\n'
                           'deny = ["rm *"]\nask = ["git push *"]')
    (ws / "precious").write_text("keep me")
    corral.srv.script = steps("echo allowed-ran", "rm -f precious", "cat precious")
    out = oc_run(corral, "ad1", "clean up", "--workspace", str(ws), *trusted(ws))
    assert out.returncode == 0, out.stderr[-3000:]
    events = corral.log("ad1")
    assert events[-1]["type"] == "RUN_FINISHED", events[-3:]
    allowed, denied, shown = results(events)
    assert "allowed-ran" in allowed, allowed
    assert denied.startswith("denied: denied by corral policy") and "rm *" in denied, denied
    assert "keep me" in shown, shown  # the rm never ran
    assert "after:" in texts(events)
    # the result is the turn's last message, as `opencode run` gives it; the record's
    # usage is the model proxy's, every model call of the run
    assert events[-1]["result"]["text"].startswith("after: "), events[-1]
    assert corral.raw_record("ad1")["usage"]["requests"] == len(corral.srv.model_requests)
    assert customs(events, APPROVAL_REQUEST_EVENT) == []
    rec = corral.raw_record("ad1")
    assert rec["harness"] == "opencode" and rec["spec"]["permission_prompt"] is True
    (session,) = sessions(events)
    assert set(session) == {"harness", "sessionId"} and session["harness"] == "opencode"
    assert session["sessionId"].startswith("ses_")


@pytest.mark.parametrize("allow", [True, False], ids=["approved", "denied"])
def test_an_ask_rule_waits_for_a_corral_approval(
        opencode_install: InstalledAgent, corral: Corral, tmp_path: Path,  # noqa: F811
        allow: bool) -> None:
    """A command an ask rule names is held until `corral approve`: approved, it runs;
    denied, it does not, and the model is told and goes on."""
    ws = hostile_workspace(tmp_path, "ask", 'default = "deny"\nask = ["echo *"]')
    corral.srv.script = steps("echo approved-ran")
    proc = corral.popen("run", *OPENCODE, "--run-id", "q1", "--json", "--workspace",
                        str(ws), *trusted(ws), "say it")
    try:
        asked = approve_when_asked(corral, "q1", allow)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    assert "echo approved-ran" in json.dumps(asked["args"]), asked
    events = corral.log("q1")
    assert events[-1]["type"] == "RUN_FINISHED", events[-3:]
    assert [r["decision"] for r in customs(events, APPROVAL_RESOLVED_EVENT)] == \
        ["allow" if allow else "deny"]
    (result,) = results(events)
    if allow:
        assert "approved-ran" in result, result
    else:
        assert result.startswith("denied: ") and "approved-ran" not in result, result
    assert "after:" in texts(events)  # the model saw the result either way
    assert corral.raw_record("q1")["harness"] == "opencode"


def test_the_driver_is_killed_while_an_approval_is_pending(
        opencode_install: InstalledAgent, corral: Corral, tmp_path: Path) -> None:  # noqa: F811
    """SIGKILL of the driving `corral run` while the ask rule's approval is pending: the
    bridge and opencode go on under the supervisor, the approval is answered with no
    driver, and `corral attach` serves the run again and sees it to its end, printing the
    whole log once."""
    ws = hostile_workspace(tmp_path, "kill", 'default = "deny"\nask = ["echo *"]')
    corral.srv.script = steps("echo approved-ran")
    proc = corral.popen("run", *OPENCODE, "--run-id", "k1", "--json", "--workspace",
                        str(ws), *trusted(ws), "say it")
    try:
        found: list[dict[str, Any]] = []

        def asked() -> bool:
            try:
                found[:] = customs(corral.log("k1"), APPROVAL_REQUEST_EVENT)
            except sqlite3.OperationalError:  # the store is not made yet
                return False
            return bool(found)

        wait_until(asked, "the approval request", timeout=90)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert corral.raw_record("k1")["status"] == "running"
    out = corral.run("approve", "k1", found[0]["approvalId"], "--allow")
    assert out.returncode == 0, out.stderr
    att = corral.run("attach", "k1", "--json")
    assert att.returncode == 0, att.stderr[-3000:]
    log = corral.log("k1")
    assert [p["event"] for p in ndjson(att.stdout)] == log
    assert log[-1]["type"] == "RUN_FINISHED", log[-3:]
    (result,) = results(log)
    assert "approved-ran" in result, result
    assert len(customs(log, APPROVAL_REQUEST_EVENT)) == 1
    assert corral.raw_record("k1")["harness"] == "opencode"


def test_a_thread_goes_on_across_opencode_run_and_opencode_acp(
        opencode_install: InstalledAgent, corral: Corral, tmp_path: Path) -> None:  # noqa: F811
    """A thread's turns switch between `opencode run` (no ask rules) and `opencode acp`
    (ask rules) as its policy changes: each turn, in a fresh sandbox, continues the one
    opencode session saved for the thread (restored into the other mode's sandbox), with the
    whole history."""
    def script(req: ModelRequest) -> Reply:
        if not req.tools:
            return Text("a title")
        last = req.last_user_text
        return Text("THIRD-ANSWER" if "third" in last else
                    "SECOND-ANSWER" if "second" in last else "FIRST-ANSWER-42")

    corral.srv.script = script
    plain = tmp_path / "plain"
    plain.mkdir()
    asks = hostile_workspace(tmp_path, "asks", 'default = "allow"\nask = ["git push *"]')
    turns = [("t1", "first prompt XYZZY-7", plain), ("t2", "second prompt", asks),
             ("t3", "third prompt", plain)]
    for run_id, prompt, ws in turns:
        extra = list(trusted(ws)) if (ws / "corral.toml").exists() else []
        out = oc_run(corral, run_id, prompt, "--thread", "T", "--workspace", str(ws), *extra)
        assert out.returncode == 0, out.stderr[-3000:]
        assert corral.log(run_id)[-1]["type"] == "RUN_FINISHED"
    assert [corral.raw_record(r)["spec"].get("permission_prompt", False)
            for r, _p, _w in turns] == [False, True, False]
    history = "\n".join(corral.srv.model_requests[-1].texts)
    for said in ("first prompt XYZZY-7", "FIRST-ANSWER-42", "second prompt", "SECOND-ANSWER",
                 "third prompt"):
        assert said in history, (said, history)
    ids = [s["sessionId"] for r, _p, _w in turns for s in sessions(corral.log(r))]
    assert len(ids) == 3 and len(set(ids)) == 1, ids  # one opencode session throughout
    box = [corral.raw_record(r)["sandbox_ref"]["id"] for r, _p, _w in turns]
    assert box[1] not in (box[0], box[2])  # the session was restored into other sandboxes


def test_ask_rules_on_docker_are_refused_in_one_line(
        opencode_install: InstalledAgent, corral: Corral, tmp_path: Path) -> None:  # noqa: F811
    """The docker provider runs the supervisor in the container, where corral's ACP bridge
    cannot be: ask rules for opencode there are refused before anything is recorded."""
    ws = hostile_workspace(tmp_path, "dk", 'default = "allow"\nask = ["git push *"]')
    out = corral.run("run", "--provider", "docker", *OPENCODE, "--run-id", "dk1",
                     "--workspace", str(ws), *trusted(ws), "hello")
    assert out.returncode == 2, out.stderr[-3000:]
    (line,) = out.stderr.strip().splitlines()
    assert "--harness opencode with this policy" in line and "ACP bridge" in line, line
    assert "allow/deny rules only" in line and "Traceback" not in out.stderr
    assert corral.srv.model_requests == []
    listed = corral.run("ls", "--json")
    assert listed.returncode == 0 and "dk1" not in listed.stdout, listed.stdout
