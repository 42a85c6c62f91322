"""Tracing: OpenTelemetry set up from the standard environment, and W3C trace context carried between processes.

Off and free by default. loopd code creates spans through the OpenTelemetry *API* only (`tracer(name)`); until a
tracer provider is installed every span is the API's non-recording span, and the hooks that cost more than a
context-variable read ask `tracing_enabled()` first. `open_tracing(service)` installs the SDK's provider with an
OTLP/HTTP exporter when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set — the
exporter reads the rest of the standard ``OTEL_*`` variables itself — and flushes it on exit. Only a command's
``main`` calls it (like logging, the provider is process-wide: OpenTelemetry keeps it in its own global); tests
install an in-memory exporter the same way.

Propagation is W3C trace context (``traceparent`` / ``tracestate``): `inject_headers` / `extract_context` for HTTP
(the engine's remote adapter → ``loopd harness serve``; loop-runtime → loop-server), and `trace_annotations` /
`context_from_annotations` for a Task, whose metadata carries its question's trace context so whoever answers it
(the server's responder or an operator) joins the same trace. HTTP servers need nothing of loopd's own: FastAPI's
native telemetry opens a server span per request that continues the caller's ``traceparent`` once a provider is
installed (loop-server and ``loopd harness serve`` are FastAPI apps).

Span names and attributes follow the OpenTelemetry GenAI semantic conventions: ``invoke_agent {agent}`` (a harness
turn), ``chat {model}`` (a model call), ``execute_tool {tool}`` (a tool call), with ``gen_ai.*`` attributes; loopd's
own steps (``loopd.chat.request``, ``loopd.task``, ``loopd.harness_call``) carry ``loopd.*`` attributes.

Must not do: import the SDK unless tracing is switched on; keep any state of its own.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from loopd._infra.errors import LoopdError

__all__ = [
    "TRACEPARENT_ANNOTATION",
    "TRACESTATE_ANNOTATION",
    "Context",
    "Span",
    "SpanKind",
    "TracingUnavailable",
    "attached",
    "context_from_annotations",
    "current_context",
    "extract_context",
    "httpx_trace_hooks",
    "inject_headers",
    "mark_failed",
    "open_tracing",
    "task_span",
    "trace_annotations",
    "tracer",
    "tracing_enabled",
    "tracing_requested",
]

TRACEPARENT_ANNOTATION: Final = "loopd.dev/traceparent"
TRACESTATE_ANNOTATION: Final = "loopd.dev/tracestate"
_ANNOTATION_OF: Final = {"traceparent": TRACEPARENT_ANNOTATION, "tracestate": TRACESTATE_ANNOTATION}
_ENDPOINT_VARIABLES: Final = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


class TracingUnavailable(LoopdError):
    """Tracing was asked for (an OTLP endpoint is set) but the OpenTelemetry SDK is not installed."""


def tracer(name: str) -> Tracer:
    """A tracer for one of loopd's packages: the installed provider's, or the API's no-op one. Take it where the
    span starts, after `tracing_enabled` said yes, not at import: a proxy taken before a provider is installed stays
    bound to the first provider it meets."""
    return trace.get_tracer(name)


def tracing_enabled() -> bool:
    """Whether a real tracer provider is installed (spans are recorded somewhere)."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def tracing_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for traces: an OTLP endpoint is set, the SDK is not disabled and the traces
    exporter is not ``none``."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(env.get(name, "").strip() for name in _ENDPOINT_VARIABLES)


@contextlib.contextmanager
def open_tracing(service_name: str, **resource: str) -> Iterator[bool]:
    """Install an OTLP/HTTP-exporting tracer provider for the block when the environment asks for it (see
    `tracing_requested`); yields whether it did. On exit the provider flushes and shuts down. ``OTEL_SERVICE_NAME``
    and ``OTEL_RESOURCE_ATTRIBUTES`` override the service name and add resource attributes (``resource`` adds
    more). Call it outside any event loop: the exit flushes synchronously.

    Raises `TracingUnavailable` when an endpoint is set but the SDK is missing (``pip install 'pyloopd[otel]'``).
    """
    if not tracing_requested() or tracing_enabled():
        yield False
        return
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise TracingUnavailable(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is not installed: "
            "pip install 'pyloopd[otel]' (or unset the variable)"
        ) from exc
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name, **resource}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    try:
        yield True
    finally:
        provider.shutdown()  # flushes what is queued (bounded by the exporter's own timeout)


# -- propagation ----------------------------------------------------------------------------------------------


def inject_headers(headers: MutableMapping[str, str], context: Context | None = None) -> None:
    """Add ``traceparent`` (and ``tracestate``) for the current (or given) span; nothing when none is recording."""
    propagate.inject(headers, context=context)


async def _inject_into_request(request: Any) -> None:
    propagate.inject(request.headers)


def httpx_trace_hooks() -> dict[str, list[Any]]:
    """``event_hooks`` for an ``httpx.AsyncClient`` that sends the current trace context with every request
    (nothing is added while no span is recording)."""
    return {"request": [_inject_into_request]}


def extract_context(carrier: Mapping[str, str]) -> Context:
    """The context a ``traceparent`` header names (an empty context when none is there or it is malformed)."""
    return propagate.extract(carrier)


def trace_annotations(context: Context | None = None) -> dict[str, str]:
    """Task annotations naming the current (or given) span; empty when no span is recording."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=context)
    return {_ANNOTATION_OF[key]: value for key, value in carrier.items() if key in _ANNOTATION_OF}


def context_from_annotations(annotations: Mapping[str, Any] | None) -> Context | None:
    """The context a Task's annotations carry, or None when they carry none."""
    if not annotations or not isinstance(annotations.get(TRACEPARENT_ANNOTATION), str):
        return None
    carrier = {key: str(annotations[name]) for key, name in _ANNOTATION_OF.items() if name in annotations}
    return propagate.extract(carrier)


def current_context() -> Context:
    """The current context (to start a span under it later, in another task)."""
    return otel_context.get_current()


@contextlib.contextmanager
def attached(context: Context | None) -> Iterator[None]:
    """Make ``context`` current for the block (nothing when it is None)."""
    if context is None:
        yield
        return
    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)


@contextlib.contextmanager
def task_span(
    tracer_name: str, name: str, annotations: Mapping[str, Any] | None, attributes: Mapping[str, Any]
) -> Iterator[Span | None]:
    """While tracing is on, a span for work on a Task, continuing the trace its annotations carry (see
    `trace_annotations`); off, nothing (yields None)."""
    if not tracing_enabled():
        yield None
        return
    with tracer(tracer_name).start_as_current_span(
        name, context=context_from_annotations(annotations), attributes=dict(attributes)
    ) as span:
        yield span


def mark_failed(span: Span, description: str) -> None:
    """Set the span's status to error with a short description (no-op on a non-recording span)."""
    if span.is_recording():
        span.set_status(Status(StatusCode.ERROR, description))
