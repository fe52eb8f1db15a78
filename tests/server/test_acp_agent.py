"""``corral acp`` driven by the official ACP client library (``@agentclientprotocol/sdk``
from npm, tests/server/acp/acp_session.mjs): a prompt becomes a run whose output streams as
session updates; a permission request raised by the run (an ``ask`` approval in the store)
reaches the editor, whose answer decides it; the editor disconnecting mid-run detaches the
run; a new ``corral acp`` reopens the session with ``session/load``, replays it, follows
the run to its end, and the next prompt continues the thread."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.stores import open_store
from corral.testing._plugin import require
from corral.tools._approvals import Approvals
from tests.helpers import wait_until
from tests.server.conftest import Home

pytestmark = pytest.mark.timeout(240)

CLIENT = Path(__file__).resolve().parent / "acp"


@pytest.fixture
def acp_client(request: pytest.FixtureRequest) -> Path:
    """tests/server/acp with its pinned ``@agentclientprotocol/sdk`` installed (``npm ci``
    once when missing)."""
    require(request.config, shutil.which("node") is not None, "node", "apt-get install nodejs")
    if not (CLIENT / "node_modules" / "@agentclientprotocol" / "sdk").is_dir():
        npm = shutil.which("npm")
        require(request.config, npm is not None, "npm", "apt-get install npm")
        assert npm is not None
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=CLIENT, check=True,
                       capture_output=True, timeout=300)
    return CLIENT


class Editor:
    """One run of the client script: its JSON lines as they come."""

    def __init__(self, client: Path, plan: dict[str, Any]) -> None:
        self.proc = subprocess.Popen(["node", str(client / "acp_session.mjs"), json.dumps(plan)],
                                     cwd=client, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: list[dict[str, Any]] = []
        self.err: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._drain, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(json.loads(line))

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        self.err.extend(self.proc.stderr)

    def kinds(self, kind: str) -> list[dict[str, Any]]:
        return [x for x in list(self.lines) if x["kind"] == kind]

    def text(self, kind: str = "agent_message_chunk") -> str:
        return "".join(x["update"]["content"]["text"] for x in self.kinds("update")
                       if x["update"]["sessionUpdate"] == kind)

    def wait(self, timeout: float = 120) -> None:
        try:
            self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        wait_until(lambda: bool(self.kinds("closed")) or self.proc.returncode != 0,
                   "the client's last line", timeout=10)
        assert self.proc.returncode == 0, (self.lines[-5:], "".join(self.err)[-3000:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def editors(home: Home) -> Iterator[list[Editor]]:
    """The editors a test starts (killed at its end), and the sandboxes its sessions kept
    (a session's thread keeps its sandbox between prompts): removed at its end."""
    started: list[Editor] = []
    yield started
    for editor in started:
        editor.stop()
    listed = home.cli("sandboxes", "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    for sandbox in json.loads(listed.stdout):
        if sandbox["this_store"]:
            home.cli("sandboxes", "rm", "--force", sandbox["id"])


def ask_in_thread(home: Path, run_id: str, out: dict[str, Any]) -> None:
    """An ``ask`` approval of the run held as its driver's gate holds one: the request in
    the store, waiting for whoever answers it there."""

    async def main() -> None:
        store = await open_store(f"sqlite://{home / 'corral.db'}")
        try:
            gate = Approvals(store, run_id, timeout=60)
            out["decision"] = await gate.request("Bash", {"tool_name": "Bash",
                                                          "input": {"command": "git push"}},
                                                 call_id="toolu_push")
        finally:
            await store.aclose()

    anyio.run(main)


def runs_of(home: Home, thread: str) -> list[dict[str, Any]]:
    out = home.cli("ls", "--thread", thread, "--json")
    assert out.returncode == 0, out.stderr
    runs: list[dict[str, Any]] = json.loads(out.stdout)
    return runs


TICKS = 60


def test_prompt_permission_disconnect_and_load(home: Home, acp_client: Path, tmp_path: Path,
                                               editors: list[Editor]) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("from the project\n")
    cmd = [sys.executable, "-m", "corral", "acp", "--harness", "command"]
    ticks = (f"cat notes.txt; i=0; while [ $i -lt {TICKS} ]; do echo tick $i; "
             "i=$((i+1)); sleep 0.1; done")
    first = Editor(acp_client, {"cmd": cmd, "env": home.env, "cwd": str(project),
                                "prompt": ticks, "disconnectOn": "tick 12\n",
                                "permission": "allow"})
    editors.append(first)
    wait_until(lambda: bool(first.kinds("session")) and "tick 1\n" in first.text(),
               "the run's first output in the editor", timeout=120)
    session_id = first.kinds("session")[0]["sessionId"]
    (run,) = runs_of(home, session_id)
    assert run["status"] == "running"

    # corral's ask: the editor is asked, and its answer decides
    held: dict[str, Any] = {}
    asker = threading.Thread(target=ask_in_thread, args=(home.path, run["run_id"], held),
                             daemon=True)
    asker.start()
    wait_until(lambda: "decision" in held, "the editor's answer to the approval", timeout=60)
    assert held["decision"] is None  # allowed
    (permission,) = first.kinds("permission")
    assert permission["params"]["sessionId"] == session_id
    assert permission["params"]["toolCall"]["toolCallId"] == "toolu_push"
    assert permission["params"]["toolCall"]["title"] == "git push"

    # the editor goes away mid-run: corral acp exits, the run goes on detached
    first.wait()
    assert first.kinds("closed")[0]["how"] == "disconnected"
    assert not first.kinds("stop")
    (run,) = runs_of(home, session_id)
    assert run["status"] == "running", run
    assert home.raw(run["run_id"]).get("detached_since") is not None

    # reopened: the session's history, then the rest of the run as it happens, then a
    # prompt that continues the thread (its sandbox kept the workspace)
    second = Editor(acp_client, {"cmd": cmd, "env": home.env, "cwd": str(project),
                                 "load": session_id, "until": f"tick {TICKS - 1}\n",
                                 "then": "echo again; cat notes.txt"})
    editors.append(second)
    second.wait(180)
    said = second.text()
    assert said.startswith("from the project\ntick 0\n")
    assert "".join(f"tick {i}\n" for i in range(TICKS)) in said  # nothing lost or repeated
    assert said.endswith("again\nfrom the project\n")
    assert second.text("user_message_chunk") == ticks  # the replayed prompt
    assert [s["stopReason"] for s in second.kinds("stop")] == ["end_turn"]
    runs = runs_of(home, session_id)
    assert sorted(r["status"] for r in runs) == ["completed", "completed"]
    assert home.log(run["run_id"])[-1]["type"] == "RUN_FINISHED"


def test_cancel_ends_the_turn_cancelled(home: Home, acp_client: Path, tmp_path: Path,
                                        editors: list[Editor]) -> None:
    """session/cancel ends the prompt's run (aborted) and the turn says ``cancelled``; a run
    cancelled elsewhere while the editor was away leaves a session that session/resume
    reopens (no replay) and that takes the next prompt."""
    cmd = [sys.executable, "-m", "corral", "acp", "--harness", "command"]
    first = Editor(acp_client, {"cmd": cmd, "env": home.env, "cwd": str(tmp_path),
                                "prompt": "echo started; sleep 600", "cancelOn": "started"})
    editors.append(first)
    first.wait()
    assert [s["stopReason"] for s in first.kinds("stop")] == ["cancelled"]
    session_id = first.kinds("session")[0]["sessionId"]
    (run,) = runs_of(home, session_id)
    assert run["status"] == "aborted"

    away = Editor(acp_client, {"cmd": cmd, "env": home.env, "cwd": str(tmp_path),
                               "load": session_id, "resume": True,
                               "prompt": "echo second; sleep 600", "disconnectOn": "second"})
    editors.append(away)
    away.wait()
    running = [r for r in runs_of(home, session_id) if r["status"] == "running"]
    assert len(running) == 1
    out = home.cli("cancel", running[0]["run_id"])
    assert out.returncode == 0, out.stderr

    back = Editor(acp_client, {"cmd": cmd, "env": home.env, "cwd": str(tmp_path),
                               "load": session_id, "resume": True, "then": "echo fresh"})
    editors.append(back)
    back.wait()
    assert back.text() == "fresh\n"  # resume: no replay
    assert [s["stopReason"] for s in back.kinds("stop")] == ["end_turn"]
