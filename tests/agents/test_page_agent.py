"""The web page with real Claude Code runs, in headless Chromium (tests/server/e2e/
page_agent.mjs): a thread shown as a conversation (prompts, messages, a shell tool call,
reasoning, a file's patch, usage and cost), a host tool's approval allowed after a reload
and another denied, hostile text through the prompt, the output and a tool's args shown as
text; corral mounted under a prefix (tests/agents/page_app.py), on a desktop and a phone."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.testing._model_script import ModelRequest, Reply, Text, ToolCall
from corral.testing._model_server import ModelServer
from tests.server.conftest import TOKEN, Home, uvicorn_server
from tests.server.test_page import drive_page

from .conftest import agent_cli_env

pytestmark = pytest.mark.timeout(420)

HOSTILE = "<img src=x onerror=window.pwned=1></script><script>window.pwned=1</script>"


def script(req: ModelRequest) -> Reply:
    """First run: a shell call writing a file, the host tool ``deploy`` (held for approval),
    an answer. Second run (its prompt asks "a second question"): ``deploy`` again, then
    what came of it."""
    results = req.tool_results
    if "mcp__corral__deploy" not in req.tools:
        return Text(f"NO HOST TOOL offered; tools: {req.tools}")
    if "second question" in req.last_user_text:
        if not results:
            return ToolCall("", tool="mcp__corral__deploy", args={"env": "staging"})
        return Text("Second answer: " + " ".join(results))
    if not results:
        return ToolCall(f"echo '{HOSTILE}' > notes.html && echo wrote",
                        text="Writing the notes.", reasoning="First the notes. " + HOSTILE)
    if len(results) == 1:
        return ToolCall("", tool="mcp__corral__deploy", args={"env": HOSTILE},
                        text="Now deploying.")
    return Text("Deployed. " + HOSTILE)


def test_page_shows_an_agent_thread_and_answers_its_approvals(
        agents_env: Path, bwrap: object, cli_env: dict[str, str], bwfiles: Path,
        corral_home: Path, model_server: ModelServer, page_driver: Path,
        screenshots: Path) -> None:
    model_server.script = script
    home = Home(corral_home)
    env = {**home.env, "CORRAL_STORE": f"sqlite:///{home.db}", "CORRAL_API_TOKEN": TOKEN}
    env.update({k: v for k, v in agent_cli_env(cli_env, bwfiles, model_server).items()
                if k.startswith(("CORRAL_AGENTS", "CORRAL_BWRAP", "ANTHROPIC_"))})
    with uvicorn_server("tests.agents.page_app:app", env, "/corral", TOKEN) as server:
        out = drive_page(page_driver / "page_agent.mjs", server.url, screenshots, server.log)

    first, second = out["first"], out["second"]
    log = home.log(first)
    assert "claude-code" in out["harnesses"] and "command" not in out["harnesses"]
    assert home.raw(first)["status"] == "completed" and out["runStatus"] == "completed"
    # the prompt is in the run's log (a fresh browser shows it too), once
    assert log[1] == {"type": "CUSTOM", "name": "corral.prompt",
                      "value": {"prompt": out["prompt"]}}
    assert sum(e.get("name") == "corral.prompt" for e in log) == 1
    # the conversation, in order: the prompt, then what the agent said, as text
    turn = out["firstTurn"]
    assert turn["prompt"] == out["prompt"]
    said = "".join(turn["said"])
    assert "Writing the notes." in said and said.endswith("Deployed. " + HOSTILE)
    # tool calls folded, with their arguments and results
    assert [t["name"] for t in turn["tools"]] == ["Bash", "deploy"]
    assert not any(t["open"] for t in turn["tools"])
    bash, deploy = turn["tools"]
    assert HOSTILE in bash["args"] and "wrote" in bash["result"]
    assert HOSTILE in deploy["args"] and f"deployed to {HOSTILE}" in deploy["result"]
    # reasoning folded
    assert [r["open"] for r in turn["reasoning"]] == [False]
    assert turn["reasoning"][0]["text"] == "First the notes. " + HOSTILE
    # the approval: shown with its args, answered (allow) after the reload, buttons gone
    (approval,) = turn["approvals"]
    assert approval["tool"] == "deploy" and HOSTILE in approval["args"]
    assert approval["answer"] == "allowed" and approval["buttons"] == 0
    # the file the shell wrote, with its patch
    (notes,) = [f for f in turn["files"] if f["path"] == "notes.html"]
    assert f"+{HOSTILE}" in notes["patch"]
    # usage and cost, from the run record
    usage = home.raw(first)["usage"]
    assert usage["requests"] >= 3
    assert f"{usage['input_tokens']:,} tokens in" in out["runUsage"]
    assert turn["usage"] == ""  # shown once: the selected run's usage is the header's line
    if usage.get("unpriced") and not usage.get("cost_by_model"):
        # the scripted model has no price: never shown as free
        assert "cost unknown (no price for " in out["runUsage"]
        assert "$" not in out["runUsage"]
    else:
        assert f"${usage['cost_usd']:.4f}" in out["runUsage"]
    # the reload happened while the run waited and resumed after what was shown
    assert 0 < out["shownBeforeReload"] <= out["resumedFrom"] < len(log)
    assert out["firstOffsets"] == list(range(1, len(log) + 1))
    assert out["firstStats"]["dupes"] == 0 and out["firstStats"]["gaps"] == 0
    assert out["firstStats"]["received"] == list(range(out["resumedFrom"] + 1, len(log) + 1))

    # the second run joins the thread after the first; its approval denied
    assert out["threadField"] == "agent-thread"
    assert out["turns"] == [first, second] and out["phoneTurns"] == [first, second]
    later = out["secondTurn"]
    assert later["prompt"] == out["secondPrompt"]
    (denied,) = later["approvals"]
    assert denied["answer"] == "denied" and denied["buttons"] == 0
    assert "denied by a human" in "".join(later["said"])
    assert out["secondStats"]["dupes"] == 0 and out["secondStats"]["gaps"] == 0
    # a fresh browser (a phone) shows the same conversation from the server alone
    phone = out["phoneFirstTurn"]
    assert phone["prompt"] == out["prompt"] and phone["said"] == turn["said"]
    assert [t["name"] for t in phone["tools"]] == ["Bash", "deploy"]

    # hostile text made no element and ran nothing; controls labelled; no sideways scroll
    for seen in (out["hostile"], out["phoneHostile"]):
        assert seen == {"images": 0, "scripts": 0, "pwned": False}
    for layout in (out["desktop"], out["phone"]):
        assert layout["unnamed"] == [] and layout["scrollWidth"] <= layout["width"], layout
    assert [e for e in out["consoleErrors"] + out["phoneConsoleErrors"] if "401" not in e] == []
    for name in ("agent-approval", "agent-run", "agent-thread", "agent-phone"):
        assert (screenshots / f"{name}.png").stat().st_size > 10_000
