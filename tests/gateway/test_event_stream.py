"""``EventStream``: an SSE response written from the request's own task. Its first bytes leave
without a loop iteration in between; a client that leaves cancels the body (whose clean-up
runs) and the response ends quietly; a failure of the body is the caller's to see."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from starlette.types import Message

from services.gateway.streaming import EventStream


class Client:
    """The ASGI side: what was sent, in order, and a disconnect it can be told to send."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.leave = asyncio.Event()

    async def receive(self) -> Message:
        await self.leave.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    @property
    def bodies(self) -> list[bytes]:
        return [m["body"] for m in self.sent if m["type"] == "http.response.body"]


async def test_the_first_bytes_leave_before_any_other_task_runs() -> None:
    client = Client()
    order: list[str] = []

    async def body() -> AsyncIterator[bytes]:
        yield b"data: 1\n\n"
        order.append("after first")
        yield b"data: 2\n\n"

    asyncio.get_running_loop().call_soon(order.append, "another task")
    await EventStream(body())({"type": "http"}, client.receive, client.send)
    assert order == ["after first"]  # all sent before a callback scheduled earlier got its turn
    start = client.sent[0]
    assert start["type"] == "http.response.start" and start["status"] == 200
    assert (b"content-type", b"text/event-stream; charset=utf-8") in start["headers"]
    assert client.bodies == [b"data: 1\n\n", b"data: 2\n\n", b""]
    assert [m.get("more_body") for m in client.sent[1:]] == [True, True, False]


async def test_a_client_that_leaves_cancels_the_body_and_the_response_ends_quietly() -> None:
    client = Client()
    cleaned: list[str] = []
    forever, waiting = asyncio.Event(), asyncio.Event()

    async def body() -> AsyncIterator[bytes]:
        try:
            yield b"data: 1\n\n"
            waiting.set()
            await forever.wait()  # a generation waiting for its next token
            yield b"data: never\n\n"
        finally:
            cleaned.append("closed")

    streaming = asyncio.get_running_loop().create_task(
        EventStream(body())({"type": "http"}, client.receive, client.send)
    )
    await asyncio.wait_for(waiting.wait(), 2)
    client.leave.set()
    await asyncio.wait_for(streaming, 2)  # returns: no CancelledError escapes
    assert not streaming.cancelled() and streaming.exception() is None
    assert cleaned == ["closed"] and client.bodies == [b"data: 1\n\n"]


async def test_a_failing_body_is_raised_and_a_cancel_from_elsewhere_is_not_swallowed() -> None:
    async def broken() -> AsyncIterator[bytes]:
        yield b"data: 1\n\n"
        raise RuntimeError("the body broke")

    with pytest.raises(RuntimeError):
        await EventStream(broken())({"type": "http"}, Client().receive, Client().send)

    forever, waiting = asyncio.Event(), asyncio.Event()

    async def waits() -> AsyncIterator[bytes]:
        yield b"data: 1\n\n"
        waiting.set()
        await forever.wait()
        yield b""

    streaming = asyncio.get_running_loop().create_task(
        EventStream(waits())({"type": "http"}, Client().receive, Client().send)
    )
    await asyncio.wait_for(waiting.wait(), 2)
    streaming.cancel()  # e.g. the server stopping: not the client leaving
    with pytest.raises(asyncio.CancelledError):
        await streaming
