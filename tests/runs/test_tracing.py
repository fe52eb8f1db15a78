"""OpenTelemetry traces (the SDK's in-memory exporter): a run's start, its drive by another
runner that knows only the store (as another process or host would), the sandbox's ensure and
release, the model calls through the proxy with GenAI token attributes, and the trace context
an HTTP caller sends carried into the run's spec."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from corral._telemetry import context_of
from corral.net._model_proxy import PLACEHOLDER_KEY, ModelProxy, Upstream
from corral.runs._runner import Runner, RunRequest
from corral.stores import open_store
from corral.testing._model_script import Text
from corral.testing._model_server import ModelServer

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # the first test in this process sets it
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    if not getattr(provider, "_corral_test_exporter", False):
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        provider._corral_test_exporter = True  # type: ignore[attr-defined]
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def named(spans: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name.startswith(prefix)]


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def test_a_runs_spans_form_one_trace_across_runners(spans: InMemorySpanExporter,
                                                    tmp_path: Path) -> None:
    async def go() -> str:
        store = await open_store(f"sqlite:///{tmp_path / 'corral.db'}")
        try:
            tracer = trace.get_tracer("the-app")
            with tracer.start_as_current_span("the app's request"):
                record = await Runner(store).start(RunRequest(
                    command=["sh", "-c", "echo hi"], provider="local"))
            # another runner (another process, another host) knows only the store
            await Runner(store).drive(record.run_id)
            return record.run_id
        finally:
            await store.aclose()

    run_id = anyio.run(go)
    [root] = named(spans, "the app's request")
    [start] = named(spans, "corral.run.start")
    [ensure] = named(spans, "sandbox.ensure")
    [drive] = named(spans, "invoke_agent command")
    [end] = named(spans, "corral.run.end")
    [release] = named(spans, "sandbox.release")
    trace_id = root.context.trace_id
    assert {s.context.trace_id for s in (start, ensure, drive, end, release)} == {trace_id}
    assert parent_id(start) == root.context.span_id
    assert parent_id(ensure) == start.context.span_id
    assert parent_id(drive) == start.context.span_id  # from the spec, not this process
    assert parent_id(end) == start.context.span_id
    assert parent_id(release) == end.context.span_id
    assert drive.attributes is not None and drive.attributes["corral.run.id"] == run_id
    assert drive.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert drive.attributes["corral.run.status"] == "completed"


def test_each_model_call_is_a_chat_span_with_token_usage(spans: InMemorySpanExporter,
                                                         tmp_path: Path) -> None:
    sock = tmp_path / "model.sock"
    with ModelServer([Text("hello")]) as srv:
        proxy = ModelProxy(Upstream("anthropic", srv.url, "sk-host-only"))
        with trace.get_tracer("t").start_as_current_span("the run") as run_span:
            proxy.trace_parent = context_of({"traceparent": _traceparent(run_span)})

        async def go() -> None:
            async with anyio.create_task_group() as tg:
                await tg.start(proxy.serve, str(sock))
                transport = httpx.AsyncHTTPTransport(uds=str(sock))
                async with httpx.AsyncClient(transport=transport, base_url="http://m") as c:
                    r = await c.post("/v1/messages", headers={"x-api-key": PLACEHOLDER_KEY},
                                     json={"model": "claude-x", "stream": True,
                                           "max_tokens": 5, "messages": [
                                               {"role": "user", "content": "hi"}]})
                    assert r.status_code == 200
                tg.cancel_scope.cancel()

        anyio.run(go)
    [chat] = named(spans, "chat")
    assert chat.name == "chat claude-x"
    assert parent_id(chat) == run_span.get_span_context().span_id
    attrs: Any = chat.attributes
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.provider.name"] == "anthropic"
    assert attrs["gen_ai.response.model"] == "claude-x"
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (100, 20)


def _traceparent(span: Any) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-01"


def test_an_http_callers_trace_is_carried_into_the_run(tmp_path: Path) -> None:
    """The server process has no exporter: the context still travels, so a driver on
    another process continues the caller's trace."""
    from tests.server.conftest import Home  # the server test helpers

    path = tmp_path / "home"
    path.mkdir()
    home = Home(path)
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    with home.server() as server, server.client() as c:
        r = c.post("/v1/runs", json={"thread_id": "t", "command": ["true"]},
                   headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"})
        assert r.status_code == 201, r.text
        run_id = r.json()["run_id"]
    with sqlite3.connect(home.db) as conn:
        (doc,) = conn.execute("SELECT doc FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    carried = json.loads(doc)["spec"]["trace"]["traceparent"]
    assert carried.split("-")[1] == trace_id


def test_sandbox_create_exec_and_destroy_are_spans_of_their_caller(
        spans: InMemorySpanExporter, tmp_path: Path) -> None:
    from corral import RunContext, Sandbox, Workspace

    sandbox = Sandbox(provider="local", workspace=Workspace(setup=["true", "echo set up"]))
    ctx = RunContext(thread_id="t-trace", run_id="r-trace")

    async def go() -> str:
        store = await open_store(f"sqlite:///{tmp_path / 'corral.db'}")
        try:
            ensured = await sandbox.ensure(ctx, store=store)
            with trace.get_tracer("the-app").start_as_current_span("teardown"):
                assert await sandbox.destroy(ctx, store=store)
            return ensured.handle.id
        finally:
            await store.aclose()

    sandbox_id = anyio.run(go)
    [ensure] = named(spans, "sandbox.ensure")
    [create] = named(spans, "sandbox.create")
    [setup] = named(spans, "sandbox.exec")
    [destroy] = named(spans, "sandbox.destroy")
    [teardown] = named(spans, "teardown")
    assert parent_id(create) == parent_id(setup) == ensure.context.span_id
    assert parent_id(destroy) == teardown.context.span_id
    assert create.attributes is not None and create.attributes["corral.sandbox.id"] == sandbox_id
    assert setup.attributes is not None and setup.attributes["corral.sandbox.exec"] == "setup"
    assert setup.attributes["corral.sandbox.steps"] == 2
    assert destroy.attributes is not None and destroy.attributes["corral.sandbox.id"] == sandbox_id
    assert destroy.attributes["corral.sandbox.provider"] == "local"
