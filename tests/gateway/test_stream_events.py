"""A stored streaming response's event log is written behind the stream: the client's bytes
never wait for Redis, and the log still holds every event sent, in order, also when the client
leaves early."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

from pydantic import BaseModel

from services.gateway.responses.routes import stream_events
from services.gateway.responses.run import ResponseRun


class Ev(BaseModel):
    type: str
    n: int


@dataclass
class SlowStore:
    """Appends wait until ``open`` is set (a Redis round trip that takes its time)."""

    open: asyncio.Event = field(default_factory=asyncio.Event)
    log: list[bytes] = field(default_factory=list)

    async def append_events(self, response_id: str, events: list[bytes]) -> None:
        await self.open.wait()
        self.log += events


@dataclass
class Prepared:
    store: SlowStore


@dataclass
class Run:
    prepared: Prepared
    response_id: str = "resp_1"
    status: str = "in_progress"
    observed: Any = None


def events(n: int) -> list[Any]:
    return [Ev(type="response.output_text.delta", n=n)]


async def later() -> AsyncIterator[list[Any]]:
    for n in (1, 2):
        yield events(n)


def stream(store: SlowStore) -> AsyncIterator[bytes]:
    run = cast(ResponseRun, Run(Prepared(store)))
    return stream_events(run, events(0), later(), persist=True)


async def test_the_first_bytes_do_not_wait_for_the_log_and_the_log_gets_every_event_in_order() -> None:
    store = SlowStore()
    sse = stream(store)
    first = await asyncio.wait_for(anext(sse), 1)  # the store has not answered yet
    assert b'"n":0' in first and store.log == []
    store.open.set()
    rest = [chunk async for chunk in sse]
    assert [b'"n":1' in rest[0], b'"n":2' in rest[1]] == [True, True]
    assert [Ev.model_validate_json(e).n for e in store.log] == [0, 1, 2]


async def test_what_was_sent_is_logged_when_the_client_leaves() -> None:
    store = SlowStore()
    store.open.set()
    sse = stream(store)
    await anext(sse)
    await cast(Any, sse).aclose()  # the client left after the first batch
    assert [Ev.model_validate_json(e).n for e in store.log] == [0]
