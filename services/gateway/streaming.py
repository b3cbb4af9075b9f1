"""Small helpers shared by the streaming endpoints."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

from fastapi import Request

T = TypeVar("T")


async def first_then_rest(first: T, rest: AsyncIterator[T]) -> AsyncIterator[T]:
    yield first
    async for item in rest:
        yield item


async def wait_disconnect(request: Request) -> None:
    """Return when the client has gone away (the body has already been read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class ClientGone(Exception):
    """The client went away before its answer was ready."""


async def _raise_when_gone(request: Request) -> None:
    await wait_disconnect(request)
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
