"""What a ``Wire`` subscriber sees: the messages delivered (``Msg``) and the subscription that
hands them to its callback in order (``Subscription``)."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import nats.errors

log = logging.getLogger("chorus.wire")

Callback = Callable[["Msg"], Awaitable[None]]


class Owner(Protocol):
    """The connection a subscription belongs to (``Wire``)."""

    async def publish(
        self, subject: str, payload: bytes = b"", reply: str = "", headers: dict[str, str] | None = None
    ) -> None: ...
    def _unsubscribe(self, sub: Subscription, *, forget: bool = True) -> None: ...
    async def _drain(self, subs: list[Subscription], timeout: float) -> None: ...


class Received(Protocol):
    """A delivered message as a callback reads it (nats-py's ``Msg`` is one too)."""

    @property
    def subject(self) -> str: ...
    @property
    def data(self) -> bytes: ...
    @property
    def headers(self) -> dict[str, str] | None: ...


@dataclass(slots=True)
class Msg:
    """A delivered message (the attributes nats-py's ``Msg`` has that Chorus reads)."""

    subject: str
    reply: str
    data: bytes
    headers: dict[str, str] | None
    _wire: Owner | None = field(default=None, repr=False)

    async def respond(self, data: bytes) -> None:
        if not self.reply or self._wire is None:
            raise nats.errors.Error("no reply subject to respond to")
        await self._wire.publish(self.reply, data)


class Subscription:
    """One subscription; its callback sees its messages one at a time, in order."""

    def __init__(self, wire: Owner, sid: int, subject: str, queue: str, cb: Callback | None) -> None:
        self.wire = wire
        self.sid = sid
        self.subject = subject
        self.queue = queue
        self._cb = cb
        self._backlog: deque[Msg] = deque()
        self.handling: asyncio.Task[None] | None = None  # the task handling a burst, if any
        self.delivered = 0
        self.handled = 0  # messages whose callback has returned
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []  # (handled count, waiter)
        self.unsubscribed = False

    def _deliver(self, msg: Msg) -> None:
        self.delivered += 1
        if self._cb is None:
            return
        self._backlog.append(msg)
        if self.handling is None:  # one task drains a burst; a handler's await delays only its successors
            self.handling = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        cb = self._cb
        assert cb is not None
        try:
            while self._backlog:
                msg = self._backlog.popleft()
                try:
                    await cb(msg)
                except Exception:  # one message's failure never stops the subscription
                    log.exception("the callback for a message on %s failed", msg.subject)
                self.handled += 1
                if self._waiters:
                    self._wake()
                if self._backlog:  # other subscriptions' messages that came in between go first
                    await asyncio.sleep(0)
        finally:
            self.handling = None
            self._wake()  # nothing more is being handled: every waiter is done waiting

    async def handled_upto(self, count: int) -> None:
        """Until the callbacks of the first ``count`` messages delivered have returned."""
        if self.handling is None or self.handled >= count:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append((count, waiter))
        await waiter

    def _wake(self) -> None:
        still = []
        for count, waiter in self._waiters:
            if self.handled >= count or self.handling is None:
                if not waiter.done():
                    waiter.set_result(None)
            else:
                still.append((count, waiter))
        self._waiters = still

    async def unsubscribe(self) -> None:
        self.wire._unsubscribe(self)

    async def drain(self, timeout: float = 30.0) -> None:
        """Stop receiving without losing what the server had already sent (see ``Wire.drain``)."""
        await self.wire._drain([self], timeout)
