"""POST /v1/chat/completions."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from opentelemetry.trace import use_span as trace_use_span

from services.common import metrics, telemetry
from services.common.bus import BusFailure
from services.gateway.chat.convert import offered_tools, to_encode_request, to_sampling
from services.gateway.chat.models import ChatRequest
from services.gateway.chat.respond import ChatState, usage_json
from services.gateway.context import get_ctx
from services.gateway.errors import ApiError
from services.gateway.pipeline import Generation
from services.gateway.streaming import first_then_rest, wait_disconnect
from services.gateway.validation import parse_body

router = APIRouter()

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _chunk(base: dict[str, Any], delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
    body = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                 "finish_reason": finish_reason}]}
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Any:
    ctx = get_ctx(request)
    body = parse_body(await request.body(), ChatRequest)
    ctx.check_model(body.model)
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    encode = to_encode_request(body, request_id)
    sampling = to_sampling(body, ctx.settings.default_max_tokens)
    names, schemas = offered_tools(body)
    start = ctx.pipeline.start(request_id, encode, sampling, tool_names=names, tool_schemas=schemas)
    span = telemetry.tracer().start_span(f"chat {body.model}", attributes={
        telemetry.GEN_AI_OPERATION: "chat", telemetry.GEN_AI_SYSTEM: "openai",
        telemetry.GEN_AI_REQUEST_MODEL: body.model, telemetry.GEN_AI_RESPONSE_ID: request_id,
    })
    with trace_use_span(span, end_on_exit=not body.stream):
        return await _respond(request, ctx, body, request_id, start, span)


async def _respond(request: Request, ctx: Any, body: ChatRequest, request_id: str, start: Any,
                   span: Any) -> Any:
    if body.stream:
        holder: list[Generation] = []
        stream = _stream(start, body, request_id, holder, span)
        first = await anext(stream)  # setup errors surface here, as a proper HTTP status
        return StreamingResponse(
            first_then_rest(first, stream), media_type="text/event-stream",
            headers={**SSE_HEADERS, **server_timing(holder[0])},
        )
    async with start as generation:
        collect = asyncio.ensure_future(_collect(generation))
        gone = asyncio.ensure_future(wait_disconnect(request))
        done, _ = await asyncio.wait({collect, gone}, return_when=asyncio.FIRST_COMPLETED)
        if collect not in done:
            collect.cancel()
            return JSONResponse({}, status_code=499)  # the client is gone; the engine is aborted
        gone.cancel()
        state = collect.result()
        _record(span, state)
    if state.failed is not None and not (state.content or state.tools or state.reasoning):
        raise BusFailure(state.failed.error)
    body_json = {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.model,
        "system_fingerprint": None,
        "choices": [
            {"index": 0, "message": state.message(), "logprobs": None,
             "finish_reason": state.finish_reason}
        ],
        "usage": usage_json(state.finished.usage if state.finished else None),
    }
    return JSONResponse(body_json, headers=server_timing(generation))


async def _collect(generation: Generation) -> ChatState:
    state = ChatState()
    async for batch in generation.batches():
        state.apply(batch)
    return state


def _record(span: Any, state: ChatState) -> None:
    """GenAI semantic-convention attributes and metrics for the finished request."""
    metrics.REQUESTS.labels("chat", "failed" if state.failed else state.finish_reason).inc()
    if state.finished is not None:
        metrics.OUTPUT_TOKENS.labels("chat").inc(state.finished.usage.completion_tokens)
    if state.finished is not None:
        span.set_attribute(telemetry.GEN_AI_USAGE_INPUT_TOKENS, state.finished.usage.prompt_tokens)
        span.set_attribute(telemetry.GEN_AI_USAGE_OUTPUT_TOKENS, state.finished.usage.completion_tokens)
    span.set_attribute(telemetry.GEN_AI_RESPONSE_FINISH_REASONS, [state.finish_reason])


def server_timing(generation: Generation) -> dict[str, str]:
    """How long set-up took on the bus (encode incl. prompt rendering, and engine accept)."""
    t = generation.timings
    return {"Server-Timing": f"encode;dur={t.encode_ms:.3f}, render;dur={t.render_ms:.3f}, "
                             f"accept;dur={t.accept_ms:.3f}"}


async def _stream(
    start: Any, body: ChatRequest, request_id: str, holder: list[Generation], span: Any
) -> AsyncIterator[bytes]:
    try:
        async for chunk in _stream_chunks(start, body, request_id, holder, span):
            yield chunk
    finally:
        span.end()


async def _stream_chunks(
    start: Any, body: ChatRequest, request_id: str, holder: list[Generation], span: Any
) -> AsyncIterator[bytes]:
    base = {"id": request_id, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": body.model, "system_fingerprint": None}
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    async with start as generation:
        holder.append(generation)
        yield _chunk(base, {"role": "assistant", "content": ""})
        state = ChatState()
        async for batch in generation.batches():
            for delta in state.apply(batch):
                yield _chunk(base, delta)
        _record(span, state)
        if state.failed is not None:
            yield b"data: " + json.dumps(state.failed.error.openai_body()).encode() + b"\n\n"
        else:
            yield _chunk(base, {}, state.finish_reason)
            if include_usage:
                usage = usage_json(state.finished.usage if state.finished else None)
                yield b"data: " + json.dumps({**base, "choices": [], "usage": usage}).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


__all__ = ["router", "ApiError"]
