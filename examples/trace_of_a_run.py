"""Print the span tree of one command run (docs/embedding.md shows its output).

    pip install 'corral[otel]'; python examples/trace_of_a_run.py

An application's request span starts a run in a bubblewrap sandbox with one setup step;
a second Runner that knows only the store drives it, as another process or host would.
"""

from __future__ import annotations

import tempfile

import anyio
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from corral import Lifecycle, Runner, RunRequest, Sandbox, Workspace, open_store

SHOWN = ("corral.sandbox.provider", "corral.sandbox.exec", "corral.sandbox.reason",
         "gen_ai.operation.name", "corral.run.status")


async def one_run() -> None:
    store = await open_store(f"sqlite:///{tempfile.mkdtemp()}/corral.db")
    sandbox = Sandbox(provider="bubblewrap", workspace=Workspace(setup=["echo setting up"]),
                      lifecycle=Lifecycle(reuse="none"))
    try:
        with trace.get_tracer("the-app").start_as_current_span("POST /tickets/42/fix"):
            record = await Runner(store).start(
                RunRequest(command=["sh", "-c", "echo hi"], sandbox=sandbox))
            await Runner(store).drive(record.run_id)
    finally:
        await store.aclose()


def main() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    anyio.run(one_run)
    children: dict[int | None, list[ReadableSpan]] = {}
    for s in exporter.get_finished_spans():
        children.setdefault(s.parent.span_id if s.parent else None, []).append(s)

    def show(s: ReadableSpan, depth: int) -> None:
        attrs = {k: v for k, v in (s.attributes or {}).items() if k in SHOWN}
        took = ((s.end_time or 0) - (s.start_time or 0)) / 1e6
        print("  " * depth + f"{s.name}  {took:.1f} ms" + (f"  {attrs}" if attrs else ""))
        for child in sorted(children.get(s.context.span_id, []), key=lambda c: c.start_time or 0):
            show(child, depth + 1)

    for root in children.get(None, []):
        show(root, 0)


if __name__ == "__main__":
    main()
