"""OpenTelemetry for every service: one tracer provider per process, exported over OTLP/HTTP
(Jaeger in docker-compose) when an endpoint is configured, and W3C trace context carried in
NATS headers so one request is one trace across gateway, encoder, dispatcher and parser.

Span attributes follow the GenAI semantic conventions (gen_ai.*)."""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

log = logging.getLogger("chorus.telemetry")

# GenAI semantic convention attribute names (opentelemetry-semantic-conventions, incubating)
GEN_AI_SYSTEM = "gen_ai.system"
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"


def setup_tracing(
    service: str, otlp_endpoint: str | None, exporter: SpanExporter | None = None
) -> TracerProvider | None:
    """Install a tracer provider for this process. With neither an OTLP endpoint nor an
    exporter (tests pass an InMemorySpanExporter), tracing stays a no-op."""
    if not otlp_endpoint and exporter is None:
        return None
    provider = TracerProvider(resource=Resource.create({"service.name": f"chorus-{service}"}))
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = otlp_endpoint.rstrip("/") if otlp_endpoint else ""
        exporter = OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces")
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    log.info("tracing to %s", otlp_endpoint or type(exporter).__name__)
    return provider


def tracer(name: str = "chorus") -> trace.Tracer:
    return trace.get_tracer(name)


def inject(headers: dict[str, str]) -> dict[str, str]:
    """Add the current trace context (traceparent/tracestate) to outgoing NATS headers."""
    propagate.inject(headers)
    return headers


def extract(headers: dict[str, str] | None) -> Any:
    """The trace context carried by incoming NATS headers (for ``start_as_current_span``)."""
    return propagate.extract(headers or {})


def carrier_of(span: Any) -> dict[str, str]:
    """The W3C trace context of ``span``, for a message whose handler continues the trace."""
    from opentelemetry.trace import set_span_in_context

    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=set_span_in_context(span))
    return carrier


def child_span(name: str, parent: Any, **attributes: Any) -> Any:
    """A span under ``parent`` (a span, or a carrier dict from a message), not made current."""
    from opentelemetry.trace import set_span_in_context

    context = propagate.extract(parent) if isinstance(parent, dict) else set_span_in_context(parent)
    return tracer().start_span(name, context=context, attributes=attributes or None)
