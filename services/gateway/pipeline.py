"""One model generation over the bus: encode + open a parser session (concurrently), ask a
dispatcher to generate into that parser, then read the parser's typed events.

    async with pipeline.start(request_id, encode, sampling, ...) as generation:
        async for event in generation.events():
            ...

``start`` raises ``BusFailure`` for anything that goes wrong before tokens flow (bad input,
no engine, a service down), so the HTTP layer can still answer with a proper status code.
Failures after that arrive as a ``Failed`` event. Leaving the context early (client gone,
SSE task cancelled) broadcasts ``Cancel``: the dispatcher aborts the engine request and the
parser drops its session."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from pydantic import TypeAdapter

from contracts.errors import BusError, ErrorCode
from contracts.messages.control import Cancel, Ping, Pong
from contracts.messages.encode import EncodedPrompt, EncodeReply, EncodeRequest
from contracts.messages.generate import (
    GenerateAccepted,
    GenerateReply,
    GenerateRequest,
    SamplingParams,
)
from contracts.messages.parse import (
    Failed,
    Finished,
    ParsedBatch,
    ParseEvent,
    ParseOpen,
    ParseOpened,
    ParseOpenReply,
)
from contracts.subjects import REQUEST_ID_HEADER, Subjects
from services.common import bus

log = logging.getLogger("chorus.gateway")

_ENCODE_REPLY: TypeAdapter[EncodeReply] = TypeAdapter(EncodeReply)
_OPEN_REPLY: TypeAdapter[ParseOpenReply] = TypeAdapter(ParseOpenReply)
_GENERATE_REPLY: TypeAdapter[GenerateReply] = TypeAdapter(GenerateReply)
_PONG: TypeAdapter[Pong] = TypeAdapter(Pong)


class EventRouter:
    """The gateway's single subscription for parser events, demultiplexed by request id."""

    def __init__(self, nc: NatsClient, subject: str) -> None:
        self.nc = nc
        self.subject = subject
        self._queues: dict[str, asyncio.Queue[bytes]] = {}
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(self.subject, cb=self._on_msg, pending_msgs_limit=-1)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    def open(self, request_id: str) -> asyncio.Queue[bytes]:
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._queues[request_id] = queue
        return queue

    def close(self, request_id: str) -> None:
        self._queues.pop(request_id, None)

    async def _on_msg(self, msg: Msg) -> None:
        request_id = (msg.headers or {}).get(REQUEST_ID_HEADER)
        queue = self._queues.get(request_id) if request_id else None
        if queue is not None:
            queue.put_nowait(msg.data)


@dataclass
class Timings:
    encode_ms: float = 0.0
    render_ms: float = 0.0
    accept_ms: float = 0.0


@dataclass
class Generation:
    request_id: str
    prompt: EncodedPrompt
    accepted: GenerateAccepted
    parser: ParseOpened
    _queue: asyncio.Queue[bytes]
    _first_timeout: float
    _idle_timeout: float
    timings: Timings = field(default_factory=Timings)
    finished: bool = False

    async def batches(self) -> AsyncIterator[list[ParseEvent]]:
        """Parser events as the parser sent them, one list per engine batch, until (and
        including) the batch holding ``Finished`` or ``Failed``."""
        expected_seq = 0
        timeout = self._first_timeout
        while not self.finished:
            try:
                raw = await asyncio.wait_for(self._queue.get(), timeout)
            except TimeoutError:
                self.finished = True
                yield [
                    Failed(
                        error=BusError(
                            code=ErrorCode.TIMEOUT,
                            message=f"no output from the model for {timeout:g}s",
                        )
                    )
                ]
                return
            timeout = self._idle_timeout
            batch = ParsedBatch.model_validate_json(raw)
            if batch.seq != expected_seq:
                log.warning("request %s: parser batch %d, expected %d", self.request_id, batch.seq, expected_seq)
            expected_seq = batch.seq + 1
            if any(isinstance(e, Finished | Failed) for e in batch.events):
                self.finished = True
            yield list(batch.events)

    async def events(self) -> AsyncIterator[ParseEvent]:
        """Parser events in order until (and including) ``Finished`` or ``Failed``."""
        async for batch in self.batches():
            for event in batch:
                yield event


class Pipeline:
    def __init__(
        self,
        nc: NatsClient,
        subjects: Subjects,
        router: EventRouter,
        *,
        bus_timeout: float,
        first_token_timeout: float,
        idle_timeout: float,
    ) -> None:
        self.nc = nc
        self.subjects = subjects
        self.router = router
        self.bus_timeout = bus_timeout
        self.first_token_timeout = first_token_timeout
        self.idle_timeout = idle_timeout

    async def cancel(self, request_id: str, reason: str = "client_disconnected") -> None:
        with contextlib.suppress(Exception):
            await self.nc.publish(
                self.subjects.cancel,
                bus.dump(Cancel(request_id=request_id, reason=reason)),
                headers=bus.headers_for(request_id),
            )

    @contextlib.asynccontextmanager
    async def start(
        self,
        request_id: str,
        encode: EncodeRequest,
        sampling: SamplingParams,
        *,
        tool_names: list[str] | None = None,
        namespaces: list[str] | None = None,
        tool_schemas: dict[str, dict] | None = None,
        turn: int = 0,
    ) -> AsyncIterator[Generation]:
        queue = self.router.open(request_id)
        generation: Generation | None = None
        try:
            generation = await self._begin(
                request_id, encode, sampling, queue, tool_names or [], namespaces or [], tool_schemas, turn
            )
            yield generation
        finally:
            self.router.close(request_id)
            if generation is None or not generation.finished:
                await self.cancel(request_id)

    async def _begin(
        self,
        request_id: str,
        encode: EncodeRequest,
        sampling: SamplingParams,
        queue: asyncio.Queue[bytes],
        tool_names: list[str],
        namespaces: list[str],
        tool_schemas: dict[str, dict] | None,
        turn: int,
    ) -> Generation:
        t0 = time.perf_counter()
        open_msg = ParseOpen.model_validate({
            "request_id": request_id,
            "events_subject": self.router.subject,
            "tool_names": tool_names,
            "namespaces": namespaces,
            "tool_schemas": tool_schemas or {},
            "turn": turn,
        })
        results = await asyncio.gather(
            bus.request(
                self.nc, self.subjects.encode, encode, _ENCODE_REPLY,
                request_id=request_id, timeout=self.bus_timeout, service="encoder",
            ),
            bus.request(
                self.nc, self.subjects.parse_open, open_msg, _OPEN_REPLY,
                request_id=request_id, timeout=self.bus_timeout, service="parser",
            ),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        prompt, opened = results
        assert isinstance(prompt, EncodedPrompt) and isinstance(opened, ParseOpened)
        t1 = time.perf_counter()
        generate = GenerateRequest(
            request_id=request_id,
            model=encode.model,
            prompt_token_ids=prompt.token_ids,
            stop_token_ids=prompt.stop_token_ids,
            sampling=sampling,
            selection_text=prompt.selection_text,
            token_subject=opened.token_subject,
        )
        accepted = await bus.request(
            self.nc, self.subjects.generate, generate, _GENERATE_REPLY,
            request_id=request_id, timeout=self.bus_timeout, service="dispatcher",
        )
        assert isinstance(accepted, GenerateAccepted)
        t2 = time.perf_counter()
        return Generation(
            request_id=request_id,
            prompt=prompt,
            accepted=accepted,
            parser=opened,
            _queue=queue,
            _first_timeout=self.first_token_timeout,
            _idle_timeout=self.idle_timeout,
            timings=Timings(
                encode_ms=(t1 - t0) * 1000, render_ms=prompt.render_ms, accept_ms=(t2 - t1) * 1000
            ),
        )

    async def ping(self, service: str, timeout: float = 1.0) -> Pong:
        return await bus.request(
            self.nc, self.subjects.health(service), Ping(), _PONG,
            request_id="health", timeout=timeout, service=service,
        )
