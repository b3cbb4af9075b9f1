"""What a ``Wire`` subscriber sees: the messages delivered (``Msg``) and the subscription that
hands them to its callback in order (``Subscription``)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

import nats.errors

from contracts.subjects import CLAIM_HEADER

log = logging.getLogger("chorus.wire")

Callback = Callable[["Msg"], Coroutine[Any, Any, None]]


class Owner(Protocol):
    """The connection a subscription belongs to (``Wire``)."""

    async def publish(
        self, subject: str, payload: bytes = b"", reply: str = "", headers: dict[str, str] | None = None
    ) -> None: ...
    def _unsubscribe(self, sub: Subscription, *, forget: bool = True) -> None: ...
    async def _drain(self, subs: list[Subscription], timeout: float) -> None: ...
    def _idle(self) -> bool: ...


class Received(Protocol):
    """A delivered message as a callback reads it (nats-py's ``Msg`` is one too)."""

    @property
    def subject(self) -> str: ...
    @property
    def data(self) -> bytes: ...
    @property
    def headers(self) -> dict[str, str] | None: ...
    @property
    def reply(self) -> str: ...


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

    def __init__(
        self, wire: Owner, sid: int, subject: str, queue: str, cb: Callback | None, *, inline: bool = False
    ) -> None:
        self.wire = wire
        self.sid = sid
        self.subject = subject
        self.queue = queue
        self._cb = cb
        self._inline = inline
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
        if self._inline and self.handling is None and not self._backlog and self.wire._idle() and not _claim(msg):
            self._begin(msg)  # nothing that arrived before it waits (on any subscription): order holds
            return
        self._backlog.append(msg)
        if self.handling is None:  # one task drains a burst; a handler's await delays only its successors
            self.handling = asyncio.get_running_loop().create_task(self._run())

    def _begin(self, msg: Msg) -> None:
        """An inline subscription's callback runs its first step here, in the socket's callback
        (no task is scheduled: on an idle process that step is a cold loop iteration saved on
        every hop). A callback that has to wait goes on in a task, and the messages arriving
        meanwhile queue behind it as usual. Where asyncio has eager tasks (Python 3.12 and
        later), the callback is such a task, started at once; on 3.11 its first step is driven
        here (public asyncio only), so a first step must not need a current task: a message
        whose payload is a claim (fetched with a timed request) is never handled inline."""
        assert self._cb is not None
        context = contextvars.copy_context()  # what the callback sets stays its own, as in a task
        if EAGER is not None:
            task = EAGER(asyncio.get_running_loop(), self._run_first(msg), context=context)
            if not task.done():
                self.handling = task
            return
        coro = self._cb(msg)
        try:
            waiting = context.run(coro.send, None)
        except StopIteration:
            self._handled_one()
            return
        except Exception:  # one message's failure never stops the subscription
            log.exception("the callback for a message on %s failed", msg.subject)
            self._handled_one()
            return
        self.handling = asyncio.get_running_loop().create_task(
            self._run(_resumed(coro, waiting, msg.subject)), context=context
        )

    def _handled_one(self) -> None:
        self.handled += 1
        if self._waiters:
            self._wake()

    async def _run_first(self, msg: Msg) -> None:
        """An eager task's whole work: ``msg``, then whatever queued behind it meanwhile."""
        assert self._cb is not None
        try:
            await self._cb(msg)
        except Exception:  # one message's failure never stops the subscription
            log.exception("the callback for a message on %s failed", msg.subject)
        self._handled_one()
        if self._backlog:
            await self._run()

    async def _run(self, first: Awaitable[None] | None = None) -> None:
        cb = self._cb
        assert cb is not None
        try:
            if first is not None:
                await first
                self._handled_one()
            while self._backlog:
                msg = self._backlog.popleft()
                try:
                    await cb(msg)
                except Exception:  # one message's failure never stops the subscription
                    log.exception("the callback for a message on %s failed", msg.subject)
                self._handled_one()
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


def _claim(msg: Msg) -> bool:
    return msg.headers is not None and CLAIM_HEADER in msg.headers


# asyncio's eager task factory (Python 3.12+): a task whose first step runs in the creating call
EAGER: Callable[..., asyncio.Task[None]] | None = getattr(asyncio, "eager_task_factory", None)


async def _resumed(coro: Coroutine[Any, Any, None], waiting: Any, subject: str) -> None:
    """Drive ``coro`` on from where its first step, run outside any task, stopped (waiting for
    the future ``waiting``, or ``None`` for a bare yield): what a task does with a coroutine."""
    try:
        while True:
            try:
                if waiting is None:
                    await asyncio.sleep(0)
                else:  # (the future's blocking flag is the next task's to reset, as a task does)
                    await asyncio.wait((waiting,))
            except asyncio.CancelledError as exc:  # cancelled: so is what it waits for, as in a task
                if waiting is not None:
                    waiting.cancel()
                waiting = coro.throw(exc)
                continue
            waiting = coro.send(None)
    except StopIteration:
        pass
    except Exception:  # one message's failure never stops the subscription
        log.exception("the callback for a message on %s failed", subject)
