"""POST /v1/chat/completions: one ``ChatRun``, answered whole (a ChatCompletion) or streamed
(ChatCompletionChunk SSE: the envelope serialised once, each delta spliced into it)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from contracts.errors import BusError
from services.common.errors import ChorusError
from services.gateway.chat.request import ChatRequest
from services.gateway.chat.run import ChatRun
from services.gateway.context import get_ctx
from services.gateway.errors import public
from services.gateway.streaming import ClientGone, EventStream, unless_client_leaves
from services.gateway.validation import parse_body

router = APIRouter()

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DONE = b"data: [DONE]\n\n"


def sse_error(error: BusError) -> bytes:
    return b"data: " + orjson.dumps(public(error).openai_body()) + b"\n\n"


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    ctx = get_ctx(request)
    body = parse_body(await request.body(), ChatRequest)
    ctx.check_model(body.model)
    run = ChatRun(ctx, body, request)
    try:
        return await (_streamed(run) if body.stream else _whole(run, request))
    except BaseException as exc:
        run.observed.finish(outcome="failed", error=getattr(getattr(exc, "error", None), "message", type(exc).__name__))
        raise


async def _whole(run: ChatRun, request: Request) -> Response:
    async with run.opened():
        try:
            await unless_client_leaves(request, run.drain())
        except ClientGone:  # leaving the context aborts the engine
            run.observed.finish(outcome="client_gone")
            return JSONResponse({}, status_code=499)
    failure = run.failure()
    run.finish(failure)
    if failure is not None:
        raise ChorusError.of(failure)
    return Response(run.completion(), media_type="application/json", headers=run.server_timing())


async def _streamed(run: ChatRun) -> Response:
    stream = _chunks(run)
    first = await anext(stream)  # set-up errors surface here, as a proper HTTP status

    async def rest() -> AsyncIterator[bytes]:
        try:
            yield first
            async for chunk in stream:
                yield chunk
        finally:
            await stream.aclose()
            run.observed.finish(outcome="client_gone")  # no-op when the stream ended normally

    return EventStream(rest(), headers={**SSE_HEADERS, **run.server_timing()})


async def _chunks(run: ChatRun) -> AsyncGenerator[bytes, None]:
    chunks = run.chunks()
    async with run.opened():
        yield chunks.delta({"role": "assistant", "content": "", "refusal": None})
        async for deltas in run.deltas():
            out = b"".join(chunks.delta(delta) for delta in deltas)
            if out:
                yield out
    failure = run.failure()
    run.finish(failure)
    if failure is not None:
        yield sse_error(failure)
    else:
        yield chunks.finish(run.state.finish_reason)
        if chunks.include_usage:
            yield chunks.usage(run.state)
    yield DONE
