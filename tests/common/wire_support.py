"""What the ``Wire`` tests share: a recording callback (``Collector``) and the messages it saw,
the type of the ``connect`` fixture (conftest.py), and ``quiet``, which waits until every message
routed to some connections so far has been handled (for checks that something did not
arrive)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from services.common.wire import Wire

Connect = Callable[..., Awaitable[Wire]]


@dataclass(frozen=True)
class Seen:
    subject: str
    reply: str
    data: bytes
    headers: dict[str, str] | None


class Collector:
    """A callback (for Wire or nats-py) recording what it gets; ``wait`` for a count."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self._changed = asyncio.Event()

    async def record(self, msg: Any) -> None:
        self.seen.append(Seen(msg.subject, msg.reply, msg.data, msg.headers or None))
        self._changed.set()

    async def wait(self, count: int, timeout: float = 5.0) -> list[Seen]:
        async with asyncio.timeout(timeout):
            while len(self.seen) < count:
                self._changed.clear()
                await self._changed.wait()
        return self.seen

    @property
    def data(self) -> list[bytes]:
        return [s.data for s in self.seen]


async def quiet(*wires: Wire, timeout: float = 5.0) -> None:
    """Every message the server routed to these connections so far has been read (a PING
    answered after it) and handled (each callback of it has returned)."""
    async with asyncio.timeout(timeout):
        for w in wires:
            await w.flush()
            await w.caught_up()
