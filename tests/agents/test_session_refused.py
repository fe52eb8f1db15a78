"""A saved session the agent CLI itself refuses (it looks whole to corral's check: one
readable JSON line, but no conversation in it). claude-code, codex and gemini-cli fail
loudly then: the run fails saying the saved session could not be resumed (code
``session_lost``), the refused session is not saved over, and the thread's next turn
does not give it to the CLI again: it answers in a new conversation and says so. The real
CLIs in bubblewrap against the scripted model server (the harness kit's world);
``check_session_lost`` in the kit covers damaged and missing sessions for every harness."""

from __future__ import annotations

import dataclasses
import shutil

import anyio
import pytest

from corral.agents._installs import install_agent
from corral.testing import HarnessCase
from corral.testing._harness_world import world
from corral.testing._model_script import ModelRequest, Reply, Text
from corral.testing._plugin import require

from .conftest import agent_cache

pytestmark = [pytest.mark.timeout(400), pytest.mark.usefixtures("bwrap")]

OPTIONS = {"claude-code": {"max_retries": 0},
           "codex": {"max_retries": 0, "model": "gpt-fake"},
           "gemini-cli": {"max_retries": 0, "model": "gemini-fake"}}
SAYS = {"claude-code": "No conversation found", "codex": "thread/resume failed",
        "gemini-cli": "Error resuming session"}


@pytest.mark.parametrize("cli", sorted(OPTIONS))
def test_a_refused_session_fails_the_turn_by_name_and_the_next_turn_starts_anew(
        cli: str, request: pytest.FixtureRequest) -> None:
    require(request.config, shutil.which("npm") is not None, "npm (Node.js)",
            "apt-get install nodejs npm")
    install_agent(cli, root=agent_cache())

    def script(req: ModelRequest) -> Reply:
        return Text("FIRST-ANSWER" if "first" in req.last_user_text else "LATER-ANSWER")

    async def go() -> None:
        case = HarnessCase(cli, options=OPTIONS[cli], agents_dir=str(agent_cache()))
        async with world(lambda: case) as w:
            w.script(script)
            thread = ("--thread", "T")
            out = await w.agent("r1", "first prompt XYZZY-7", *thread)
            assert out.returncode == 0, out.stderr[-2000:]
            async with w.store() as store:
                (info,) = await store.list_sessions("T")
                saved = await store.get_session("T", info.harness)
                assert saved is not None and saved.session_id
                sid = saved.session_id
                # every transcript line readable JSON, no conversation in it
                noise = {rel: b'{"type":"noise"}\n' for rel in saved.files}
                await store.put_session(dataclasses.replace(saved, files=noise))
            out = await w.agent("r2", "second prompt", *thread)
            assert out.returncode != 0
            rec = w.record("r2")
            assert rec["status"] == "failed" and rec["error"]["code"] == "session_lost", rec
            message = rec["error"]["message"]
            assert message.startswith(f"the saved {cli} session {sid} could not be resumed: ")
            assert SAYS[cli] in message and "\n" not in message and "\x1b" not in message
            async with w.store() as store:  # not saved over
                kept = await store.get_session("T", info.harness)
            assert kept is not None and kept.session_id == sid and kept.files == noise
            asked = len(w.server.model_requests)
            out = await w.agent("r3", "third prompt", *thread)
            assert out.returncode == 0, out.stderr[-2000:]
            events = w.log("r3")
            lost = [e["value"] for e in events
                    if e["type"] == "CUSTOM" and e["name"] == "corral.session_lost"]
            assert len(lost) == 1 and lost[0]["expected"] == sid, lost
            assert "refused it in the thread's last turn" in lost[0]["reason"]
            assert "LATER-ANSWER" in "".join(e["delta"] for e in events
                                             if e["type"] == "TEXT_MESSAGE_CONTENT")
            assert len(w.server.model_requests) > asked
            (warning,) = w.record("r3")["warnings"]
            assert warning["code"] == "session_lost" and warning["expected"] == sid

    anyio.run(go)
