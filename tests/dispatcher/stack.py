"""The dispatcher service over real NATS, as its tests drive it: a running dispatcher, with the
test in the roles around it. The test plays the encoder (``GenerateRequest`` on the generate
subject), the owning gateway (``EventFrame``s on its events subject, heartbeats) and the parser
worker (``TokenFrame``s on its tokens subject); and checks what a whole token stream must be."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from contracts.messages.control import Cancel, Heartbeat
from contracts.messages.generate import (
    EventFrame,
    GatewayEvent,
    GenerateRequest,
    GenerationAccepted,
    GenerationFailed,
    ParseSpec,
    TokenBatch,
    TokenFrame,
)
from services.common.bus import Bus
from services.common.harmony import harmony_encoding
from services.dispatcher.app import run
from services.dispatcher.settings import Settings
from tests.bus import ByGeneration, Tap, adapter, client, running
from tests.simengine.prompts import WEATHER, user_prompt

ENC = harmony_encoding()
SLOW = "keep going [[sim:tokens=5000]] [[sim:delay_ms=5]]"  # 25 s unless ended early
TOOL_PROMPT = user_prompt("Weather in Oslo please", [WEATHER])  # the script calls get_weather


def new_id(name: str) -> str:
    """Generation ids are engine request ids: unique, since the simulators outlive a test."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


@dataclass
class Stack:
    """A running dispatcher, and the test in the roles around it: the encoder sending
    requests, gateway g1 reading its events, parser p1 reading its tokens."""

    bus: Bus  # the test's own connection
    settings: Settings
    stop: asyncio.Event  # set: the dispatcher drains and stops
    tokens: ByGeneration[TokenBatch]  # parser p1
    events: ByGeneration[GatewayEvent]  # gateway g1
    beats: Tap[Heartbeat]  # the dispatcher's heartbeats

    async def send(self, req: GenerateRequest | bytes) -> None:
        await self.bus.publish(self.bus.subjects.generate, req)

    async def cancel(self, generation_id: str) -> None:
        await self.bus.publish(self.bus.subjects.cancel, Cancel(generation_id=generation_id))

    async def gateway_beat(self, instance: str, interval_s: float, *, stopping: bool = False) -> None:
        await self.bus.publish(
            self.bus.subjects.heartbeat("gateway"),
            Heartbeat(service="gateway", instance=instance, interval_s=interval_s, stopping=stopping),
        )

    async def accepted(self, generation_id: str, timeout: float = 5) -> GenerationAccepted:
        event = await self.events.next(generation_id, timeout)
        assert isinstance(event, GenerationAccepted), event
        return event

    async def failed(self, generation_id: str, timeout: float = 5) -> GenerationFailed:
        event = await self.events.next(generation_id, timeout)
        assert isinstance(event, GenerationFailed), event
        assert event.stage == "dispatcher"
        return event

    async def stream(self, generation_id: str, timeout: float = 10) -> list[TokenBatch]:
        """The generation's batches (those not read yet) up to the done one."""
        out: list[TokenBatch] = []
        async with asyncio.timeout(timeout):
            while not out or not out[-1].done:
                out.append(await self.tokens.next(generation_id, timeout))
        return out

    async def beat(self, timeout: float = 5) -> Heartbeat:
        """The dispatcher's next heartbeat."""
        while True:
            beat = await self.beats.next(timeout)
            if beat.instance == self.settings.instance_id:
                return beat


@contextlib.asynccontextmanager
async def dispatcher(nats_url: str, namespace: str, engines: list[str], **kw: Any) -> AsyncIterator[Stack]:
    """The dispatcher's subjects are tapped before it starts; the taps outlive it."""
    settings = Settings(nats_url=nats_url, namespace=namespace, engines=engines, **kw)
    subjects = settings.subjects
    async with (
        client(nats_url, namespace) as c,
        Tap(c.nc, subjects.parser_tokens("p1"), adapter(TokenFrame)) as tokens,
        Tap(c.nc, subjects.gateway_events("g1"), adapter(EventFrame)) as events,
        Tap(c.nc, subjects.heartbeat("dispatcher"), adapter(Heartbeat)) as beats,
        running(run, settings) as stop,
    ):
        yield Stack(
            c,
            settings,
            stop,
            ByGeneration(tokens, lambda f: f.batches),
            ByGeneration(events, lambda f: f.events),
            beats,
        )


def ids(batches: list[TokenBatch]) -> list[int]:
    return [t for b in batches for t in b.token_ids]


def check_stream(batches: list[TokenBatch], generation_id: str) -> None:
    """One whole stream: opened once by the first batch, offsets that follow each other,
    done only at the end."""
    first = batches[0]
    assert first.open == ParseSpec(request_id=generation_id) and first.gateway == "g1"
    assert first.offset == 0
    assert all(b.open is None for b in batches[1:])
    offset = 0
    for b in batches:
        assert b.offset == offset, [(x.offset, len(x.token_ids)) for x in batches]
        offset += len(b.token_ids)
    assert [b.done for b in batches] == [False] * (len(batches) - 1) + [True]
