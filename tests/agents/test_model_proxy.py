"""The host model proxy on a real unix socket in front of the scripted model server."""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral._errors import ConfigError, PrerequisiteMissing
from corral.net._model_proxy import PLACEHOLDER_KEY, ModelProxy, Upstream, Usage, UsageMeter
from corral.testing._model_script import Fail, Hang, Text, ToolCall
from corral.testing._model_server import ModelServer

KEY = "sk-host-only-123"
ANTHROPIC_BODY = {"model": "claude-x", "stream": True, "max_tokens": 10,
                  "messages": [{"role": "user", "content": "hi"}]}
GEMINI_BODY = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
               "tools": [{"functionDeclarations": [{"name": "run_shell_command"}]}]}
OPENAI_BODY = {"model": "gpt-x", "stream": True, "input": [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}


@pytest.fixture
def sock(tmp_path: Path) -> Path:
    # Short path: unix socket paths are limited to ~108 bytes.
    d = Path(os.environ.get("TMPDIR", "/tmp")) / f"cmp-{os.getpid()}-{id(tmp_path) % 10**6}"
    d.mkdir(exist_ok=True)
    yield d / "m.sock"
    for p in d.iterdir():
        p.unlink()
    d.rmdir()


def with_proxy(proxy: ModelProxy, sock: Path,
               body: Callable[[httpx.AsyncClient], Awaitable[Any]]) -> Any:
    async def go() -> Any:
        async with anyio.create_task_group() as tg:
            await tg.start(proxy.serve, sock)
            transport = httpx.AsyncHTTPTransport(uds=str(sock))
            async with httpx.AsyncClient(transport=transport, base_url="http://sandbox",
                                         timeout=30) as client:
                try:
                    with anyio.fail_after(60):
                        return await body(client)
                finally:
                    tg.cancel_scope.cancel()

    return anyio.run(go)


def sse_events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]


def test_credentials_are_replaced_for_anthropic(sock: Path) -> None:
    with ModelServer([Text("hello")]) as srv:
        proxy = ModelProxy(Upstream("anthropic", srv.url, KEY))

        async def body(c: httpx.AsyncClient) -> httpx.Response:
            return await c.post("/v1/messages?beta=true", json=ANTHROPIC_BODY,
                                headers={"x-api-key": PLACEHOLDER_KEY,
                                         "authorization": "Bearer also-fake",
                                         "anthropic-version": "2023-06-01"})

        resp = with_proxy(proxy, sock, body)
        req = srv.model_requests[0]
    assert resp.status_code == 200
    assert req.headers["x-api-key"] == KEY and "authorization" not in req.headers
    assert req.headers["anthropic-version"] == "2023-06-01"  # other headers pass through
    assert req.path == "/v1/messages?beta=true"
    assert [e["type"] for e in sse_events(resp.text)][-1] == "message_stop"
    assert proxy.usage.requests == 1
    assert (proxy.usage.input_tokens, proxy.usage.output_tokens) == (100, 20)
    # per model, as the response named it (what cost is computed from)
    assert proxy.usage.models == {"claude-x": {
        "input_tokens": 100, "output_tokens": 20, "cache_read_tokens": 0,
        "cache_write_tokens": 0, "requests": 1}}
    assert Usage.from_dict(proxy.usage.to_dict()) == proxy.usage


def test_credentials_are_replaced_for_openai_and_paths_map_onto_the_base(sock: Path) -> None:
    with ModelServer([ToolCall("ls", tool="exec_command")]) as srv:
        proxy = ModelProxy(Upstream("openai", srv.openai_url, KEY))

        async def body(c: httpx.AsyncClient) -> httpx.Response:
            return await c.post("/v1/responses", json=OPENAI_BODY,
                                headers={"authorization": f"Bearer {PLACEHOLDER_KEY}"})

        resp = with_proxy(proxy, sock, body)
        req = srv.model_requests[0]
    assert req.headers["authorization"] == f"Bearer {KEY}"
    assert "x-api-key" not in req.headers
    assert req.path == "/v1/responses"
    events = sse_events(resp.text)
    assert events[-1]["type"] == "response.completed"
    calls = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert calls[0]["type"] == "function_call" and json.loads(calls[0]["arguments"]) == {
        "cmd": "ls"}
    assert (proxy.usage.input_tokens, proxy.usage.output_tokens) == (100, 20)
    assert list(proxy.usage.models) == ["gpt-x"]
    assert proxy.usage.models["gpt-x"]["output_tokens"] == 20


def test_streams_pass_through_without_buffering(sock: Path) -> None:
    # The server sends 3 frames and then stalls: the client must already have them.
    with ModelServer([Hang(after_frames=3, then=Text("streaming"))]) as srv:
        proxy = ModelProxy(Upstream("anthropic", srv.url, KEY), idle_timeout=60)

        async def body(c: httpx.AsyncClient) -> list[str]:
            got: list[str] = []
            async with c.stream("POST", "/v1/messages", json=ANTHROPIC_BODY) as resp:
                buf = ""
                with anyio.fail_after(10):
                    async for chunk in resp.aiter_text():
                        buf += chunk
                        got = [e["type"] for e in sse_events(buf)]
                        if "content_block_start" in got:
                            return got
            return got

        got = with_proxy(proxy, sock, body)
    assert got[:3] == ["message_start", "ping", "content_block_start"]


def test_token_budget_refuses_requests_once_used_up(sock: Path) -> None:
    with ModelServer([Text("one"), Text("two")]) as srv:
        proxy = ModelProxy(Upstream("anthropic", srv.url, KEY), budget=100)

        async def body(c: httpx.AsyncClient) -> list[httpx.Response]:
            first = await c.post("/v1/messages", json=ANTHROPIC_BODY)
            second = await c.post("/v1/messages", json=ANTHROPIC_BODY)
            return [first, second]

        first, second = with_proxy(proxy, sock, body)
        n = len(srv.model_requests)
    assert first.status_code == 200
    assert second.status_code == 403
    err = second.json()
    assert err["type"] == "error" and err["error"]["type"] == "permission_error"
    assert "token budget of 100 tokens" in err["error"]["message"]
    assert n == 1 and proxy.usage.refused == 1 and proxy.usage.total == 120


def test_upstream_that_never_answers_gets_a_504(sock: Path) -> None:
    with ModelServer([Hang()]) as srv:
        proxy = ModelProxy(Upstream("openai", srv.openai_url, KEY), idle_timeout=0.5)

        async def body(c: httpx.AsyncClient) -> httpx.Response:
            return await c.post("/v1/responses", json=OPENAI_BODY)

        resp = with_proxy(proxy, sock, body)
    assert resp.status_code == 504
    assert "did not answer within 0.5s" in resp.json()["error"]["message"]


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_stall_mid_stream_ends_with_an_error_event(sock: Path, api: str) -> None:
    with ModelServer([Hang(after_frames=4, then=Text("partial"))]) as srv:
        url = srv.url if api == "anthropic" else srv.openai_url
        proxy = ModelProxy(Upstream(api, url, KEY), idle_timeout=0.5)  # type: ignore[arg-type]

        async def body(c: httpx.AsyncClient) -> httpx.Response:
            path = "/v1/messages" if api == "anthropic" else "/v1/responses"
            return await c.post(path, json=ANTHROPIC_BODY if api == "anthropic" else OPENAI_BODY)

        resp = with_proxy(proxy, sock, body)
    events = sse_events(resp.text)
    assert len(events) == 5
    last = events[-1]
    if api == "anthropic":
        assert last["type"] == "error" and "stalled" in last["error"]["message"]
    else:
        assert last["type"] == "response.failed"
        assert "stalled" in last["response"]["error"]["message"]


def test_upstream_errors_pass_through_with_the_key_scrubbed(sock: Path) -> None:
    with ModelServer([Fail(401, f"bad key {KEY}", "authentication_error")]) as srv:
        proxy = ModelProxy(Upstream("anthropic", srv.url, KEY))

        async def body(c: httpx.AsyncClient) -> httpx.Response:
            return await c.post("/v1/messages", json=ANTHROPIC_BODY)

        resp = with_proxy(proxy, sock, body)
    assert resp.status_code == 401
    assert KEY not in resp.text and "bad key [redacted]" in resp.text


def test_unreachable_upstream_is_a_502(sock: Path) -> None:
    with ModelServer() as srv:
        dead = srv.url
    proxy = ModelProxy(Upstream("anthropic", dead, KEY))

    async def body(c: httpx.AsyncClient) -> httpx.Response:
        return await c.post("/v1/messages", json=ANTHROPIC_BODY)

    resp = with_proxy(proxy, sock, body)
    assert resp.status_code == 502
    assert "cannot reach the model API" in resp.json()["error"]["message"]


def test_keep_alive_and_malformed_requests(sock: Path) -> None:
    with ModelServer([Text("a"), Text("b")]) as srv:
        proxy = ModelProxy(Upstream("anthropic", srv.url, KEY))

        async def body(c: httpx.AsyncClient) -> tuple[int, int, bytes]:
            a = await c.post("/v1/messages", json=ANTHROPIC_BODY)
            b = await c.post("/v1/messages", json=ANTHROPIC_BODY)
            async with await anyio.connect_unix(str(sock)) as raw:
                await raw.send(b"NOT HTTP AT ALL\r\n\r\n")
                reply = await raw.receive()
            return a.status_code, b.status_code, reply

        a, b, reply = with_proxy(proxy, sock, body)
    assert (a, b) == (200, 200)
    assert reply.startswith(b"HTTP/1.1 400")


def test_upstream_configuration() -> None:
    assert Upstream("openai", "https://api.openai.com/v1", "k").url_for(
        "/v1/responses") == "https://api.openai.com/v1/responses"
    assert Upstream("openai", "http://h:1/v1/", "k").url_for("/v1/models?x=1") == \
        "http://h:1/v1/models?x=1"
    assert Upstream("anthropic", "https://api.anthropic.com", "k").url_for(
        "/v1/messages?beta=true") == "https://api.anthropic.com/v1/messages?beta=true"
    with pytest.raises(ConfigError):
        Upstream("anthropic", "ftp://x", "k")
    with pytest.raises(ConfigError):
        Upstream("anthropic", "https://x", "")
    with pytest.raises(ConfigError):
        Upstream("anthropic", "https://x", "k").url_for("http://elsewhere/")
    up = Upstream.from_env("anthropic", {"ANTHROPIC_API_KEY": "a1"})
    assert (up.base_url, up.api_key) == ("https://api.anthropic.com", "a1")
    assert "a1" not in repr(up)
    up = Upstream.from_env("openai", {"OPENAI_API_KEY": "o1", "OPENAI_BASE_URL": "http://x/v1"})
    assert up.base_url == "http://x/v1"
    with pytest.raises(PrerequisiteMissing, match="OPENAI_API_KEY"):
        Upstream.from_env("openai", {})
    with pytest.raises(ConfigError):
        ModelProxy(up, budget=0)


def _stream_bytes(api: str) -> bytes:
    """A real scripted stream of either API (what the proxy meters)."""
    with ModelServer([Text("hi there", input_tokens=321, output_tokens=45)]) as srv:
        url = srv.url + ("/v1/messages" if api == "anthropic" else "/v1/responses")
        body = ANTHROPIC_BODY if api == "anthropic" else OPENAI_BODY
        with httpx.stream("POST", url, json=body) as resp:
            return b"".join(resp.iter_bytes())


STREAMS = {api: _stream_bytes(api) for api in ("anthropic", "openai")}


@settings(max_examples=100, deadline=None)
@given(api=st.sampled_from(["anthropic", "openai"]), cuts=st.lists(st.integers(0, 5000),
                                                                      max_size=30))
def test_property_usage_does_not_depend_on_chunking(api: str, cuts: list[int]) -> None:
    data = STREAMS[api]
    points = sorted({c % (len(data) + 1) for c in cuts})
    meter = UsageMeter(api, sse=True)  # type: ignore[arg-type]
    prev = 0
    for p in [*points, len(data)]:
        meter.feed(data[prev:p])
        prev = p
    usage = meter.finish()
    assert (usage.input_tokens, usage.output_tokens) == (321, 45)


@settings(max_examples=100, deadline=None)
@given(chunks=st.lists(st.binary(max_size=64), max_size=20), api=st.sampled_from(
    ["anthropic", "openai"]), sse=st.booleans())
def test_property_meter_never_raises_on_garbage(chunks: list[bytes], api: str, sse: bool) -> None:
    meter = UsageMeter(api, sse=sse)  # type: ignore[arg-type]
    for c in chunks:
        meter.feed(c)
    usage = meter.finish()
    assert usage.total >= 0


def test_only_model_api_paths_are_forwarded(sock: Path) -> None:
    with ModelServer([Text("ok")]) as srv:
        proxy = ModelProxy(Upstream("openai", srv.openai_url, KEY))

        async def body(c: httpx.AsyncClient) -> list[httpx.Response]:
            return [await c.get("/v1/files"),
                    await c.post("/v1/fine_tuning/jobs", json={}),
                    await c.post("/v1/responses/../files", json={}),
                    await c.get("/v1/models"),
                    await c.post("/v1/responses", json=OPENAI_BODY)]

        files, tune, dots, models, ok = with_proxy(proxy, sock, body)
        paths = [r.path for r in srv.requests]
    assert [r.status_code for r in (files, tune, dots)] == [403, 403, 403]
    assert "'/v1/files' is not a model API path" in files.json()["error"]["message"]
    assert (models.status_code, ok.status_code) == (200, 200)
    assert paths == ["/v1/models", "/v1/responses"]  # the refused ones never left the host
    up = Upstream("anthropic", "http://x", "k")
    assert up.allows("/v1/messages?beta=true") and up.allows("/v1/messages/count_tokens")
    assert not up.allows("/v1/messagesX") and not up.allows("/v1/files")
    assert Upstream("anthropic", "http://x", "k", allowed_paths=("/",)).allows("/anything")


# ---------------------------------------------------------------- gemini


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




# ---------------------------------------------------------------- the run's token

TOKEN = "run-token-Qm9vLXRva2VuLTEyMzQ1Njc4OTA"


@pytest.mark.parametrize("api,path,headers", [
    ("anthropic", "/v1/messages", {"x-api-key": TOKEN}),
    ("openai", "/v1/responses", {"authorization": f"Bearer {TOKEN}"}),
    ("openai", "/v1/responses", {"api-key": TOKEN}),
    ("gemini", "/v1beta/models/g:generateContent", {"x-goog-api-key": TOKEN}),
    ("gemini", f"/v1beta/models/g:streamGenerateContent?alt=sse&key={TOKEN}", {}),
])
def test_the_runs_token_is_taken_the_way_each_cli_sends_its_key_and_swapped_upstream(
        sock: Path, api: str, path: str, headers: dict[str, str]) -> None:
    body_json = {"anthropic": ANTHROPIC_BODY, "openai": OPENAI_BODY, "gemini": GEMINI_BODY}[api]
    with ModelServer([Text("hello")]) as srv:
        url = {"anthropic": srv.url, "openai": srv.openai_url, "gemini": srv.gemini_url}[api]
        proxy = ModelProxy(Upstream(api, url, KEY), token=TOKEN)  # type: ignore[arg-type]

        async def body(c: httpx.AsyncClient) -> httpx.Response:
            return await c.post(path, json=body_json, headers=headers)

        resp = with_proxy(proxy, sock, body)
        (req,) = srv.model_requests
    assert resp.status_code == 200, resp.text
    assert req.api_key == KEY
    # the token goes no further than the proxy (Gemini's ?key= is dropped, alt= kept)
    assert TOKEN not in json.dumps(req.headers) + req.path
    if "alt=sse" in path:
        assert req.path.endswith("?alt=sse"), req.path
    assert proxy.unauthorized == 0 and proxy.usage.requests == 1


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(["x-api-key", "authorization", "x-goog-api-key",
                                        "api-key", "proxy-authorization", "cookie"]),
                       st.one_of(st.just(PLACEHOLDER_KEY), st.just(f"Bearer {TOKEN[:-1]}"),
                                 st.just(TOKEN.upper()), st.just(f"Basic {TOKEN}"),
                                 st.just(f"{TOKEN} "),
                                 st.text(st.characters(min_codepoint=33, max_codepoint=126),
                                         max_size=60)),
                       max_size=4),
       st.sampled_from(["", f"?key={TOKEN[1:]}", "?token=" + TOKEN, "?key="]))
def test_property_a_request_without_the_runs_token_is_refused_and_not_forwarded(
        headers: dict[str, str], query: str) -> None:
    assume_no_token = all(v != TOKEN and v.removeprefix("Bearer ").strip() != TOKEN
                          for v in headers.values())
    if not assume_no_token:
        return
    with ModelServer([Text("hello")]) as srv:
        proxy = ModelProxy(Upstream("anthropic", srv.url, KEY), token=TOKEN, budget=10)
        resp = anyio.run(proxy.handle, _request("/v1/messages" + query, headers))
        assert resp.status == 401
        assert b"this run's key" in resp.body  # type: ignore[operator]
        assert srv.requests == []
    assert proxy.unauthorized == 1
    assert (proxy.usage.requests, proxy.usage.refused, proxy.usage.total) == (0, 0, 0)


def _request(target: str, headers: dict[str, str]) -> Any:
    from corral.net._http11 import Request

    return Request("POST", target, [(k, v) for k, v in headers.items()],
                   json.dumps(ANTHROPIC_BODY).encode())


def test_a_token_too_short_to_be_secret_is_refused() -> None:
    with pytest.raises(ConfigError, match="at least 16"):
        ModelProxy(Upstream("anthropic", "https://api.anthropic.com", KEY), token="short")
