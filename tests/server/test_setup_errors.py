"""Setup problems of the server's machine are the operator's, not bugs (issue #31, item 2):
an agent CLI that is not installed or a model key that is not set answers 503 with its own
code on ``POST /v1/runs`` and ``/v1/agui``, logged at WARNING (never ERROR), and
``GET /v1/harnesses`` lists only what can start, the rest with the reason."""

from __future__ import annotations

import json
from pathlib import Path

from corral.agents._installs import KNOWN_AGENTS, MARKER
from corral.harness._packages import package_for

from .conftest import TOKEN, Home

PROMPT_ONLY = {"threadId": "t-a", "runId": "r-a", "tools": [], "context": [], "state": {},
               "messages": [{"id": "m", "role": "user", "content": "fix it"}],
               "forwardedProps": {"corral": {"harness": "claude-code"}}}


def _fake_install(root: Path, name: str) -> None:
    """An install ``find_installed`` accepts (its marker and CLI file), never run here."""
    version = package_for(name).version
    entry = root / name / version
    cli = entry / "node_modules" / ".bin" / KNOWN_AGENTS[name].bin
    cli.parent.mkdir(parents=True)
    cli.write_text("#!/bin/sh\nexit 1\n")
    (entry / MARKER).write_text(json.dumps({"name": name, "version": version,
                                            "package": KNOWN_AGENTS[name].package}))


def test_a_missing_agent_cli_is_503_harness_not_installed(home: Home, tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    agents.mkdir()
    with home.server(token=TOKEN, extra_env={"CORRAL_AGENTS_DIR": str(agents)}) as server, \
            server.client() as c:
        listed = c.get("/v1/harnesses").json()
        assert listed["harnesses"] == ["command"]
        assert listed["suggested_harness"] == "command"
        missing = {u["name"]: u for u in listed["unavailable"]}
        assert set(missing) == {"acp", "claude-code", "codex", "gemini-cli", "opencode"}
        assert missing["codex"]["code"] == "harness_not_installed"
        assert "corral agents install codex" in missing["codex"]["reason"]
        r = c.post("/v1/runs", json={"thread_id": "t", "prompt": "x", "harness": "codex"})
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "harness_not_installed"
        assert "corral agents install codex" in r.json()["error"]["message"]
        r = c.post("/v1/agui", json=PROMPT_ONLY)
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "harness_not_installed"
        assert c.get("/v1/runs", params={"thread_id": "t"}).json()["runs"] == []
    log = "".join(server.log)
    assert "WARNING" in log and "codex" in log
    assert " ERROR " not in log and "Traceback" not in log


def test_a_missing_model_key_is_503_model_key_missing(home: Home, tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    _fake_install(agents, "codex")
    env = {"CORRAL_AGENTS_DIR": str(agents), "OPENAI_API_KEY": ""}
    with home.server(token=TOKEN, extra_env=env) as server, server.client() as c:
        listed = c.get("/v1/harnesses").json()
        missing = {u["name"]: u for u in listed["unavailable"]}
        assert missing["codex"]["code"] == "model_key_missing"
        assert "OPENAI_API_KEY" in missing["codex"]["reason"]
        r = c.post("/v1/runs", json={"thread_id": "t", "prompt": "x", "harness": "codex"})
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "model_key_missing"
    assert "Traceback" not in "".join(server.log)


def test_a_startable_agent_is_listed_and_suggested(home: Home, tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    _fake_install(agents, "codex")
    env = {"CORRAL_AGENTS_DIR": str(agents), "OPENAI_API_KEY": "sk-test"}
    with home.server(token=TOKEN, extra_env=env) as server, server.client() as c:
        listed = c.get("/v1/harnesses").json()
    assert listed["harnesses"] == ["codex", "command"]
    assert listed["suggested_harness"] == "codex"
    assert listed["default_harness"] is None
