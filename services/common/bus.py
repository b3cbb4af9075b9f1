"""Typed messages over NATS, every one of them through one client: ``Wire`` (``wire.py``), on
plain or TLS servers, one or a cluster's, whatever the login (``BusSettings.nats_options``).

``Bus`` wraps one service's connection:
- ``publish`` a contract (a payload over the server's size limit goes to JetStream and travels
  as a claim, so a 131k-token prompt is never refused by NATS: ``claims.py``);
- ``subscribe`` with a typed handler (unreadable messages are logged and dropped: garbage on
  the bus never stops a service);
- ``request`` and ``reply``: request/reply with typed payloads (the tools service, token
  counts, routing snapshots);
- ``Outbox`` (``outbox.py``): messages for one subject gathered while the event loop is busy.

Connection events (disconnected, reconnected) are exposed so the gateway can resume the
generations a NATS outage may have cut."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import nats.errors
from pydantic import BaseModel, TypeAdapter, ValidationError

from contracts.errors import BusError, ErrorCode
from contracts.subjects import CLAIM_HEADER, Subjects
from services.common.claims import ClaimError, Claims
from services.common.errors import ChorusError
from services.common.metrics import NATS_CONNECTION
from services.common.telemetry import inject
from services.common.wire import Received, Subscription, Wire

log = logging.getLogger("chorus.bus")

T = TypeVar("T")
CLAIM_TTL_S = 600.0  # an unclaimed oversized payload is dropped after this
CLAIM_MARGIN = 4096  # headroom under max_payload for headers and protocol framing
CLAIM_TIMEOUT_S = 12.0  # per step: a read during a cluster's leader election takes up to about 10 s
NO_RESPONDERS_GRACE_S = 1.0  # a request finding nobody listening tries again for this long

Connection = Wire


def dump(msg: BaseModel) -> bytes:
    return msg.model_dump_json().encode()


def trace_headers(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Headers for a bus message: the current trace context (and ``extra``)."""
    return inject(dict(extra or {}))


async def connect(url: str, name: str, options: dict[str, Any] | None = None, **callbacks: Any) -> Wire:
    """A NATS connection that reconnects forever (to any server of a cluster) and notices a
    dead server in seconds. ``options``: logins and TLS (``BusSettings.nats_options``)."""
    return await Wire.connect(
        url,
        name=name,
        reconnect_time_wait=0.25,
        connect_timeout=2,
        ping_interval=2,
        max_outstanding_pings=2,
        **(options or {}),
        **callbacks,
    )


class Bus:
    """One service's NATS connection, typed."""

    def __init__(self, nc: Wire, subjects: Subjects, *, claim_replicas: int = 1) -> None:
        self.nc = nc
        self.subjects = subjects
        self.claims = Claims(
            nc, subjects.claims_stream, replicas=claim_replicas, ttl_s=CLAIM_TTL_S, timeout=CLAIM_TIMEOUT_S
        )
        self._subs: list[tuple[Subscription, bool]] = []  # (subscription, takes work)
        self._replies: set[asyncio.Task[None]] = set()

    @classmethod
    async def connect(
        cls,
        url: str,
        name: str,
        subjects: Subjects,
        *,
        options: dict[str, Any] | None = None,
        claim_replicas: int = 1,
        on_disconnect: Callable[[], Awaitable[None]] | None = None,
        on_reconnect: Callable[[], Awaitable[None]] | None = None,
    ) -> Bus:
        clients: list[Wire] = []

        def server() -> str:
            current = clients[0].pool.current if clients else None
            return current.label if current is not None else "NATS"

        async def disconnected() -> None:
            if clients and clients[0].is_closed:
                return  # our own close (the service stops), not a lost connection
            NATS_CONNECTION.labels("lost").inc()
            log.warning("%s: lost the NATS connection to %s; reconnecting", name, server())
            if on_disconnect is not None:
                await on_disconnect()

        async def reconnected() -> None:
            NATS_CONNECTION.labels("reconnected").inc()
            log.warning("%s: reconnected, to %s", name, server())
            if on_reconnect is not None:
                await on_reconnect()

        async def error(exc: Exception) -> None:
            log.debug("%s: NATS: %s", name, exc)

        nc = await connect(url, name, options, disconnected_cb=disconnected, reconnected_cb=reconnected, error_cb=error)
        clients.append(nc)
        return cls(nc, subjects, claim_replicas=claim_replicas)

    # sending ----------------------------------------------------------------------------
    def publish_nowait(self, subject: str, msg: BaseModel) -> bool:
        """Send ``msg`` in this step, if it can be (a payload under the limit): True when it was
        written, False when ``publish`` has to take it (a claim)."""
        data = dump(msg)
        if len(data) > self.nc.max_payload - CLAIM_MARGIN:
            return False
        self.nc.publish_nowait(subject, data)
        return True

    async def publish(self, subject: str, msg: BaseModel | bytes, headers: dict[str, str] | None = None) -> None:
        data = msg if isinstance(msg, bytes) else dump(msg)
        if len(data) > self.nc.max_payload - CLAIM_MARGIN:
            headers = {**(headers or {}), CLAIM_HEADER: await self._put_claim(data)}
            data = b""
        await self.nc.publish(subject, data, headers=headers or None)

    async def _put_claim(self, data: bytes) -> str:
        try:
            return await self.claims.put(data)
        except ClaimError as exc:
            raise ChorusError.of(
                BusError(
                    code=ErrorCode.SERVICE_UNAVAILABLE,
                    message=f"a {len(data)}-byte message is over NATS's limit of {self.nc.max_payload} "
                    f"bytes and JetStream (needed to carry it) is not available: {exc}",
                )
            ) from exc

    async def payload(self, msg: Received) -> bytes:
        """The message's payload, fetched (once) from JetStream if it was a claim."""
        key = (msg.headers or {}).get(CLAIM_HEADER)
        if not key:
            return msg.data
        data = await self.claims.get(key)
        with contextlib.suppress(ClaimError):
            await self.claims.delete(key)
        return data

    # receiving --------------------------------------------------------------------------
    async def subscribe(
        self,
        subject: str,
        adapter: TypeAdapter[T],
        handler: Callable[[T], Awaitable[None]],
        *,
        queue: str = "",
        takes_work: bool = False,
        inline: bool = False,
    ) -> Subscription:
        """Call ``handler`` with each message, decoded. Messages are handled one at a time, in
        order (a handler that must not block the next message starts a task). ``takes_work``:
        a queue subscription that is dropped first when the service drains. ``inline``: the
        handler of a message arriving at an idle subscription starts in the socket's callback
        (see ``Wire.subscribe``): for the hops on a request's path, whose handlers do not need
        to be a task in their first step."""

        async def on_msg(msg: Received) -> None:
            value = await self._read(msg, adapter)
            if value is None:
                return
            try:
                await handler(value)
            except Exception:  # one bad message never stops the subscription
                log.exception("handling a message on %s failed", msg.subject)

        sub = await self.nc.subscribe(subject, queue=queue, cb=on_msg, inline=inline)
        self._subs.append((sub, takes_work))
        return sub

    async def reply(
        self,
        subject: str,
        adapter: TypeAdapter[T],
        handler: Callable[[T, dict[str, str]], Awaitable[BaseModel]],
        *,
        queue: str = "",
        concurrency: int = 1,
        takes_work: bool = True,
    ) -> Subscription:
        """Answer requests on ``subject``: ``handler`` gets each one decoded (and its headers:
        the caller's trace context) and returns the reply; up to ``concurrency`` at once, each
        in a task of its own (a slow tool call never holds the next request back). An unreadable
        request is answered with an ``invalid_request`` error; a handler that fails, with an
        ``internal_error`` (logged)."""
        slots = asyncio.Semaphore(concurrency)

        async def answer(msg: Received) -> None:
            async with slots:
                value = await self._read(msg, adapter)
                reply: BaseModel
                if value is None:
                    reply = BusError(code=ErrorCode.INVALID_REQUEST, message=f"an unreadable request on {subject}")
                else:
                    try:
                        reply = await handler(value, dict(msg.headers or {}))
                    except Exception:  # the caller gets an answer either way
                        log.exception("answering a request on %s failed", subject)
                        reply = BusError(code=ErrorCode.INTERNAL, message=f"the {subject} handler failed")
                if msg.reply:
                    with contextlib.suppress(Exception):
                        await self.publish(msg.reply, reply)

        async def on_msg(msg: Received) -> None:
            task = asyncio.get_running_loop().create_task(answer(msg))
            self._replies.add(task)  # owned here: awaited by close(), never lost
            task.add_done_callback(self._replies.discard)

        sub = await self.nc.subscribe(subject, queue=queue, cb=on_msg)
        self._subs.append((sub, takes_work))
        return sub

    async def _read(self, msg: Received, adapter: TypeAdapter[T]) -> T | None:
        try:
            return adapter.validate_json(await self.payload(msg))
        except (ValidationError, ValueError) as exc:
            log.warning("unreadable message on %s dropped: %s", msg.subject, str(exc)[:300])
        except Exception:  # e.g. a claim that expired
            log.warning("message on %s could not be read", msg.subject, exc_info=True)
        return None

    async def stop_taking_work(self, timeout: float = 5.0) -> None:
        """Leave the queue groups that hand this instance new work (draining), without losing
        the work the server had already sent: it arrives and its handlers run (at most
        ``timeout`` seconds)."""

        async def leave(sub: Subscription) -> None:
            with contextlib.suppress(Exception):
                await sub.drain(timeout)

        await asyncio.gather(*(leave(sub) for sub, takes_work in self._subs if takes_work))
        if self._replies:  # the requests in hand are answered
            await asyncio.wait(list(self._replies), timeout=timeout)
        with contextlib.suppress(Exception):
            await self.nc.flush(timeout=2)

    async def caught_up(self, timeout: float = 2.0) -> None:
        """Until what has arrived on the other subscriptions is handled (at most ``timeout``)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.nc.caught_up()

    async def request(
        self, subject: str, msg: BaseModel, reply_type: TypeAdapter[T], *, timeout: float, service: str
    ) -> T:
        """Request/reply with typed payloads. A ``BusError`` reply raises the ``ChorusError``
        its code stands for; so do a timeout (TIMEOUT) and nobody listening for
        ``NO_RESPONDERS_GRACE_S`` (a replica restarting is given that long) (SERVICE_UNAVAILABLE)."""
        loop = asyncio.get_running_loop()
        data, headers = dump(msg), trace_headers()
        if len(data) > self.nc.max_payload - CLAIM_MARGIN:
            headers[CLAIM_HEADER] = await self._put_claim(data)
            data = b""
        deadline = loop.time() + timeout
        give_up = loop.time() + min(timeout, NO_RESPONDERS_GRACE_S)
        pause = 0.02
        try:
            while True:
                try:
                    reply = await self.nc.request(
                        subject, data, timeout=max(0.001, deadline - loop.time()), headers=headers
                    )
                    break
                except nats.errors.NoRespondersError as exc:
                    left = give_up - loop.time()
                    if left <= 0:
                        raise ChorusError.of(
                            BusError(code=ErrorCode.SERVICE_UNAVAILABLE, message=f"no {service} service is running")
                        ) from exc
                    await asyncio.sleep(min(pause, left))  # the last try at the end of the grace
                    pause *= 2
        except nats.errors.TimeoutError as exc:
            raise ChorusError.of(
                BusError(code=ErrorCode.TIMEOUT, message=f"the {service} service did not answer in {timeout:g}s")
            ) from exc
        value = reply_type.validate_json(await self.payload(reply))  # a large reply comes as a claim
        if isinstance(value, BusError):
            raise ChorusError.of(value)
        return value

    async def close(self) -> None:
        for task in list(self._replies):
            task.cancel()
        await asyncio.gather(*self._replies, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.nc.drain()
        with contextlib.suppress(Exception):
            await self.nc.close()
