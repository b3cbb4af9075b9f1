"""Small helpers shared by the streaming endpoints, and their response (``EventStream``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

T = TypeVar("T")


async def wait_disconnect(receive: Receive) -> None:
    """Return when the client has gone away (the body has already been read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class ClientGone(Exception):
    """The client went away before its answer was ready."""


async def _raise_when_gone(request: Request) -> None:
    await wait_disconnect(request.receive)
    raise ClientGone


async def unless_client_leaves(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """``work``'s result, or ``ClientGone`` when the client leaves first: ``work`` is then
    cancelled (leaving its generation's context aborts the engine). ``work``'s own failure is
    raised as itself."""
    try:
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(work)
            watcher = tg.create_task(_raise_when_gone(request))
            task.add_done_callback(lambda _: watcher.cancel())
    except BaseExceptionGroup as group:
        raise group.exceptions[0] from None
    return task.result()


class EventStream(StreamingResponse):
    """A server-sent event stream, written from the request's own task.

    Starlette streams a response in a task group of two tasks (the body, and a listener for
    the client leaving) on an ASGI 2.3 server such as uvicorn: a task step and a cancel scope
    before the first byte. Here the first bytes go out at once, and the listener starts once
    they have: a client that leaves cancels the stream (the body's generator is closed, which
    ends its generation and aborts the engine request), and that ends the response quietly."""

    media_type = "text/event-stream"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        me = asyncio.current_task()
        assert me is not None
        gone = asyncio.Event()

        async def listen() -> None:
            await wait_disconnect(receive)
            gone.set()
            me.cancel()

        listener: asyncio.Task[None] | None = None
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for chunk in self.body_iterator:
                data = chunk if isinstance(chunk, bytes | memoryview) else chunk.encode(self.charset)
                await send({"type": "http.response.body", "body": data, "more_body": True})
                if listener is None:
                    listener = asyncio.get_running_loop().create_task(listen())
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not gone.is_set():
                raise
            me.uncancel()  # the client left: nothing more to send, nothing went wrong
        finally:
            if listener is not None:
                listener.cancel()
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()
        if self.background is not None:
            await self.background()
