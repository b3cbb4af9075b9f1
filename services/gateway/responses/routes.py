"""/v1/responses: thin transports over one ``ResponseRun``.

JSON (run to the end, answer the object), SSE (each event as it comes), background (detached
from the connection, events to a Redis stream any replica can replay). Retrieval, replay,
cancel, delete and input items read what the run stored."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

import orjson
from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from redis.exceptions import RedisError

from contracts.messages.control import CancelResponse
from services.common.errors import ChorusError
from services.gateway.context import GatewayContext, get_ctx
from services.gateway.errors import invalid, not_found
from services.gateway.listing import page
from services.gateway.responses.background import Background
from services.gateway.responses.compaction import CompactRequest, compact
from services.gateway.responses.events import Event
from services.gateway.responses.items import input_item
from services.gateway.responses.persist import dump, finish, stored_body
from services.gateway.responses.prepare import prepare
from services.gateway.responses.request import ResponsesRequest
from services.gateway.responses.response import TERMINAL_EVENTS
from services.gateway.responses.run import ResponseRun
from services.gateway.responses.websocket import Socket
from services.gateway.store import EventLog, Responses, StoredResponse
from services.gateway.streaming import ClientGone, EventStream, unless_client_leaves
from services.gateway.validation import parse_body

log = logging.getLogger("chorus.gateway.responses")
router = APIRouter()
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
TERMINAL = (b"response.completed", b"response.incomplete", b"response.failed", b"error")
FINISHED = ("completed", "incomplete", "failed", "cancelled")


def sse(data: bytes, kind: bytes) -> bytes:
    return b"event: " + kind + b"\ndata: " + data + b"\n\n"


def json_response(model: BaseModel, status_code: int = 200) -> Response:
    return Response(dump(model), status_code=status_code, media_type="application/json")


async def startup(ctx: GatewayContext) -> Background:
    """The background runner of this gateway, started (the app keeps it in ``app.state``)."""
    background = Background(ctx, ctx.settings.instance_id)
    await background.start()
    return background


@router.post("/v1/responses")
async def create_response(request: Request) -> Response:
    ctx = get_ctx(request)
    req = parse_body(await request.body(), ResponsesRequest)
    sealer = ctx.sealer
    store = ctx.store_for(request)
    run = ResponseRun(ctx, await prepare(ctx, req, store, unseal=sealer.open), seal=sealer.seal)
    seen = run.observe(request)
    if req.background:
        queued = run.response("queued")
        await store.save_response(StoredResponse(response=stored_body(queued)), [])
        background: Background = request.app.state.background
        await background.submit(run)
        return json_response(queued)
    batches = run.events()
    try:
        first = await anext(batches)  # failures before the first token surface as HTTP errors
    except BaseException as exc:
        seen.finish(outcome="failed", error=_why(exc))
        raise
    if req.stream:
        return EventStream(stream_events(run, first, batches, persist=req.stored), headers=SSE_HEADERS)
    try:  # a failure of the run is raised, never stored as a "completed" response
        await unless_client_leaves(request, _drain(batches))
    except ClientGone:  # the client left: the run is cancelled (and the engine aborted)
        seen.finish(outcome="client_gone")
        return JSONResponse({}, status_code=499)
    except BaseException as exc:
        seen.finish(outcome="failed", error=_why(exc))
        raise
    if run.refused is not None:  # e.g. SGLang refuses in its stream: still the caller's 4xx
        raise ChorusError.of(run.refused)
    await finish(run)
    return json_response(run.response())


def _why(exc: BaseException) -> str:
    return getattr(getattr(exc, "error", None), "message", None) or type(exc).__name__


async def _drain(batches: AsyncIterator[list[Event]]) -> None:
    async for _ in batches:
        pass


async def stream_events(
    run: ResponseRun, first: list[Event], batches: AsyncIterator[list[Event]], *, persist: bool
) -> AsyncIterator[bytes]:
    """The run's events as SSE. A stored response is saved before its terminal event goes out:
    if storage fails the stream ends with ``response.failed`` saying so, never silently. Its
    event log (for replays) is written just after each batch goes out, not before: the client's
    first bytes do not wait for a Redis round trip, and the log is written while the stream
    waits for the model anyway."""
    log_events = StoredLog(run, persist)
    try:
        batch: list[Event] | None = first
        while batch is not None:
            # the terminal batch: the log is whole (each batch was written just after it went out)
            terminal = run.status != "in_progress" and batch and batch[-1].type in TERMINAL_EVENTS
            if terminal and not (log_events.ok and await _saved(run)):
                log_events.ok = False
                batch = [*batch[:-1], run.storage_failed(batch[-1])]
            encoded = [(dump(e), e.type.encode()) for e in batch]
            log_events.pending += [data for data, _ in encoded]
            yield b"".join(sse(data, kind) for data, kind in encoded)
            await log_events.write()
            batch = await anext(batches, None)
    except Exception:  # the stream ends with the spec's error event, numbered
        log.exception("response %s: its stream broke off", run.response_id)
        broken = run.broken("The server failed to continue this response; it has been logged.")
        yield sse(dump(broken), b"error")
    finally:
        await log_events.write()  # what the client was sent, even when it left
        with contextlib.suppress(Exception):  # the run's own failure was told already
            await batches.aclose()  # type: ignore[attr-defined]
        if run.status == "in_progress" and run.observed is not None:
            run.observed.finish(outcome="client_gone")


class StoredLog:
    """A stored streaming response's event log, written behind the stream; ``ok`` is False
    from the first write that failed (the response's terminal event then says so)."""

    def __init__(self, run: ResponseRun, persist: bool) -> None:
        self.run = run
        self.persist = persist
        self.ok = True
        self.pending: list[bytes] = []

    async def write(self) -> None:
        pending, self.pending = self.pending, []
        if not (pending and self.persist and self.ok):
            return
        try:
            await self.run.prepared.store.append_events(self.run.response_id, pending)
        except RedisError:
            log.warning("response %s: its events could not be stored", self.run.response_id, exc_info=True)
            self.ok = False


async def _saved(run: ResponseRun) -> bool:
    try:
        await finish(run)
    except RedisError:
        log.warning("response %s could not be stored", run.response_id, exc_info=True)
        return False
    return True


async def _stored(store: Responses, response_id: str) -> StoredResponse:
    record = await store.get_response(response_id)
    if record is None:
        raise not_found(f"Response with id '{response_id}' not found.", "response_id")
    return record


@router.post("/v1/responses/compact")
async def compact_response(request: Request) -> Any:
    """The conversation condensed: its user messages and a sealed ``compaction`` item."""
    ctx = get_ctx(request)
    req = parse_body(await request.body(), CompactRequest)
    sealer = ctx.sealer
    body = await compact(ctx, req, ctx.store_for(request), unseal=sealer.open, seal=sealer.seal)
    return Response(orjson.dumps(body), media_type="application/json")


@router.get("/v1/responses/{response_id}")
async def retrieve_response(
    response_id: str, request: Request, stream: bool = False, starting_after: int | None = None
) -> Any:
    ctx = get_ctx(request)
    store = ctx.store_for(request)
    record = await _stored(store, response_id)
    if not stream:
        return JSONResponse(record.response.model_dump())
    after = starting_after if starting_after is not None else -1
    return EventStream(replay(ctx, store, response_id, after), headers=SSE_HEADERS)


class Replayable(EventLog, Responses, Protocol):
    """What a replay reads: the event log, and the response when the log has no more."""


async def replay(ctx: GatewayContext, store: Replayable, response_id: str, after_seq: int) -> AsyncIterator[bytes]:
    """Stored events after ``after_seq``, then live ones until the terminal event. The first
    read does not wait: a finished response without an event log ends the stream at once."""
    cursor = "0"
    block_ms = 0
    idle_deadline = time.monotonic() + ctx.settings.idle_timeout_s
    while time.monotonic() < idle_deadline:
        entries = await store.read_events(response_id, cursor, block_ms=block_ms)
        block_ms = 1000
        for entry_id, data in entries:
            cursor = entry_id
            idle_deadline = time.monotonic() + ctx.settings.idle_timeout_s
            event = orjson.loads(data)
            kind = str(event.get("type", "")).encode()
            if event.get("sequence_number", -1) > after_seq:
                yield sse(data, kind)
            if kind in TERMINAL:
                return
        if not entries:
            record = await store.get_response(response_id)
            if record is None or record.response.status in FINISHED:
                return  # gone, or finished without a stored event log (nothing to replay)


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> Any:
    store = get_ctx(request).store_for(request)
    if not await store.delete_response(response_id):
        raise not_found(f"Response with id '{response_id}' not found.", "response_id")
    return {"id": response_id, "object": "response.deleted", "deleted": True}


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(response_id: str, request: Request) -> Any:
    ctx = get_ctx(request)
    store = ctx.store_for(request)
    record = await _stored(store, response_id)
    if not record.response.background:
        raise invalid("Only background responses can be cancelled.", "response_id")
    if record.response.status in ("queued", "in_progress"):
        await store.request_cancel(response_id)
        await ctx.bus.publish(ctx.bus.subjects.response_cancel, CancelResponse(response_id=response_id))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            record = await _stored(store, response_id)
            if record.response.status not in ("queued", "in_progress"):
                break
            await store.read_events(response_id, "$", block_ms=200)
    return JSONResponse(record.response.model_dump())


@router.get("/v1/responses/{response_id}/input_items")
async def input_items(
    response_id: str,
    request: Request,
    limit: int = 20,
    order: str = "desc",
    after: str | None = None,
    before: str | None = None,
) -> Any:
    store = get_ctx(request).store_for(request)
    record = await _stored(store, response_id)
    items = await store.items(record.input_ids)
    return page(
        [input_item(i).model_dump(by_alias=True, exclude_unset=True) for i in items], limit, order, after, before
    )


@router.websocket("/v1/responses")
async def responses_socket(ws: WebSocket) -> None:
    """WebSocket mode: ``response.create`` events in, the stream events out."""
    ctx: GatewayContext = ws.app.state.ctx
    tenant = ws.scope.get("state", {}).get("tenant")
    await Socket(ctx, ws, ctx.store.scoped(tenant)).serve()
