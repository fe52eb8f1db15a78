"""gemini-cli specifics: its stream-json translation, its settings, the policies it refuses,
and Gemini's wire format in the model proxy (the real CLI runs in test_e2e.py)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from ag_ui.core import EventType

from corral._errors import ConfigError
from corral.harness._cli_base import NO_RESULT, SESSION_EVENT, CliOptions
from corral.harness._gemini_cli import GeminiCliHarness
from corral.harness._registry import build_harness
from corral.net._model_proxy import PLACEHOLDER_KEY, ModelProxy, Upstream
from corral.sandbox._policy import Policy
from corral.testing._model_server import ModelServer, Text, ToolCall

from .test_model_proxy import KEY, sock, with_proxy  # noqa: F401 - the fixture
from .test_translators import GEMINI_OK, check_well_formed, kinds, translate

GEMINI_BODY = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
               "tools": [{"functionDeclarations": [{"name": "run_shell_command"}]}]}


def test_gemini_success_run() -> None:
    evs = translate(GeminiCliHarness(), GEMINI_OK)
    check_well_formed(evs)
    assert kinds(evs) == [
        "RUN_STARTED", "CUSTOM", "CUSTOM",
        "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
        "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT",
        "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END", "RUN_FINISHED",
    ]
    assert evs[1].name == SESSION_EVENT
    assert evs[1].value == {"harness": "gemini-cli", "sessionId": "8c8c4464-709f",
                            "model": "gemini-fake"}
    assert evs[2].name == "gemini-cli.message"  # the user's prompt, echoed
    start = evs[6]
    assert (start.tool_call_id, start.tool_call_name) == ("run-7-rsc_1", "run_shell_command")
    assert json.loads(evs[7].delta)["command"] == "echo hi > out.txt && ls"
    assert (evs[9].tool_call_id, evs[9].content) == ("run-7-rsc_1", "out.txt")
    fin = evs[-1]
    assert fin.result == {"text": "Done. out.txt", "sessionId": "8c8c4464-709f"}
    u = fin.usage[0]
    assert (u.input_tokens, u.output_tokens, u.cached_input_tokens) == (200, 40, 0)


def test_gemini_run_cut_short_closes_the_text_and_the_tool_call() -> None:
    evs = translate(GeminiCliHarness(), GEMINI_OK[:4], code=137)
    check_well_formed(evs)
    assert kinds(evs)[-3:] == ["TOOL_CALL_END", "TOOL_CALL_RESULT", "RUN_ERROR"]
    results = [e for e in evs if e.type == EventType.TOOL_CALL_RESULT]
    assert [r.content for r in results] == [NO_RESULT]
    ends = [e for e in evs if e.type == EventType.TEXT_MESSAGE_END]
    assert len(ends) == 1
    assert evs[-1].type == EventType.RUN_ERROR


def test_gemini_error_result_and_failed_tool() -> None:
    lines = [
        GEMINI_OK[0],
        json.dumps({"type": "tool_use", "tool_name": "mcp_corral_lookup", "tool_id": "t9",
                    "parameters": {"q": 1}}),
        json.dumps({"type": "tool_result", "tool_id": "t9", "status": "error",
                    "error": {"type": "x", "message": "tool blew up"}}),
        json.dumps({"type": "error", "severity": "warning", "message": "retrying"}),
        json.dumps({"type": "result", "status": "error",
                    "error": {"type": "FatalAuthenticationError", "message": "bad auth"}}),
    ]
    evs = translate(GeminiCliHarness(), lines, code=41)
    check_well_formed(evs)
    start = next(e for e in evs if e.type == EventType.TOOL_CALL_START)
    assert start.tool_call_name == "lookup"  # a host tool under its own name
    result = next(e for e in evs if e.type == EventType.TOOL_CALL_RESULT)
    assert result.content == "tool blew up"
    assert "gemini-cli.error" in [e.name for e in evs if e.type == EventType.CUSTOM]
    assert evs[-1].type == EventType.RUN_ERROR
    assert (evs[-1].message, evs[-1].code) == ("bad auth",
                                               "gemini-cli:FatalAuthenticationError")


@pytest.mark.parametrize("policy, fragment", [
    (Policy(deny=("rm *",)), "deny rules ['rm *']"),
    (Policy(ask=("git push",)), "ask rules"),
    (Policy(allow=("ls",), default="deny"), "default: deny"),
    (Policy(file_write="deny"), "file_write: deny"),
])
def test_command_rules_are_refused_at_definition_time(policy: Policy, fragment: str) -> None:
    with pytest.raises(ConfigError, match="gemini-cli cannot enforce") as info:
        GeminiCliHarness(policy=policy)
    assert fragment in str(info.value) and "\n" not in str(info.value)
    # the same through the registry (a run spec), and with corral's permission prompt on
    with pytest.raises(ConfigError, match=fragment.split(" ")[0]):
        build_harness("gemini-cli", {"policy": policy.to_dict(), "permission_prompt": True})


def test_network_deny_removes_the_web_tools_and_settings_hold_no_secret() -> None:
    h = GeminiCliHarness(policy=Policy(default="allow", network="deny"))
    opts = CliOptions.parse({"max_retries": 0, "mcp_servers": {"corral": {
        "url": "http://127.0.0.1:{corral.port.tools}/mcp",
        "headers": {"Authorization": "Bearer ${CORRAL_TOOLS_TOKEN}"}}}})
    files = h.home_files(opts)
    settings = json.loads(files[".gemini/settings.json"])
    assert settings["tools"]["exclude"] == ["google_web_search", "web_fetch"]
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert settings["telemetry"]["enabled"] is False
    assert settings["security"]["folderTrust"]["enabled"] is False
    assert settings["general"]["maxAttempts"] == 1
    server = settings["mcpServers"]["corral"]
    assert server["httpUrl"] == "${CORRAL_MCP_URL_CORRAL}"  # the entry fills the port in
    assert server["headers"] == {"Authorization": "Bearer ${CORRAL_TOOLS_TOKEN}"}
    assert "tools" not in json.loads(GeminiCliHarness().home_files(opts)[
        ".gemini/settings.json"])
    env = h.cli_env(opts, "http://127.0.0.1:1")
    assert env["GEMINI_API_KEY"] == PLACEHOLDER_KEY
    assert env["CORRAL_MCP_URL_CORRAL"] == "http://127.0.0.1:{corral.port.tools}/mcp"


def test_proxy_forwards_gemini_with_the_real_key_and_meters_per_model(sock: Path) -> None:
    with ModelServer([ToolCall("ls", input_tokens=300, output_tokens=30),
                      Text("ok", input_tokens=7, output_tokens=3)]) as srv:
        proxy = ModelProxy(Upstream("gemini", srv.gemini_url, KEY))

        async def body(c: httpx.AsyncClient) -> list[httpx.Response]:
            hdr = {"x-goog-api-key": PLACEHOLDER_KEY}
            return [await c.post("/v1beta/models/gem-a:streamGenerateContent?alt=sse",
                                 json=GEMINI_BODY, headers=hdr),
                    await c.post("/v1beta/models/gem-b:generateContent", json=GEMINI_BODY,
                                 headers=hdr)]

        stream, plain = with_proxy(proxy, sock, body)
        reqs = srv.model_requests
    assert [r.status_code for r in (stream, plain)] == [200, 200]
    assert [r.headers["x-goog-api-key"] for r in reqs] == [KEY, KEY]
    frames = [json.loads(x[5:]) for x in stream.text.split("\r\n\r\n") if x.startswith("data:")]
    call = frames[-1]["candidates"][0]["content"]["parts"][0]["functionCall"]
    assert call["name"] == "run_shell_command" and call["args"]["command"] == "ls"
    assert plain.json()["candidates"][0]["content"]["parts"] == [{"text": "ok"}]
    assert (proxy.usage.input_tokens, proxy.usage.output_tokens) == (307, 33)
    assert proxy.usage.models["gem-a"]["input_tokens"] == 300
    assert proxy.usage.models["gem-b"]["output_tokens"] == 3


def test_proxy_forwards_only_gemini_model_calls(sock: Path) -> None:
    with ModelServer([Text("ok")]) as srv:
        proxy = ModelProxy(Upstream("gemini", srv.gemini_url, KEY))
        refused = ["/v1beta/models", "/v1beta/models/g:embedContent", "/v1beta/files",
                   "/v1beta/models/g%2F..%2Fx:generateContent", "/v1beta/models/a/b:countTokens",
                   "/v1beta/cachedContents", "/v1beta/models/g:generateContent:x"]

        async def body(c: httpx.AsyncClient) -> list[httpx.Response]:
            out = [await c.post(p, json={}) for p in refused]
            out.append(await c.post("/v1beta/models/g:countTokens", json=GEMINI_BODY))
            return out

        *bad, ok = with_proxy(proxy, sock, body)
        seen = [r.path for r in srv.requests]
    assert [r.status_code for r in bad] == [403] * len(refused)
    assert bad[0].json()["error"]["status"] == "PERMISSION_DENIED"
    assert ok.status_code == 200 and ok.json() == {"totalTokens": 10}
    assert seen == ["/v1beta/models/g:countTokens"]


def test_upstream_from_the_gemini_variables() -> None:
    up = Upstream.from_env("gemini", {"GEMINI_API_KEY": "g1"})
    assert (up.base_url, up.api_key) == ("https://generativelanguage.googleapis.com", "g1")
    up = Upstream.from_env("gemini", {"GEMINI_API_KEY": "g1",
                                      "GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:9"})
    assert up.url_for("/v1beta/models/m:generateContent") == \
        "http://127.0.0.1:9/v1beta/models/m:generateContent"
    assert up.auth_headers() == [("x-goog-api-key", "g1")]


