"""OpenTelemetry traces, when the ``otel`` extra is installed (``pip install corral[otel]``).

Without the ``opentelemetry`` packages every helper here is a no-op costing one attribute
lookup. With them, spans go to whatever tracer provider the application set up; when it set
none and the standard ``OTEL_*`` variables ask for an exporter (``OTEL_TRACES_EXPORTER``,
``OTEL_EXPORTER_OTLP_ENDPOINT``), :func:`configure_from_env` sets one up, so a ``corral``
process (CLI, server, a run's services daemon) exports without code.

A run's trace crosses processes: the W3C ``traceparent`` of the span that started a run is
stored in its spec (:func:`carrier`), and whichever process drives the run later, on any
host, continues that trace (:func:`context_of`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["carrier", "configure_from_env", "context_of", "span", "span_at"]

try:
    from opentelemetry import context as _context
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace
    from opentelemetry.trace import Status, StatusCode
except ImportError:  # the otel extra is not installed
    _trace = None  # type: ignore[assignment]

_TRACER = "corral"
_configured = False


def enabled() -> bool:
    """Whether the OpenTelemetry API is installed."""
    return _trace is not None


def configure_from_env() -> None:
    """Set up exporting from the ``OTEL_*`` variables, unless the application set up a
    tracer provider itself or nothing asks for export. Idempotent."""
    global _configured
    if _configured or _trace is None:
        return
    _configured = True
    exporter_names = os.environ.get("OTEL_TRACES_EXPORTER", "")
    if not (exporter_names or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
            or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return
    if exporter_names.strip() == "none":
        return
    if type(_trace.get_tracer_provider()).__name__ != "ProxyTracerProvider":
        return  # the application's own provider wins
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        return
    provider = TracerProvider(resource=Resource.create(
        {"service.name": os.environ.get("OTEL_SERVICE_NAME", "corral")}))
    for name in (n.strip() for n in (exporter_names or "otlp").split(",")):
        if name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        elif name == "otlp":
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )
            except ImportError:
                continue
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _trace.set_tracer_provider(provider)


def carrier() -> dict[str, str]:
    """The current trace context as W3C headers (``traceparent``), to store with a run;
    empty without OpenTelemetry or outside any span."""
    if _trace is None:
        return {}
    out: dict[str, str] = {}
    _propagate.inject(out)
    return out


def context_of(headers: Mapping[str, str] | None) -> Any:
    """The trace context ``headers`` carry (a stored :func:`carrier`, an HTTP request's
    headers), to parent spans on; ``None`` without OpenTelemetry."""
    if _trace is None or not headers:
        return None
    return _propagate.extract(dict(headers))


@contextlib.contextmanager
def span(name: str, attributes: Mapping[str, Any] | None = None, *,
         parent: Any = None) -> Iterator[Any]:
    """A span around the block (current for code inside it); an exception marks it as an
    error. ``parent``: a context from :func:`context_of` (default: the current one)."""
    if _trace is None:
        yield None
        return
    tracer = _trace.get_tracer(_TRACER)
    with tracer.start_as_current_span(name, context=parent,
                                      attributes=dict(attributes or {})) as current:
        yield current


class span_at:  # noqa: N801 - used like a function
    """A span whose start and end are marked by calls, not a block (a tool call seen in a
    run's events): ``s = span_at("execute_tool x", attrs)`` … ``s.end(error=None)``."""

    def __init__(self, name: str, attributes: Mapping[str, Any] | None = None, *,
                 parent: Any = None) -> None:
        self._span = None
        if _trace is not None:
            tracer = _trace.get_tracer(_TRACER)
            self._span = tracer.start_span(name, context=parent,
                                           attributes=dict(attributes or {}),
                                           start_time=time.time_ns())

    def set(self, key: str, value: Any) -> None:
        if self._span is not None:
            self._span.set_attribute(key, value)

    def rename(self, name: str) -> None:
        if self._span is not None:
            self._span.update_name(name)

    def end(self, error: str | None = None) -> None:
        if self._span is None:
            return
        if error is not None:
            self._span.set_status(Status(StatusCode.ERROR, error))
        self._span.end()
        self._span = None


def mark_error(current: Any, message: str) -> None:
    """Mark a span from :func:`span` as failed (no-op without OpenTelemetry)."""
    if _trace is not None and current is not None:
        current.set_status(Status(StatusCode.ERROR, message))


def attach(ctx: Any) -> Any:
    """Make ``ctx`` current; returns a token for :func:`detach` (``None``: nothing)."""
    return _context.attach(ctx) if _trace is not None and ctx is not None else None


def detach(token: Any) -> None:
    if _trace is not None and token is not None:
        _context.detach(token)
