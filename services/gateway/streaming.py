"""Small helpers shared by the streaming endpoints."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TypeVar

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
