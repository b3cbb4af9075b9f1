"""/v1/responses and /v1/conversations."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from contracts.messages.items import ConversationItem
from services.gateway.context import GatewayContext, get_ctx
from services.gateway.errors import invalid, not_found
from services.gateway.responses import convert
from services.gateway.responses.models import ResponsesRequest
from services.gateway.responses.orchestrate import ResponseRun, prepare
from services.gateway.streaming import wait_disconnect
from services.gateway.validation import parse_body

log = logging.getLogger("chorus.gateway.responses")
router = APIRouter()
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
TERMINAL = ("response.completed", "response.incomplete", "response.failed", "error")


def _sse(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


class Background:
    """Background responses run here, detached from any HTTP connection."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()

    def start(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def stop(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        for task in list(self.tasks):
            with contextlib.suppress(BaseException):
                await task


async def startup(ctx: GatewayContext) -> None:
    ctx.background = Background()  # type: ignore[attr-defined]


async def shutdown(ctx: GatewayContext) -> None:
    background = getattr(ctx, "background", None)
    if background is not None:
        await background.stop()


async def _finish(ctx: GatewayContext, run: ResponseRun) -> None:
    req = run.request
    if req.store is not False:
        await ctx.store.save_response(run.stored())
    if req.conversation_id:
        await ctx.store.add_conversation_items(req.conversation_id, [*run.p.input_items, *run.writer.output])


@router.post("/v1/responses")
async def create_response(request: Request) -> Any:
    ctx = get_ctx(request)
    req = parse_body(await request.body(), ResponsesRequest)
    prepared = await prepare(ctx, req)
    run = ResponseRun(ctx, prepared)
    persist_events = req.store is not False and bool(req.stream or req.background)
    if req.background:
        queued = run.response("queued")
        await ctx.store.save_response(run.stored().model_copy(update={"response": queued}))
        ctx.background.start(_run_background(ctx, run))  # type: ignore[attr-defined]
        return queued
    events = run.events()
    first = await anext(events)  # failures before the first token surface as HTTP errors
    if req.stream:
        return StreamingResponse(_stream(ctx, run, first, events, persist_events),
                                 media_type="text/event-stream", headers=SSE_HEADERS)
    collect = asyncio.ensure_future(_drain(events))
    gone = asyncio.ensure_future(wait_disconnect(request))
    done, _ = await asyncio.wait({collect, gone}, return_when=asyncio.FIRST_COMPLETED)
    if collect not in done:
        collect.cancel()
        with contextlib.suppress(BaseException):
            await collect
        return JSONResponse({}, status_code=499)
    gone.cancel()
    await _finish(ctx, run)
    return run.response()


async def _drain(events: AsyncIterator[list[dict[str, Any]]]) -> None:
    async for _ in events:
        pass


async def _stream(ctx: GatewayContext, run: ResponseRun, first: list[dict[str, Any]],
                  events: AsyncIterator[list[dict[str, Any]]], persist: bool) -> AsyncIterator[bytes]:
    rid = run.p.response_id
    try:
        batch: list[dict[str, Any]] | None = first
        while batch is not None:
            if persist:
                await ctx.store.append_events(rid, batch)
            for event in batch:
                yield _sse(event)
            batch = await anext(events, None)
    finally:
        with contextlib.suppress(BaseException):
            await events.aclose()  # type: ignore[attr-defined]
        if run.status != "in_progress":
            await _finish(ctx, run)


async def _run_background(ctx: GatewayContext, run: ResponseRun) -> None:
    rid = run.p.response_id
    try:
        try:
            async for batch in run.events():
                await ctx.store.append_events(rid, batch)
        except Exception as exc:  # noqa: BLE001 - a background failure is recorded, not raised
            log.warning("background response %s failed: %s", rid, exc)
            error = getattr(exc, "error", None)
            run._fail(getattr(error, "message", None) or f"{type(exc).__name__}: {exc}")
            final = run.writer.event("response.failed", response=run.response())
            await ctx.store.append_events(rid, [final])
        await _finish(ctx, run)
    except Exception:
        log.exception("background response %s could not be finished", rid)


async def _stored(ctx: GatewayContext, response_id: str) -> Any:
    record = await ctx.store.get_response(response_id)
    if record is None:
        raise not_found(f"Response with id '{response_id}' not found.", "response_id")
    return record


@router.get("/v1/responses/{response_id}")
async def retrieve_response(response_id: str, request: Request, stream: bool = False,
                            starting_after: int | None = None) -> Any:
    ctx = get_ctx(request)
    record = await _stored(ctx, response_id)
    if not stream:
        return record.response
    return StreamingResponse(_replay(ctx, response_id, starting_after if starting_after is not None else -1),
                             media_type="text/event-stream", headers=SSE_HEADERS)


async def _replay(ctx: GatewayContext, response_id: str, after_seq: int) -> AsyncIterator[bytes]:
    """Stored events after ``after_seq``, then live ones until the terminal event."""
    cursor = "0"
    idle_deadline = time.monotonic() + ctx.settings.idle_timeout_s
    while time.monotonic() < idle_deadline:
        entries = await ctx.store.read_events(response_id, cursor, block_ms=1000)
        for entry_id, event in entries:
            cursor = entry_id
            idle_deadline = time.monotonic() + ctx.settings.idle_timeout_s
            if event.get("sequence_number", -1) > after_seq:
                yield _sse(event)
            if event.get("type") in TERMINAL:
                return
        if not entries:
            record = await ctx.store.get_response(response_id)
            if record is None or record.response.get("status") in ("completed", "incomplete", "failed", "cancelled"):
                if cursor != "0" or record is None:
                    return
                # finished without a stored event log (not streamed): nothing to replay
                return


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> Any:
    ctx = get_ctx(request)
    if not await ctx.store.delete_response(response_id):
        raise not_found(f"Response with id '{response_id}' not found.", "response_id")
    return {"id": response_id, "object": "response.deleted", "deleted": True}


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(response_id: str, request: Request) -> Any:
    ctx = get_ctx(request)
    record = await _stored(ctx, response_id)
    if not record.response.get("background"):
        raise invalid("Only background responses can be cancelled.", "response_id")
    if record.response.get("status") in ("queued", "in_progress"):
        await ctx.store.request_cancel(response_id)
        await ctx.pipeline.cancel(response_id, reason="cancelled")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            record = await _stored(ctx, response_id)
            if record.response.get("status") not in ("queued", "in_progress"):
                break
            await ctx.store.read_events(response_id, "$", block_ms=200)
    return record.response


@router.get("/v1/responses/{response_id}/input_items")
async def input_items(response_id: str, request: Request, limit: int = 20, order: str = "desc",
                      after: str | None = None, before: str | None = None) -> Any:
    ctx = get_ctx(request)
    record = await _stored(ctx, response_id)
    return _page([convert.output_json(i) for i in record.input_items], limit, order, after, before)


def _page(items: list[dict[str, Any]], limit: int, order: str, after: str | None,
          before: str | None) -> dict[str, Any]:
    if not 1 <= limit <= 100:
        raise invalid("limit must be between 1 and 100.", "limit")
    if order not in ("asc", "desc"):
        raise invalid("order must be 'asc' or 'desc'.", "order")
    ordered = items if order == "asc" else list(reversed(items))
    ids = [i.get("id") for i in ordered]
    if after is not None:
        if after not in ids:
            raise invalid(f"No item with id '{after}'.", "after")
        ordered = ordered[ids.index(after) + 1:]
    if before is not None:
        ids = [i.get("id") for i in ordered]
        if before in ids:
            ordered = ordered[: ids.index(before)]
    page = ordered[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(ordered) > limit}


# -- conversations ---------------------------------------------------------------------------
def _conversation_items(raw: Any) -> list[ConversationItem]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise invalid("items must be a list.", "items")
    return convert.input_items(raw, {})


async def _conversation(ctx: GatewayContext, conv_id: str) -> dict[str, Any]:
    conv = await ctx.store.get_conversation(conv_id)
    if conv is None:
        raise not_found(f"Conversation with id '{conv_id}' not found.", "conversation_id")
    return conv


async def _json(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise invalid(f"The request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise invalid("The request body must be a JSON object.")
    return data


@router.post("/v1/conversations")
async def create_conversation(request: Request) -> Any:
    ctx = get_ctx(request)
    body = await _json(request)
    unknown = set(body) - {"items", "metadata"}
    if unknown:
        raise invalid(f"Unrecognized request argument supplied: {sorted(unknown)[0]}", sorted(unknown)[0])
    items = _conversation_items(body.get("items"))
    conv = {"id": convert.new_id("conv"), "object": "conversation", "created_at": int(time.time()),
            "metadata": body.get("metadata") or {}}
    await ctx.store.create_conversation(conv, items)
    return conv


@router.get("/v1/conversations/{conv_id}")
async def get_conversation(conv_id: str, request: Request) -> Any:
    return await _conversation(get_ctx(request), conv_id)


@router.post("/v1/conversations/{conv_id}")
async def update_conversation(conv_id: str, request: Request) -> Any:
    ctx = get_ctx(request)
    conv = await _conversation(ctx, conv_id)
    body = await _json(request)
    conv["metadata"] = body.get("metadata") or {}
    await ctx.store.update_conversation(conv)
    return conv


@router.delete("/v1/conversations/{conv_id}")
async def delete_conversation(conv_id: str, request: Request) -> Any:
    ctx = get_ctx(request)
    await _conversation(ctx, conv_id)
    await ctx.store.delete_conversation(conv_id)
    return {"id": conv_id, "object": "conversation.deleted", "deleted": True}


@router.get("/v1/conversations/{conv_id}/items")
async def list_conversation_items(conv_id: str, request: Request, limit: int = 20, order: str = "desc",
                                  after: str | None = None) -> Any:
    ctx = get_ctx(request)
    await _conversation(ctx, conv_id)
    items = await ctx.store.conversation_items(conv_id)
    return _page([convert.output_json(i) for i in items], limit, order, after, None)


@router.post("/v1/conversations/{conv_id}/items")
async def add_conversation_items(conv_id: str, request: Request) -> Any:
    ctx = get_ctx(request)
    await _conversation(ctx, conv_id)
    items = _conversation_items((await _json(request)).get("items"))
    await ctx.store.add_conversation_items(conv_id, items)
    data = [convert.output_json(i) for i in items]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": False}
