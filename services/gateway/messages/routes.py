"""Anthropic's Messages API: ``POST /v1/messages`` (one ``MessagesRun``, answered whole or as
Anthropic's SSE events) and ``POST /v1/messages/count_tokens`` (the exact prompt token count
the same request renders to, from an encoder). ``?beta=true``, ``anthropic-version`` and
``anthropic-beta`` are accepted; keys come as ``x-api-key`` or a bearer token (the edge);
errors are Anthropic's shapes and statuses (the app's handlers, for these paths)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import TypeAdapter

from contracts.errors import BusError
from contracts.messages.encode import CountRequest, TokenCount
from services.common.errors import ChorusError
from services.gateway.context import get_ctx
from services.gateway.messages.events import message_bytes
from services.gateway.messages.items import to_encode_request
from services.gateway.messages.request import parse_request, validate_request
from services.gateway.messages.run import MessagesRun
from services.gateway.streaming import ClientGone, EventStream, unless_client_leaves
from services.gateway.validation import parse_json

router = APIRouter()

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
COUNT_REPLY: TypeAdapter[TokenCount | BusError] = TypeAdapter(TokenCount | BusError)
COUNT_BUDGET = 1 << 30


@router.post("/v1/messages")
async def create_message(request: Request) -> Response:
    ctx = get_ctx(request)
    body = parse_request(await request.body(), ignore_unknown=ctx.settings.ignore_unknown_fields)
    run = MessagesRun(ctx, body, request)
    try:
        return await (_streamed(run) if body.stream else _whole(run, request))
    except BaseException as exc:
        run.observed.finish(outcome="failed", error=getattr(getattr(exc, "error", None), "message", type(exc).__name__))
        raise


async def _whole(run: MessagesRun, request: Request) -> Response:
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
    return Response(message_bytes(run.stream), media_type="application/json")


async def _streamed(run: MessagesRun) -> Response:
    stream = _events(run)
    first = await anext(stream)  # set-up errors surface here, as a proper HTTP status

    async def rest() -> AsyncIterator[bytes]:
        try:
            yield first
            async for chunk in stream:
                yield chunk
        finally:
            await stream.aclose()
            run.observed.finish(outcome="client_gone")  # no-op when the stream ended normally

    return EventStream(rest(), headers=SSE_HEADERS)


async def _events(run: MessagesRun) -> AsyncGenerator[bytes, None]:
    async with run.opened():
        yield run.start()
        async for chunk in run.events():
            yield chunk
    failure = run.failure()
    run.finish(failure)
    yield run.stream.error(failure) if failure is not None else run.stream.finish()


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request) -> Response:
    """``{"input_tokens": N}``: what the request's prompt renders to, exactly (``max_tokens``
    is not needed here, as Anthropic's endpoint does not take it)."""
    ctx = get_ctx(request)
    data = parse_json(await request.body())
    if isinstance(data, dict):  # the one field a count does not need: any budget will do
        data.setdefault("max_tokens", COUNT_BUDGET)
    body = validate_request(data, ignore_unknown=ctx.settings.ignore_unknown_fields)
    encode = to_encode_request(body, unseal=ctx.sealer.open).model_copy(update={"model": ctx.served_model(body.model)})
    reply = await ctx.bus.request(
        ctx.bus.subjects.encoder_count,
        CountRequest(encode=encode),
        COUNT_REPLY,
        timeout=ctx.settings.bus_timeout_s,
        service="encoder",
    )
    assert isinstance(reply, TokenCount)  # a BusError reply was raised
    return JSONResponse({"input_tokens": reply.tokens})
