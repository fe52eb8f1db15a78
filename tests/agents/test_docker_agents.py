"""Agent CLIs on the docker provider with a local daemon: the real CLIs in a container,
their model calls through the host's model proxy over the unix socket bound in at
``/run/corral``, the CLI and ``node`` bound read-only, the supervisor inside the container.

The real key reaches the scripted upstream only: a root scan of the live container (every
process's environment and argv, its writable areas, the socket directory and the container's
configuration) finds none of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.journal._layout import encode_run_id
from corral.runs._sandbox_site import mirror_paths
from corral.runs._keep_services import is_services_daemon
from corral.runs._spec import RunSpec
from corral.providers._docker import DockerProvider, container_name
from corral.testing._harness_stops import Gate, kill_after_tool_result
from corral.testing._harness_world import normalized
from corral.testing._leaks import assert_no_secrets
from corral.testing._model_script import Text, ToolCall, shell_then_text

from .conftest import CLIS, REAL_KEY
from . import test_runner_agents
from .test_runner_agents import (
    TOOL_EVENTS,
    Corral,
    _remembering,
    model_args,
    ndjson,
    texts,
)
from tests.helpers import HelloServer, wait_until

# the fixtures, found by these names
corral = test_runner_agents.corral
two_hosts = test_runner_agents.two_hosts

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("need_docker", "agent_installs")]

EDIT = "printf 'edited by the agent\\n' > note.txt && cat note.txt && id -u"
# Run as root in the live container: any file or process environment holding the key.
SCAN = ("grep -rlaF \"$1\" /proc/[0-9]*/environ /proc/[0-9]*/cmdline /workspace "
        "/home/agent /tmp /run/corral 2>/dev/null; true")


def _sandbox_of(c: Corral, run_id: str) -> str:
    ref = c.raw_record(run_id)["sandbox_ref"]
    assert ref["provider"] == "docker", ref
    return str(ref["id"])


def _scan_container(sandbox_id: str) -> tuple[str, dict[str, Any]]:
    """The paths in the container holding the key (as root), and its inspect document."""
    api = DockerProvider().api
    name = container_name(sandbox_id)
    exec_id = api.exec_create(name, ["sh", "-c", SCAN, "scan", REAL_KEY], user="0:0")["Id"]
    found = api.exec_start(exec_id).decode(errors="replace")
    # the scan's own process holds the key in its argv: it must find exactly itself
    own = {line for line in found.splitlines() if line.startswith("/proc/")
           and line.endswith("/cmdline")}
    assert len(own) == 1, found  # none: the scan could not read /proc, and proves nothing
    rest = "\n".join(line for line in found.splitlines() if line not in own)
    return rest, api.inspect_container(name)


@pytest.mark.parametrize("cli", CLIS)
def test_an_agent_cli_on_docker_runs_a_tool_call_with_the_key_outside(
        cli: str, corral: Corral) -> None:
    gate = Gate()
    corral.srv.script = lambda req: (
        gate(req) if req.tool_results else ToolCall(EDIT, text="I'll edit the file."))
    proc = corral.popen("run", "--provider", "docker", "--harness", cli, *model_args(cli),
                        "--run-id", "d1", "--json", "please edit note.txt")
    assert proc.stdout is not None
    assert gate.waiting.wait(120), proc.communicate(timeout=30)[1][-3000:]
    # The agent is live (its second model call is held): scan the container as root.
    found, info = _scan_container(_sandbox_of(corral, "d1"))
    assert found.strip() == "", f"the real key is inside the container: {found}"
    assert REAL_KEY not in json.dumps(info)  # not in its configuration either
    _plant(_sandbox_of(corral, "d1"))  # the scan does find a copy
    assert _scan_container(_sandbox_of(corral, "d1"))[0].strip() == "/tmp/planted"
    mounts = {m["Destination"]: m for m in info["Mounts"]}
    assert mounts["/run/corral"]["RW"] is False and mounts["/opt/corral/agents"]["RW"] is False
    assert mounts["/opt/corral/node/bin/node"]["RW"] is False
    gate.open.set()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    events = [p["event"] for p in ndjson(out)]
    assert events == corral.log("d1")
    kinds = [e["type"] for e in events]
    assert kinds[0] == "RUN_STARTED" and kinds[-1] == "RUN_FINISHED"
    for kind in TOOL_EVENTS:
        assert kinds.count(kind) == 1, (kind, kinds)
    result = next(e for e in events if e["type"] == "TOOL_CALL_RESULT")
    # the Bash tool ran in the container, as the agent's uid
    assert "edited by the agent\n1000" in result["content"], result
    assert "edited by the agent" in texts(events).split("Finished:", 1)[1]
    rec = corral.raw_record("d1")
    assert rec["status"] == "completed" and rec["journal"].get("inside") is True
    assert rec["usage"]["requests"] == 2  # metered by the host's model proxy
    assert [r.api_key for r in corral.srv.model_requests] == [REAL_KEY, REAL_KEY]
    assert REAL_KEY not in out + err
    assert_no_secrets([corral.home], {"MODEL_KEY": REAL_KEY})


def _exec_root(sandbox_id: str, script: str, *args: str) -> None:
    api = DockerProvider().api
    exec_id = api.exec_create(container_name(sandbox_id), ["sh", "-c", script, "sh", *args],
                              user="0:0")["Id"]
    api.exec_start(exec_id)


def _plant(sandbox_id: str) -> None:
    _exec_root(sandbox_id, 'printf %s "$1" > /tmp/planted', REAL_KEY)


def test_the_agent_cannot_replace_the_host_sockets(corral: Corral) -> None:
    # The socket directory is a read-only bind: the agent can use the sockets, never swap
    # one for its own listener (which would see the next run's model traffic).
    sock = f"/run/corral/model-{hashlib.sha256(b'd2').hexdigest()[:12]}.sock"
    probe = (f"touch /run/corral/x 2>&1; rm -f {sock} 2>&1; mv {sock} /tmp/m 2>&1; "
             f"ls /run/corral 2>&1; test -S {sock} && echo still-there")
    corral.srv.script = lambda req: (
        Text("Done: " + "\n".join(req.tool_results).strip()) if req.tool_results
        else ToolCall(probe, text="Probing."))
    out = corral.run("run", "--provider", "docker", "--harness", "claude-code",
                     "--run-id", "d2", "--json", "probe the sockets")
    assert out.returncode == 0, out.stderr[-3000:]
    events = [p["event"] for p in ndjson(out.stdout)]
    result = next(e for e in events if e["type"] == "TOOL_CALL_RESULT")["content"]
    assert result.count("Read-only file system") == 3, result  # touch, rm, mv
    assert "cannot open directory '/run/corral': Permission denied" in result  # unlistable
    assert result.rstrip().endswith("still-there"), result
    assert corral.raw_record("d2")["usage"]["requests"] == 2  # the socket still served


def test_sigkill_of_the_driver_then_attach_on_docker(corral: Corral) -> None:
    gate = Gate()
    gate.open.set()
    corral.srv.script = gate
    ref = corral.run("run", "--provider", "docker", "--harness", "claude-code",
                     "--run-id", "ref", "--json", "run the two steps")
    assert ref.returncode == 0, ref.stderr[-3000:]
    reference = corral.log("ref")

    gate = Gate()
    corral.srv.script = gate
    proc = corral.popen("run", "--provider", "docker", "--harness", "claude-code",
                        "--run-id", "k1", "--json", "run the two steps")
    kill_after_tool_result(proc, gate)
    assert corral.raw_record("k1")["status"] == "running"
    # Nobody drives the run; the services daemon still answers the agent in the container.
    gate.open.set()
    sandbox_id = _sandbox_of(corral, "k1")
    wait_until(lambda: _exited(sandbox_id, "k1"), "the agent to finish without a driver",
               timeout=60)
    att = corral.run("attach", "k1", "--json")
    assert att.returncode == 0, att.stderr[-3000:]
    log = corral.log("k1")
    assert [p["event"] for p in ndjson(att.stdout)] == log  # attach printed it all, once
    assert normalized(log, "k1") == normalized(reference, "ref")  # no gap, no duplicate
    assert "step-one\nstep-two" in texts(log).split("Finished: ", 1)[1]
    rec = corral.raw_record("k1")
    assert rec["status"] == "completed"
    assert rec["usage"]["requests"] == 2  # metered by the daemon while nobody drove
    _assert_services_stop(rec)


def test_a_detached_run_finished_by_the_reaper_then_resumed(corral: Corral) -> None:
    corral.srv.script = _remembering("REAPED-ANSWER-9")
    out = corral.run("run", "--provider", "docker", "--harness", "claude-code",
                     "--run-id", "d3", "--thread", "TR", "--detach", "first prompt PLOVER-3")
    assert out.returncode == 0 and out.stdout.strip() == "d3", out.stderr[-3000:]
    sandbox_id = _sandbox_of(corral, "d3")
    wait_until(lambda: _exited(sandbox_id, "d3"), "the detached agent to finish", timeout=60)
    reaped = corral.run("reap", "--json")
    assert reaped.returncode == 0, reaped.stderr[-3000:]
    rec = corral.raw_record("d3")
    assert rec["status"] == "completed" and rec["usage"]["requests"] == 1
    assert corral.log("d3")[-1]["type"] == "RUN_FINISHED"
    _assert_services_stop(rec)  # the reaper's probe told this host's daemon
    second = corral.run("run", "--provider", "docker", "--harness", "claude-code",
                        "--run-id", "d4", "--thread", "TR", "--json", "second prompt")
    assert second.returncode == 0, second.stderr[-3000:]
    history = "\n".join(corral.srv.model_requests[-1].texts)
    assert "first prompt PLOVER-3" in history and "REAPED-ANSWER-9" in history


def _exited(sandbox_id: str, run_id: str) -> bool:
    async def status() -> Any:
        handle = await DockerProvider().resume(sandbox_id)
        assert handle is not None
        return await handle.supervisor_status(encode_run_id(run_id))

    return bool(anyio.run(status).get("state") == "exited")


def _assert_services_stop(rec: dict[str, Any]) -> None:
    pid = (RunSpec.parse(rec["spec"]).agent or {}).get("services_pid")
    assert isinstance(pid, int), rec["spec"]
    wait_until(lambda: not is_services_daemon(pid), "the services daemon to stop",
               timeout=30)


def test_a_dead_services_daemon_is_restarted_for_a_docker_run(corral: Corral) -> None:
    """The services daemon is SIGKILLed between the two model calls (the tool waits for the
    test's go-ahead): the driver starts another, watching this host's note of the agent's
    state, and the agent's next call goes through it."""
    corral.srv.script = lambda req: (
        Text("done: " + "\n".join(req.tool_results)) if req.tool_results
        else ToolCall("while [ ! -e /tmp/go ]; do sleep 0.05; done; echo released"))
    driver = corral.popen("run", "--provider", "docker", "--harness", "claude-code",
                          "--run-id", "sv1", "--json", "go")

    def services_pid() -> int | None:
        try:
            pid = (corral.raw_record("sv1")["spec"].get("agent") or {}).get("services_pid")
        except (TypeError, sqlite3.OperationalError):  # no store or no record yet
            return None
        return pid if isinstance(pid, int) else None

    usage = mirror_paths("sv1", corral.home / "journals").usage

    def first_call_counted() -> bool:  # answered in full, not only received
        try:
            return bool(json.loads(usage.read_text())["requests"] >= 1)
        except (OSError, ValueError, KeyError):
            return False

    wait_until(lambda: services_pid() is not None and first_call_counted(),
               "the first model call to be metered", timeout=60)
    first = services_pid()
    assert first is not None
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: services_pid() not in (None, first), "the daemon's restart",
               timeout=30)
    _exec_root(_sandbox_of(corral, "sv1"), "touch /tmp/go")
    out, err = driver.communicate(timeout=180)
    assert driver.returncode == 0, err[-3000:]
    rec = corral.raw_record("sv1")
    assert rec["status"] == "completed"
    assert len(corral.srv.model_requests) == 2
    assert rec["usage"]["requests"] == 2  # counted across the restart
    assert "released" in texts(corral.log("sv1"))
    _assert_services_stop(rec)


FETCH = ("import sys, urllib.request\n"
         "for url in sys.argv[1:]:\n"
         "    try:\n"
         "        print(urllib.request.urlopen(url, timeout=5).read().decode())\n"
         "    except Exception as exc:\n"
         "        print('refused:', getattr(exc, 'read', lambda: b'')().decode() or exc)\n"
         "try:  # no proxy: straight to the host\n"
         "    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))\n"
         "    print('direct:', direct.open(sys.argv[1], timeout=3).read().decode())\n"
         "except Exception:\n"
         "    print('direct-failed')\n")


def test_policy_allow_hosts_is_a_docker_runs_only_way_out(
        corral: Corral, tmp_path: Path,
        two_hosts: tuple[str, HelloServer, HelloServer]) -> None:
    host, a, b = two_hosts
    pa, pb = a.server_address[1], b.server_address[1]
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "fetch.py").write_text(FETCH)
    (ws / "corral.toml").write_text(
        f'id = "egress"\n[policy]\ndefault = "allow"\nnetwork = "allow"\n'
        f'allow_hosts = ["{host}:{pa}"]\n')
    corral.srv.script = shell_then_text(
        f"python3 fetch.py http://{host}:{pa}/ http://{host}:{pb}/", "Fetched: {output}")
    out = corral.run("run", "--provider", "docker", "--harness", "claude-code",
                     "--run-id", "e1", "--json", "--workspace", str(ws),
                     "--config", str(ws / "corral.toml"), "fetch both")
    assert out.returncode == 0, out.stderr[-3000:]
    events = corral.log("e1")
    results = [e["content"] for e in events if e["type"] == "TOOL_CALL_RESULT"]
    assert len(results) == 1, results
    # the allowed host answered through the host's egress proxy; the other was refused
    assert f"hello from {pa}" in results[0], results
    assert f"connections to {host}:{pb} are not allowed" in results[0], results
    assert "direct-failed" in results[0]  # the container has no network of its own
    assert (a.hits, b.hits) == (1, 0)  # type: ignore[attr-defined]
