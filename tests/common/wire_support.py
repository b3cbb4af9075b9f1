"""What the ``Wire`` tests share: a recording callback (``Collector``) and the messages it saw,
the connection hooks recorded (``Hooks``),
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
        self.times: list[float] = []  # the loop's time at each message
        self._changed = asyncio.Event()

    async def record(self, msg: Any) -> None:
        self.seen.append(Seen(msg.subject, msg.reply, msg.data, msg.headers or None))
        self.times.append(asyncio.get_running_loop().time())
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


class Hooks:
    """disconnected_cb / reconnected_cb (``options``), recording their calls; a reconnected hook
    that takes ``reconnected_wait`` seconds, for a test that needs a slow one."""

    def __init__(self, reconnected_wait: float = 0.0) -> None:
        self.calls: list[str] = []
        self.disconnected, self.reconnected = asyncio.Event(), asyncio.Event()
        self.wait = reconnected_wait
        self.options = {"disconnected_cb": self.on_disconnected, "reconnected_cb": self.on_reconnected}

    async def on_disconnected(self) -> None:
        self.calls.append("disconnected")
        self.disconnected.set()

    async def on_reconnected(self) -> None:
        self.calls.append("reconnected")
        if self.wait:
            await asyncio.sleep(self.wait)
        self.reconnected.set()
