"""One generation's engine call as a GenAI client span (``text_completion {model}``), under the
request's span (the trace context the generation carries).

It starts when the dispatcher takes the request (worker selection and the engine's accept
count in it), names the engine that took it, marks the first output token with an event
(and ``gen_ai.response.time_to_first_chunk``), and ends with the finish reason and usage of the
final batch, or the failure."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

from opentelemetry.trace import SpanKind

from contracts.errors import BusError
from contracts.messages.generate import GenerateRequest, TokenBatch
from services.common import telemetry
from services.common.metrics import ENGINE_PROMPT_TOKENS


class EngineSpan:
    def __init__(self, req: GenerateRequest) -> None:
        sampling = req.sampling
        self._started = time.monotonic()
        self._first = False
        self.engine: str | None = None
        self.span = telemetry.child_span(
            f"text_completion {req.model}",
            req.trace,
            SpanKind.CLIENT,
            **{
                telemetry.GEN_AI_OPERATION: "text_completion",
                telemetry.GEN_AI_REQUEST_MODEL: req.model,
                telemetry.GEN_AI_REQUEST_MAX_TOKENS: sampling.max_tokens,
                telemetry.GEN_AI_REQUEST_TEMPERATURE: sampling.temperature,
                telemetry.GEN_AI_REQUEST_TOP_P: sampling.top_p,
                "chorus.generation_id": req.generation_id,
                "chorus.resumed_tokens": len(req.resume_tokens) or None,
            },
        )

    def accepted(self, url: str, kind: str, expected_cached: int = 0) -> None:
        """The engine at ``url`` took the request, expected to hold ``expected_cached`` of its
        prompt tokens (the routing view's)."""
        where = urlsplit(url)
        self.engine = url
        self.span.set_attributes(
            {
                telemetry.GEN_AI_PROVIDER_NAME: kind,
                "chorus.engine.worker": url,
                "chorus.engine.expected_cached_tokens": expected_cached,
                "server.address": where.hostname or url,
            }
        )
        if where.port is not None:
            self.span.set_attribute("server.port", where.port)

    def batch(self, batch: TokenBatch) -> None:
        """A batch on its way to the parser: the first tokens, or the end."""
        if not self._first and batch.token_ids and batch.open is None:
            self._first = True
            self.span.add_event(telemetry.FIRST_TOKEN)
            self.span.set_attribute(telemetry.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, time.monotonic() - self._started)
        if not batch.done:
            return
        if batch.finish_reason is not None:
            self.span.set_attribute(telemetry.GEN_AI_RESPONSE_FINISH_REASONS, [batch.finish_reason])
        if batch.usage is not None:
            usage = batch.usage
            self.span.set_attribute(telemetry.GEN_AI_USAGE_INPUT_TOKENS, usage.prompt_tokens)
            self.span.set_attribute(telemetry.GEN_AI_USAGE_OUTPUT_TOKENS, usage.completion_tokens)
            if usage.cached_tokens is not None:
                self.span.set_attribute("gen_ai.usage.cache_read.input_tokens", usage.cached_tokens)
            if self.engine is not None:  # as the engine reported them
                cached = usage.cached_tokens or 0
                ENGINE_PROMPT_TOKENS.labels(self.engine, "cached").inc(cached)
                ENGINE_PROMPT_TOKENS.labels(self.engine, "prefilled").inc(max(0, usage.prompt_tokens - cached))
        if batch.error is not None:
            self.failed(batch.error)

    def failed(self, error: BusError) -> None:
        telemetry.failed(self.span, error.code.value, error.message)

    def end(self) -> None:
        self.span.end()
