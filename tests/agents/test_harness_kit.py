"""The harness conformance kit (``corral.testing.HARNESS_KIT``) for every agent CLI: the
real npm CLI in bubblewrap against the scripted model server on 127.0.0.1 speaking that
CLI's wire format (Anthropic Messages for claude-code and opencode, OpenAI Responses for
codex, Gemini streamGenerateContent for gemini-cli and acp-gemini). One test per check and
harness."""

from __future__ import annotations

import shutil

import pytest

from corral.agents._installs import InstalledAgent, install_agent
from corral.testing import HARNESS_KIT, HarnessCase, pytest_checks
from corral.testing._model_script import ModelRequest, Reply, Text
from corral.testing._plugin import require

from .conftest import CLIS, agent_cache

pytestmark = [pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def installed(request: pytest.FixtureRequest) -> dict[str, InstalledAgent]:
    """Every CLI the cases name, installed once into the agent cache."""
    require(request.config, shutil.which("npm") is not None, "npm (Node.js)",
            "apt-get install nodejs npm")
    root = agent_cache()
    root.mkdir(parents=True, exist_ok=True)
    return {name: install_agent(name, root=root) for name in (*CLIS, "opencode")}


def _title(req: ModelRequest) -> Reply | None:
    """opencode starts every run with a tool-less request for the session's title."""
    return Text("a title") if not req.tools else None


def _without_title(event: str) -> str:
    return "" if '"acp.session_info_update"' in event else event


def _case(harness: str, **kw: object) -> HarnessCase:
    return HarnessCase(harness, agents_dir=str(agent_cache()), **kw)  # type: ignore[arg-type]


# Retries off: a failing model must end a run at once. codex's default model uses a
# request shape (code-mode tools) the scripted server does not script; gemini-cli without a
# model first makes a routing call (test_gemini_cli covers it).
CASES = {
    "claude-code": lambda: _case("claude-code", options={"max_retries": 0}),
    "codex": lambda: _case("codex", options={"max_retries": 0, "model": "gpt-fake"}),
    # gemini-cli: a BeforeTool hook runs corral's command gate (deny and ask)
    "gemini-cli": lambda: _case("gemini-cli", options={"max_retries": 0,
                                                        "model": "gemini-fake"}),
    # opencode's permission config enforces deny; ask rules route it through `opencode
    # acp` (corral's policy answers each command): check_approval runs that way
    "opencode": lambda: _case("opencode", options={"model": "anthropic/claude-fake"},
                              side_reply=_title),
    # every check with an ask rule no command matches: `--harness opencode` routed through
    # `opencode acp` keeps every promise of the harness (resume, usage, cancel, takeover)
    "opencode-ask": lambda: _case("opencode", options={"model": "anthropic/claude-fake"},
                                  side_reply=_title, extra_ask=("corral-kit-never-run *",)),
    # `opencode acp` asks for every command; corral's policy answers (deny and ask)
    "acp-opencode": lambda: _case("acp", options={"agent": "opencode",
                                                  "model": "anthropic/claude-fake"},
                                  side_reply=_title),
    # ACP: the Claude adapter gates every Bash command through corral's command gate; it
    # sends the session's title (session_info_update) on its own schedule, sometimes after
    # the turn's end, when the agent is already stopping: not part of the comparison
    "acp-claude": lambda: _case("acp", options={"agent": "claude", "model": "claude-fake",
                                                "max_retries": 0},
                                normalize=_without_title),
    # ACP: gemini's policy engine asks about every shell command and edit (corral's policy
    # answers); shell output comes as text (no interactive shell); gemini checks a tool
    # call's arguments against its schema itself (an invalid result never reaches corral)
    "acp-gemini": lambda: _case("acp", options={"agent": "gemini", "model": "gemini-fake",
                                                "max_retries": 0},
                                checks_tool_args=True),
}

pytest_checks(HARNESS_KIT, CASES, globals(), usefixtures=("installed", "bwrap"))
