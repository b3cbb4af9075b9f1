"""POST /v1/chat/completions: one generation, answered whole (a ChatCompletion) or streamed
(ChatCompletionChunk SSE: the envelope serialised once, each delta spliced into it)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from contracts.errors import BusError, ErrorCode
from contracts.messages.encode import ResponseFormat
from contracts.messages.generate import ParseSpec
from services.common.bus import BusFailure
from services.common.telemetry import carrier_of
from services.gateway import structured
from services.gateway.chat.convert import offered_tools, response_format_of, to_encode_request, to_sampling
from services.gateway.chat.models import ChatRequest
from services.gateway.chat.respond import ChatState, usage_json
from services.gateway.context import GatewayContext, get_ctx
from services.gateway.errors import public
from services.gateway.generation import Generation, GenerationSpec
from services.gateway.observe import Observed
from services.gateway.streaming import ClientGone, EventStream, unless_client_leaves
from services.gateway.validation import parse_body

router = APIRouter()

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DONE = b"data: [DONE]\n\n"


class ChunkWriter:
    """SSE chunks of one streamed completion: the envelope is serialised once, each delta is
    spliced into it (a chunk per parser batch is on every token's path). Every chunk is a
    valid ChatCompletionChunk (a test checks). With ``include_usage`` every chunk but the last
    carries ``"usage": null``, as OpenAI's do."""

    def __init__(self, base: dict[str, Any], *, include_usage: bool = False) -> None:
        head = orjson.dumps({**base, "choices": [{"index": 0, "delta": None}]})
        self._head = b"data: " + head[: head.rindex(b"null")]
        self._end = b'}],"usage":null}\n\n' if include_usage else b"}]}\n\n"
        self._tail = b',"logprobs":null,"finish_reason":null' + self._end
        self.base = base

    def delta(self, delta: dict[str, Any]) -> bytes:
        return self._head + orjson.dumps(delta) + self._tail

    def finish(self, finish_reason: str) -> bytes:
        return self._head + b'{},"logprobs":null,"finish_reason":' + orjson.dumps(finish_reason) + self._end

    def usage(self, state: ChatState) -> bytes:
        usage = usage_json(state.finished.usage if state.finished else None)
        return b"data: " + orjson.dumps({**self.base, "choices": [], "usage": usage}) + b"\n\n"


def sse_error(error: BusError) -> bytes:
    return b"data: " + orjson.dumps(public(error).openai_body()) + b"\n\n"


def format_failure(state: ChatState, fmt: ResponseFormat | None) -> BusError | None:
    """The answer did not follow the requested format (the grammar should have made it)."""
    if fmt is None or state.failed is not None or state.tools or state.finish_reason != "stop":
        return None
    why = structured.check(state.text, fmt)
    return (
        None
        if why is None
        else BusError(code=ErrorCode.ENGINE_ERROR, message=f"The model's answer did not follow response_format: {why}")
    )


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    ctx = get_ctx(request)
    body = parse_body(await request.body(), ChatRequest)
    ctx.check_model(body.model)
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    fmt = response_format_of(body)
    sampling = to_sampling(body, ctx.settings.default_max_tokens, fmt)
    names, schemas = offered_tools(body)
    seen = Observed.start(
        request,
        api="chat",
        model=body.model,
        request_id=request_id,
        stream=body.stream,
        max_tokens=sampling.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
    )
    spec = GenerationSpec(
        to_encode_request(body, fmt),
        sampling,
        ParseSpec(request_id=request_id, tool_names=names, tool_schemas=schemas),
        trace=carrier_of(seen.span),
    )
    try:
        if body.stream:
            return await _streamed(ctx, body, spec, request_id, seen, fmt)
        return await _whole(ctx, request, body, spec, request_id, seen, fmt)
    except BaseException as exc:
        seen.finish(outcome="failed", error=getattr(getattr(exc, "error", None), "message", type(exc).__name__))
        raise


async def _whole(
    ctx: GatewayContext,
    request: Request,
    body: ChatRequest,
    spec: GenerationSpec,
    request_id: str,
    seen: Observed,
    fmt: ResponseFormat | None,
) -> Response:
    async with ctx.generations.open(spec) as generation:
        try:
            state = await unless_client_leaves(request, _collect(generation, seen))
        except ClientGone:  # leaving the context aborts the engine
            seen.finish(outcome="client_gone")
            return JSONResponse({}, status_code=499)
    worker = generation.accepted.worker if generation.accepted else None
    if state.failed is not None and not (state.content or state.tools or state.reasoning):
        seen.finish(outcome="failed", worker=worker, error=state.failed.error.message)
        raise BusFailure(state.failed.error)
    failure = format_failure(state, fmt)
    if failure is not None:
        seen.finish(outcome="failed", worker=worker, error=failure.message)
        raise BusFailure(failure)
    usage = state.finished.usage if state.finished else None
    seen.finish(outcome=state.finish_reason, usage=usage, finish_reasons=[state.finish_reason], worker=worker)
    completion = state.completion(request_id, body.model, int(time.time()))
    return Response(
        completion.model_dump_json(exclude_unset=True), media_type="application/json", headers=server_timing(generation)
    )


async def _collect(generation: Generation, seen: Observed) -> ChatState:
    state = ChatState()
    async for batch in generation.batches():
        if state.apply(batch):
            seen.first_output()
    return state


def server_timing(generation: Generation) -> dict[str, str]:
    """How long set-up took: prompt rendering, and everything until an engine took it."""
    render = generation.accepted.render_ms if generation.accepted is not None else 0.0
    return {"Server-Timing": f"render;dur={render:.3f}, accept;dur={generation.accept_ms:.3f}"}


async def _streamed(
    ctx: GatewayContext,
    body: ChatRequest,
    spec: GenerationSpec,
    request_id: str,
    seen: Observed,
    fmt: ResponseFormat | None,
) -> Response:
    holder: list[Generation] = []
    stream = _chunks(ctx, body, spec, request_id, holder, seen, fmt)
    first = await anext(stream)  # set-up errors surface here, as a proper HTTP status

    async def rest() -> AsyncIterator[bytes]:
        try:
            yield first
            async for chunk in stream:
                yield chunk
        finally:
            await stream.aclose()
            seen.finish(outcome="client_gone")  # no-op when the stream ended normally

    return EventStream(rest(), headers={**SSE_HEADERS, **server_timing(holder[0])})


async def _chunks(
    ctx: GatewayContext,
    body: ChatRequest,
    spec: GenerationSpec,
    request_id: str,
    holder: list[Generation],
    seen: Observed,
    fmt: ResponseFormat | None,
) -> AsyncGenerator[bytes, None]:
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    chunks = ChunkWriter(
        {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body.model,
            "system_fingerprint": None,
        },
        include_usage=include_usage,
    )
    async with ctx.generations.open(spec) as generation:
        holder.append(generation)
        yield chunks.delta({"role": "assistant", "content": "", "refusal": None})
        state = ChatState()
        async for batch in generation.batches():
            out = b"".join(chunks.delta(delta) for delta in state.apply(batch))
            if out:
                yield out
                seen.first_output()  # once the first output is on its way (off its path)
    worker = generation.accepted.worker if generation.accepted else None
    failure = state.failed.error if state.failed is not None else format_failure(state, fmt)
    usage = state.finished.usage if state.finished else None
    if failure is not None:
        seen.finish(outcome="failed", usage=usage, worker=worker, error=failure.message)
        yield sse_error(failure)
    else:
        seen.finish(outcome=state.finish_reason, usage=usage, finish_reasons=[state.finish_reason], worker=worker)
        yield chunks.finish(state.finish_reason)
        if include_usage:
            yield chunks.usage(state)
    yield DONE
