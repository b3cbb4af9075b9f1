"""One API request as operators see it: its metrics, its GenAI span, its log line's details.

    seen = Observed.start(request, api="chat", model=..., request_id=..., max_tokens=...)
    ... seen.first_output() when the first text goes out ...
    seen.finish(outcome="stop", usage=usage, finish_reasons=["stop"], worker=...)

The span follows the OpenTelemetry GenAI semantic conventions (``chat {model}`` for both APIs,
``chorus.api`` tells them apart). It joins the HTTP request's trace (see ``_parent``) and is
the parent of the generation's bus messages (their trace context travels in the job) and of
the tool calls (``current``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from contracts.messages.parse import Usage
from services.common import metrics, telemetry
from services.gateway.edge import access_line


@dataclass
class Observed:
    api: str  # chat | responses
    model: str
    request_id: str
    span: Span
    notes: dict[str, Any]
    started: float = field(default_factory=time.monotonic)
    first: float | None = None
    done: bool = False
    # a request without an HTTP request of its own (a response over a WebSocket) writes its
    # own access line when it finishes: (method, path, client's request id)
    access: tuple[str, str, str] | None = None

    @classmethod
    def start(
        cls,
        request: Request | None,
        *,
        api: str,
        model: str,
        request_id: str,
        stream: bool,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
    ) -> Observed:
        attributes: dict[str, Any] = {
            telemetry.GEN_AI_OPERATION: "chat",
            telemetry.GEN_AI_PROVIDER_NAME: "openai",
            telemetry.GEN_AI_SYSTEM: "openai",
            telemetry.GEN_AI_REQUEST_MODEL: model,
            telemetry.GEN_AI_RESPONSE_MODEL: model,
            telemetry.GEN_AI_RESPONSE_ID: request_id,
            telemetry.GEN_AI_REQUEST_MAX_TOKENS: max_tokens,
            telemetry.GEN_AI_REQUEST_TEMPERATURE: temperature,
            telemetry.GEN_AI_REQUEST_TOP_P: top_p,
            telemetry.GEN_AI_REQUEST_STREAM: stream,
            "chorus.api": api,
        }
        span = telemetry.child_span(f"chat {model}", *_parent(request), **attributes)
        notes: dict[str, Any] = {}
        if request is not None:
            notes = request.state.notes if hasattr(request.state, "notes") else {}
        notes.update(api=api, model=model, id=request_id)
        metrics.IN_FLIGHT.labels(api).inc()
        return cls(api, model, request_id, span, notes)

    def first_output(self) -> None:
        if self.first is None:
            self.first = time.monotonic()
            self.span.add_event(telemetry.FIRST_TOKEN)
            self.span.set_attribute(telemetry.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, self.first - self.started)
            metrics.TIME_TO_FIRST_TOKEN.labels(self.api, self.model).observe(self.first - self.started)

    def finish(
        self,
        *,
        outcome: str,
        usage: Usage | None = None,
        finish_reasons: list[str] | None = None,
        worker: str | None = None,
        error: str | None = None,
    ) -> None:
        if self.done:
            return
        self.done = True
        now = time.monotonic()
        metrics.IN_FLIGHT.labels(self.api).dec()
        metrics.REQUESTS.labels(self.api, self.model, outcome).inc()
        metrics.REQUEST_DURATION.labels(self.api, self.model).observe(now - self.started)
        span = self.span
        if usage is not None:
            metrics.PROMPT_TOKENS.labels(self.api, self.model).inc(usage.prompt_tokens)
            metrics.OUTPUT_TOKENS.labels(self.api, self.model).inc(usage.completion_tokens)
            metrics.REASONING_TOKENS.labels(self.api, self.model).inc(usage.reasoning_tokens)
            span.set_attribute(telemetry.GEN_AI_USAGE_INPUT_TOKENS, usage.prompt_tokens)
            span.set_attribute(telemetry.GEN_AI_USAGE_OUTPUT_TOKENS, usage.completion_tokens)
            if self.first is not None and usage.completion_tokens > 1:
                metrics.INTER_TOKEN_LATENCY.labels(self.api, self.model).observe(
                    (now - self.first) / (usage.completion_tokens - 1)
                )
            self.notes.update(prompt_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens)
        if finish_reasons:
            span.set_attribute(telemetry.GEN_AI_RESPONSE_FINISH_REASONS, finish_reasons)
        if worker:
            span.set_attribute("chorus.engine.worker", worker)
            self.notes["worker"] = worker
        if self.first is not None:
            self.notes["ttft_ms"] = round((self.first - self.started) * 1000, 1)
        self.notes["outcome"] = outcome
        if error is not None:
            telemetry.failed(span, outcome, error)
            self.notes["reason"] = error
        span.end()
        if self.access is not None:
            method, path, request_id = self.access
            status = status_of(outcome, error)
            access_line(method, path, status, now - self.started, request_id, self.notes)


def status_of(outcome: str, error: str | None) -> int:
    """The HTTP status a finished run stands for in its access line (a WebSocket's responses
    have none of their own): 499 for a client that left, 500 for a failure, else 200."""
    if outcome == "client_gone":
        return 499
    return 500 if error is not None or outcome == "failed" else 200


def _parent(request: Request | None) -> tuple[Span | Mapping[str, str] | None, SpanKind]:
    """Where the request's span hangs: under the HTTP framework's span when it made one
    current (FastAPI's own telemetry, an ASGI instrumentation), else under the client's
    ``traceparent`` as the server span, else at the root of a new trace. A request that is not
    an HTTP call (a WebSocket message, a background run) starts a trace of its own."""
    if request is None:
        return None, SpanKind.SERVER
    ambient = trace.get_current_span()
    if ambient.get_span_context().is_valid:
        return ambient, SpanKind.INTERNAL
    return request.headers, SpanKind.SERVER


@contextlib.contextmanager
def current(observed: Observed | None) -> Iterator[None]:
    """The request's span as the current one inside (the tool calls' NATS headers carry it)."""
    with telemetry.current(observed.span if observed is not None else None):
        yield
