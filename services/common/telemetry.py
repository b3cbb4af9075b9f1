"""OpenTelemetry for every service: one tracer provider per process, exported over OTLP/HTTP
(Jaeger in docker-compose) when an endpoint is configured, and W3C trace context carried in
the messages (``trace`` fields) and NATS headers, so one API request is one trace across
gateway, encoder, dispatcher, parser and tools.

The standard variables configure it: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``; ``CHORUS_OTLP_ENDPOINT`` also works) turns exporting on;
``OTEL_EXPORTER_OTLP_HEADERS`` / ``_TIMEOUT`` / ``_COMPRESSION``, ``OTEL_BSP_*``,
``OTEL_TRACES_SAMPLER``, ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` are read by the
SDK; ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` turn it off. Without
``OTEL_SERVICE_NAME`` each service is ``chorus-<service>``.

Spans are made with an explicit parent (a span, or the carrier a message brought), never by
relying on the ambient context an HTTP framework or a task may or may not carry. Attributes
follow the GenAI semantic conventions (gen_ai.*)."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, set_span_in_context

log = logging.getLogger("chorus.telemetry")

# GenAI semantic convention attribute names (opentelemetry-semantic-conventions, incubating)
GEN_AI_SYSTEM = "gen_ai.system"  # the older name of gen_ai.provider.name
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
GEN_AI_REQUEST_STREAM = "gen_ai.request.stream"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"  # seconds
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"
ERROR_TYPE = "error.type"
FIRST_TOKEN = "first_token"  # the event marking a generation's first output token

_exporting = False  # this process installed a tracer provider (setup_tracing)


def setup_tracing(
    service: str, otlp_endpoint: str | None, exporter: SpanExporter | None = None, instance_id: str | None = None
) -> TracerProvider | None:
    """Install this process's tracer provider (once: a second call returns the first). With
    neither an OTLP endpoint nor an exporter (tests pass an InMemorySpanExporter), tracing
    stays a no-op."""
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current
    traces_endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if exporter is None and not (otlp_endpoint or traces_endpoint):
        return None
    if (
        os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true"
        or os.environ.get("OTEL_TRACES_EXPORTER", "").lower() == "none"
    ):
        return None
    attributes: dict[str, str] = {"chorus.service": service}
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = f"chorus-{service}"
    if instance_id:
        attributes["service.instance.id"] = instance_id
    provider = TracerProvider(resource=Resource.create(attributes))  # sampler: OTEL_TRACES_SAMPLER
    provider.add_span_processor(BatchSpanProcessor(exporter or _otlp_exporter(otlp_endpoint)))
    trace.set_tracer_provider(provider)
    global _exporting
    _exporting = True
    log.info("tracing to %s", traces_endpoint or otlp_endpoint or type(exporter).__name__)
    return provider


def _otlp_exporter(otlp_endpoint: str | None) -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    if otlp_endpoint and otlp_endpoint != os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return OTLPSpanExporter(endpoint=f"{otlp_endpoint.rstrip('/')}/v1/traces")  # CHORUS_OTLP_ENDPOINT
    return OTLPSpanExporter()  # the OTEL_EXPORTER_OTLP_* variables


def tracer(name: str = "chorus") -> trace.Tracer:
    return trace.get_tracer(name)


def inject(headers: dict[str, str]) -> dict[str, str]:
    """Add the current trace context (traceparent/tracestate) to outgoing NATS headers."""
    propagate.inject(headers)
    return headers


def extract(headers: Mapping[str, Any] | None) -> Any:
    """The trace context carried by incoming headers (NATS or HTTP) or a message's ``trace``."""
    return propagate.extract(headers or {})


def carrier_of(span: Span) -> dict[str, str]:
    """The W3C trace context of ``span``, for a message whose handler continues the trace."""
    if not _exporting and not span.get_span_context().is_valid:
        return {}  # what the propagators would give (Chorus sets no baggage), without their steps
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=set_span_in_context(span))
    return carrier


def child_span(
    name: str, parent: Span | Mapping[str, Any] | None, kind: SpanKind = SpanKind.INTERNAL, /, **attributes: Any
) -> Span:
    """A span under ``parent`` (a span, or the carrier a message or headers brought; none:
    a new trace), not made current. Without tracing set up, a span with no trace to continue is
    the invalid span the no-op tracer would make, without its steps: this is on every service's
    part of a request's time to first token."""
    if not _exporting and not _continues(parent):
        return trace.INVALID_SPAN
    context = extract(parent) if parent is None or isinstance(parent, Mapping) else set_span_in_context(parent)
    return tracer().start_span(
        name, context=context, kind=kind, attributes={k: v for k, v in attributes.items() if v is not None} or None
    )


def _continues(parent: Span | Mapping[str, Any] | None) -> bool:
    """Whether ``parent`` carries a trace (a no-op tracer's span keeps it, for the next carrier)."""
    if parent is None:
        return False
    if isinstance(parent, Mapping):
        return "traceparent" in parent  # HTTP headers compare case-insensitively
    return parent.get_span_context().is_valid


@contextlib.contextmanager
def current(span: Span | None) -> Iterator[None]:
    """``span`` as the current span inside (so outgoing NATS headers carry it); None: as is.
    Only around awaits, never across a ``yield`` of an async generator."""
    if span is None:
        yield
        return
    token = otel_context.attach(set_span_in_context(span))
    try:
        yield
    finally:
        otel_context.detach(token)


def failed(span: Span, error_type: str, message: str) -> None:
    """Mark ``span`` as failed (``error.type`` and an error status)."""
    span.set_attribute(ERROR_TYPE, error_type)
    span.set_status(Status(StatusCode.ERROR, message))
