"""Responses over WebSocket (OpenAI's "WebSocket mode"): one socket to ``/v1/responses``.

The client sends ``response.create`` events (the create body; ``stream: true`` and
``background: false`` are implied and may be sent; ``stream_id`` names a lane) and receives the same events as the SSE stream,
each tagged with its lane. Responses run one after another or side by side (at most
``MAX_ACTIVE``). A continuation sends only its new input and ``previous_response_id``: the
socket keeps every chain it served (``store: false`` ones live only here, so a new socket gets
``previous_response_not_found`` for them; stored ones also come from Redis). A failed
continuation evicts the parent it continued. Errors are ``error`` events; the socket stays
usable. Each response is the same ``ResponseRun`` the HTTP transports drive."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from typing import Any

import orjson
from fastapi import WebSocket, WebSocketDisconnect
from redis.exceptions import RedisError

from contracts.errors import BusError, ErrorCode
from contracts.messages.items import ConversationItem
from services.common.errors import ChorusError
from services.gateway.context import GatewayContext
from services.gateway.edge import access_line
from services.gateway.errors import STORAGE_DOWN, public
from services.gateway.generation import RenderedPrompt
from services.gateway.responses.persist import dump, finish
from services.gateway.responses.prepare import prepare
from services.gateway.responses.request import ResponsesRequest
from services.gateway.responses.run import ResponseRun
from services.gateway.store import ResponseStore
from services.gateway.validation import parse_json, validate

log = logging.getLogger("chorus.gateway.websocket")

MAX_ACTIVE = 16  # responses running at once on one socket
MAX_LANES = 32  # distinct stream_ids on one socket
MAX_CHAINS = 256  # chains a socket remembers (the oldest are forgotten first)
LIFETIME_S = 60 * 60  # a socket is closed after an hour, as OpenAI's are
PATH = "/v1/responses"


class Socket:
    """One client's WebSocket and what it holds: its chains, its running responses."""

    def __init__(self, ctx: GatewayContext, ws: WebSocket, store: ResponseStore) -> None:
        self.ctx = ctx
        self.ws = ws
        self.store = store
        self.chains: OrderedDict[str, list[ConversationItem]] = OrderedDict()
        # each chain's last prompt as a worker remembers it: the next turn sends only its new items
        self.prompts: dict[str, RenderedPrompt] = {}
        self.lanes: set[str] = set()
        self.active: set[asyncio.Task[None]] = set()
        self._send_lock = asyncio.Lock()

    async def serve(self) -> None:
        await self.ws.accept()
        deadline = time.monotonic() + LIFETIME_S
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    async with asyncio.timeout(remaining):
                        raw = await self.ws.receive_text()
                except TimeoutError:
                    break
                await self.on_message(raw)
        except WebSocketDisconnect:
            pass
        finally:
            for task in list(self.active):
                task.cancel()
            await asyncio.gather(*self.active, return_exceptions=True)  # their ends, not ours
            with contextlib.suppress(Exception):
                await self.ws.close()

    async def on_message(self, raw: str) -> None:
        lane: str | None = None
        started = time.monotonic()
        try:
            body = raw.encode()
            if len(body) > self.ctx.settings.max_body_bytes:  # the same limit as an HTTP body
                raise ChorusError.of(
                    BusError(
                        code=ErrorCode.REQUEST_TOO_LARGE,
                        message=(
                            f"The event is {len(body)} bytes; at most {self.ctx.settings.max_body_bytes} are accepted."
                        ),
                    )
                )
            data = parse_json(body)
            if not isinstance(data, dict):
                raise ChorusError.of(
                    BusError(code=ErrorCode.INVALID_REQUEST, message="A client event must be a JSON object.")
                )
            kind = data.pop("type", None)
            lane = data.pop("stream_id", None)
            if kind != "response.create":
                raise ChorusError.of(
                    BusError(
                        code=ErrorCode.INVALID_REQUEST,
                        param="type",
                        message=f"Unsupported client event type {kind!r}: send 'response.create'.",
                    )
                )
            if lane is not None and lane not in self.lanes:
                if len(self.lanes) >= MAX_LANES:
                    raise ChorusError.of(
                        BusError(
                            code=ErrorCode.INVALID_REQUEST,
                            param="stream_id",
                            message=f"At most {MAX_LANES} streams per connection.",
                        )
                    )
                self.lanes.add(lane)
            # events always stream here: "stream": true is implicit (both Agents SDKs send it in
            # every frame) and "background": false is the only way a socket runs a response
            for field, implied in (("stream", True), ("background", False)):
                value = data.pop(field, None)
                if value is not None and value is not implied:
                    raise ChorusError.of(
                        BusError(
                            code=ErrorCode.INVALID_REQUEST,
                            param=field,
                            message=f"'{field}': {orjson.dumps(value).decode()} is not supported over WebSocket "
                            "(events always stream; background is HTTP only).",
                        )
                    )
            generate = data.pop("generate", True)
            if len(self.active) >= MAX_ACTIVE:
                raise ChorusError.of(
                    BusError(
                        code=ErrorCode.INVALID_REQUEST,
                        message=f"At most {MAX_ACTIVE} responses may run at once on a connection.",
                    )
                )
            req = validate(data, ResponsesRequest, ignore_unknown=self.ctx.settings.ignore_unknown_fields)
            run = await self._prepare(req)
        except ChorusError as exc:
            self._refused(exc.error, started)
            await self.send_error(exc.error, lane)
            return
        except RedisError:
            self._refused(STORAGE_DOWN, started)
            await self.send_error(STORAGE_DOWN, lane)
            return
        task = asyncio.get_running_loop().create_task(self._run(run, lane, generate=generate is not False))
        self.active.add(task)
        task.add_done_callback(self.active.discard)

    async def _prepare(self, req: ResponsesRequest) -> ResponseRun:
        # a chain served here continues from the socket; any other from the store (or a 404)
        parent = req.previous_response_id
        context = self.chains.get(parent) if parent is not None else None
        if parent is not None and context is not None:
            self.chains.move_to_end(parent)
        sealer = self.ctx.sealer
        prepared = await prepare(self.ctx, req, self.store, unseal=sealer.open, context=context)
        run = ResponseRun(self.ctx, prepared, seal=sealer.seal, remember=True)
        if context is not None and parent is not None:
            run.rendered = self.prompts.get(parent)
        run.observe(None).access = ("WS", PATH, run.response_id)
        return run

    def _refused(self, error: BusError, started: float) -> None:
        """The access line of a ``response.create`` refused before it ran."""
        notes = {"api": "responses", "reason": error.message[:200]}
        access_line("WS", PATH, error.code.http_status, time.monotonic() - started, "-", notes)

    async def _run(self, run: ResponseRun, lane: str | None, *, generate: bool) -> None:
        parent = run.request.previous_response_id
        try:
            if generate:
                async for batch in run.events():
                    await self.send_events(batch, lane)
            else:  # the context is set up for later turns; the model is not asked
                run.status = "completed"
                await self.send_events([run.final_event()], lane)
            if run.status == "failed" and parent is not None:
                self._forget(parent)
            await finish(run)
            self._remember(run)
        except ChorusError as exc:
            if parent is not None:
                self._forget(parent)
            await self.send_error(exc.error, lane)
        except RedisError:
            await self.send_error(STORAGE_DOWN, lane)
        except (WebSocketDisconnect, RuntimeError):
            pass  # the client left: leaving the run cancels its generation

    def _remember(self, run: ResponseRun) -> None:
        self.chains[run.response_id] = run.conversation()
        if run.rendered is not None:
            self.prompts[run.response_id] = run.rendered
        while len(self.chains) > MAX_CHAINS:
            self._forget(next(iter(self.chains)))

    def _forget(self, response_id: str) -> None:
        self.chains.pop(response_id, None)
        self.prompts.pop(response_id, None)

    async def send_events(self, events: list[Any], lane: str | None) -> None:
        async with self._send_lock:
            for event in events:
                data = dump(event)
                if lane is not None:
                    data = data[:-1] + b',"stream_id":' + orjson.dumps(lane) + b"}"
                await self.ws.send_text(data.decode())

    async def send_error(self, error: BusError, lane: str | None) -> None:
        shown = public(error)
        code = (
            "previous_response_not_found"
            if error.param == "previous_response_id" and error.code == ErrorCode.NOT_FOUND
            else shown.code.value
        )
        event: dict[str, Any] = {
            "type": "error",
            "status": shown.code.http_status,
            "error": {"type": shown.code.openai_type, "code": code, "message": shown.message, "param": shown.param},
        }
        if lane is not None:
            event["stream_id"] = lane
        async with self._send_lock:
            with contextlib.suppress(Exception):
                await self.ws.send_text(orjson.dumps(event).decode())
