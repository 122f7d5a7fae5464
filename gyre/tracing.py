"""OpenTelemetry trace context across gRPC metadata and NATS headers (shell).

Every hop continues the trace of the one before it: a gRPC server reads `traceparent` from the
call's metadata, a consumer from the message's NATS headers, and what they do (events they
produce, RPCs they make) carries the same trace id on. Only `opentelemetry-api` is needed: with
no SDK configured, a hop makes its own span id (and a root makes a new trace id) so ids still
flow and appear in the logs as `trace_id`. With `GYRE_TRACE_EXPORTER=console` (and the
`opentelemetry-sdk` package, extra `[otel]`) spans are also recorded and printed; off by default.

Example:
    with continued_from({"traceparent": "00-4bf9...-00f0...-01"}, "consume TaskSubmitted"):
        new_event(...)  # its envelope's trace_context names trace 4bf9...
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import structlog
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from gyre.errors import InvalidArgument

TRACEPARENT = "traceparent"
TRACE_HEADERS = (TRACEPARENT, "tracestate")
_recording = False
"""True once an SDK tracer provider is configured: spans then come from it instead of being minted."""
_ids = random.Random()  # ids need uniqueness, not secrecy (the OpenTelemetry SDK does the same)


def configure_tracing(exporter: str) -> None:
    """`none` (default): propagate ids only. `console`: record spans and print them (needs the SDK)."""
    global _recording
    if exporter == "none":
        return
    if exporter != "console":
        raise InvalidArgument("GYRE_TRACE_EXPORTER", f"expected none or console, got {exporter!r}")
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError as exc:
        raise InvalidArgument(
            "GYRE_TRACE_EXPORTER", "console needs opentelemetry-sdk: pip install -e '.[otel]'"
        ) from exc
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    trace.set_tracer_provider(provider)
    _recording = True


def current_carrier() -> dict[str, str]:
    """The current trace context as W3C headers (empty outside any trace)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {k: v for k, v in carrier.items() if k in TRACE_HEADERS}


def current_trace_id() -> str:
    """32 hex digits, or "" outside any trace."""
    span_context = trace.get_current_span().get_span_context()
    return format(span_context.trace_id, "032x") if span_context.is_valid else ""


def _minted_child(parent: SpanContext) -> NonRecordingSpan:
    """A span of the parent's trace with a span id of its own; a new trace when there is no parent."""
    span_id = _ids.getrandbits(64) or 1
    if parent.is_valid:
        return NonRecordingSpan(
            SpanContext(parent.trace_id, span_id, is_remote=False, trace_flags=TraceFlags(parent.trace_flags))
        )
    trace_id = _ids.getrandbits(128) or 1
    return NonRecordingSpan(
        SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    )


@contextmanager
def continued_from(
    carrier: Mapping[str, str], name: str, *, kind: SpanKind = SpanKind.CONSUMER
) -> Iterator[str]:
    """Run the block as a child of the carrier's trace (a new trace when it has none); yields the
    trace id, which is also bound to the logs for the block."""
    parent = propagate.extract({k.lower(): v for k, v in carrier.items()})
    token = otel_context.attach(parent)
    try:
        if _recording:
            with trace.get_tracer("gyre").start_as_current_span(name, kind=kind) as span:
                yield _bound_trace_id(span)
        else:
            span = _minted_child(trace.get_current_span(parent).get_span_context())
            with trace.use_span(span, end_on_exit=False):
                yield _bound_trace_id(span)
    finally:
        otel_context.detach(token)
        structlog.contextvars.unbind_contextvars("trace_id")


def _bound_trace_id(span: trace.Span) -> str:
    trace_id = format(span.get_span_context().trace_id, "032x")
    structlog.contextvars.bind_contextvars(trace_id=trace_id)
    return trace_id
