"""Typed messages over NATS: the request path's hops pay no framework cost.

``Bus`` wraps one service's NATS connection (``Wire``, the lean client in ``wire.py``, on a
``nats://`` server; nats-py for ``tls://`` and for a connection a faststream broker made):
- ``publish`` a contract (a payload over the server's size limit goes to a JetStream object
  store and travels as a claim, so a 131k-token prompt is never refused by NATS);
- ``subscribe`` with a typed handler (unreadable messages are logged and dropped: garbage on
  the bus never stops a service);
- ``Outbox``: messages for one subject gathered while the event loop is busy and sent as one
  frame, or at once when it is idle;
- ``request`` for the request/reply conversations that stay on faststream handlers (tools).

Connection events (disconnected, reconnected) are exposed so the gateway can resume the
generations a NATS restart may have cut."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import nats
import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.subscription import Subscription
from nats.js.api import ObjectStoreConfig
from nats.js.object_store import ObjectStore
from pydantic import BaseModel, TypeAdapter, ValidationError

from contracts.errors import BusError, ErrorCode
from contracts.subjects import CLAIM_HEADER, Subjects
from services.common.errors import ChorusError
from services.common.telemetry import inject
from services.common.wire import Received, Wire
from services.common.wire import Subscription as WireSubscription

log = logging.getLogger("chorus.bus")

T = TypeVar("T")
F = TypeVar("F", bound=BaseModel)
CLAIM_TTL_S = 600.0  # an unclaimed oversized payload is dropped after this
CLAIM_MARGIN = 4096  # headroom under max_payload for headers and protocol framing
NO_RESPONDERS_GRACE_S = 1.0  # a request finding nobody listening tries again for this long


def dump(msg: BaseModel) -> bytes:
    return msg.model_dump_json().encode()


def trace_headers(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Headers for a bus message: the current trace context (and ``extra``)."""
    return inject(dict(extra or {}))


def credentials() -> dict[str, str]:
    """NATS user and password from ``CHORUS_NATS_USER`` / ``CHORUS_NATS_PASSWORD`` (the compose
    stack's server requires them); passed as options, never in the URL (nats-py cannot read a
    password with spaces there)."""
    user, password = os.environ.get("CHORUS_NATS_USER"), os.environ.get("CHORUS_NATS_PASSWORD")
    return {"user": user, "password": password or ""} if user else {}


Connection = NatsClient | Wire
AnySubscription = Subscription | WireSubscription


async def connect(url: str, name: str, **callbacks: Any) -> Connection:
    """A NATS connection that reconnects forever and notices a dead server in seconds: the
    lean ``Wire`` on plain ``nats://`` servers, nats-py where TLS is asked for."""
    options: dict[str, Any] = {
        "name": name,
        **credentials(),
        "reconnect_time_wait": 0.25,
        "connect_timeout": 2,
        "ping_interval": 2,
        "max_outstanding_pings": 2,
        **callbacks,
    }
    if all(server.strip().startswith("nats://") for server in url.split(",")):
        return await Wire.connect(url, **options)
    return await nats.connect(url, max_reconnect_attempts=-1, **options)


class Bus:
    """One service's NATS connection, typed."""

    def __init__(self, nc: Connection, subjects: Subjects) -> None:
        self.nc = nc
        self.subjects = subjects
        self._store: ObjectStore | None = None
        self._side: NatsClient | None = None  # JetStream's connection when ``nc`` is a Wire
        self._side_lock = asyncio.Lock()
        self._subs: list[tuple[AnySubscription, bool]] = []  # (subscription, takes work)

    @classmethod
    async def connect(
        cls,
        url: str,
        name: str,
        subjects: Subjects,
        *,
        on_disconnect: Callable[[], Awaitable[None]] | None = None,
        on_reconnect: Callable[[], Awaitable[None]] | None = None,
    ) -> Bus:
        clients: list[Connection] = []

        async def disconnected() -> None:
            if clients and clients[0].is_closed:
                return  # our own close (the service stops), not a lost connection
            log.warning("%s: lost the NATS connection; reconnecting", name)
            if on_disconnect is not None:
                await on_disconnect()

        async def reconnected() -> None:
            log.info("%s: reconnected to NATS", name)
            if on_reconnect is not None:
                await on_reconnect()

        async def error(exc: Exception) -> None:
            log.debug("%s: NATS: %s", name, exc)

        nc = await connect(url, name, disconnected_cb=disconnected, reconnected_cb=reconnected, error_cb=error)
        clients.append(nc)
        return cls(nc, subjects)

    # sending ----------------------------------------------------------------------------
    @property
    def sends_nowait(self) -> bool:
        """Whether ``publish_nowait`` can write at all (a ``Wire`` connection; nats-py cannot)."""
        return isinstance(self.nc, Wire)

    def publish_nowait(self, subject: str, msg: BaseModel) -> bool:
        """Send ``msg`` in this step, if it can be (a ``Wire`` connection, a payload under the
        limit): True when it was written, False when ``publish`` has to take it."""
        if not isinstance(self.nc, Wire):
            return False
        data = dump(msg)
        if len(data) > self.nc.max_payload - CLAIM_MARGIN:
            return False
        self.nc.publish_nowait(subject, data)
        return True

    async def publish(self, subject: str, msg: BaseModel | bytes, headers: dict[str, str] | None = None) -> None:
        data = msg if isinstance(msg, bytes) else dump(msg)
        if len(data) > self.nc.max_payload - CLAIM_MARGIN:
            key = await self._put_claim(data)
            headers = {**(headers or {}), CLAIM_HEADER: key}
            data = b""
        await self.nc.publish(subject, data, headers=headers or None)

    async def _jetstream_client(self) -> NatsClient:
        """A nats-py connection for JetStream (the object store of oversized payloads): ``nc``
        itself, or one opened beside a ``Wire`` on first use."""
        if isinstance(self.nc, NatsClient):
            return self.nc
        async with self._side_lock:
            if self._side is None:
                self._side = await nats.connect(
                    ",".join(self.nc.servers),
                    name=f"{self.nc.name}-jetstream",
                    **credentials(),
                    max_reconnect_attempts=-1,
                )
        return self._side

    async def _objects(self) -> ObjectStore:
        if self._store is None:
            js = (await self._jetstream_client()).jetstream()
            bucket = self.subjects.object_store
            try:
                self._store = await js.object_store(bucket)
            except Exception:  # noqa: BLE001 - not created yet: create it
                self._store = await js.create_object_store(
                    bucket, config=ObjectStoreConfig(bucket=bucket, ttl=CLAIM_TTL_S)
                )
        return self._store

    async def _put_claim(self, data: bytes) -> str:
        key = uuid.uuid4().hex
        try:
            await (await self._objects()).put(key, data)
        except Exception as exc:
            raise ChorusError.of(
                BusError(
                    code=ErrorCode.SERVICE_UNAVAILABLE,
                    message=f"a {len(data)}-byte message is over NATS's limit of {self.nc.max_payload} "
                    "bytes and JetStream (needed to carry it) is not available",
                )
            ) from exc
        return key

    async def payload(self, msg: Received) -> bytes:
        """The message's payload, fetched (once) from the object store if it was a claim."""
        key = (msg.headers or {}).get(CLAIM_HEADER)
        if not key:
            return msg.data
        store = await self._objects()
        result = await store.get(key)
        with contextlib.suppress(Exception):
            await store.delete(key)
        return result.data or b""

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
    ) -> AnySubscription:
        """Call ``handler`` with each message, decoded. Messages are handled one at a time, in
        order (a handler that must not block the next message starts a task). ``takes_work``:
        a queue subscription that is dropped first when the service drains. ``inline``: the
        handler of a message arriving at an idle subscription starts in the socket's callback
        (on a ``Wire``; see ``Wire.subscribe``): for the hops on a request's path, whose
        handlers do not need to be a task in their first step."""

        async def on_msg(msg: Received) -> None:
            try:
                value = adapter.validate_json(await self.payload(msg))
            except (ValidationError, ValueError) as exc:
                log.warning("unreadable message on %s dropped: %s", msg.subject, str(exc)[:300])
                return
            except Exception:  # e.g. a claim that expired
                log.warning("message on %s could not be read", msg.subject, exc_info=True)
                return
            try:
                await handler(value)
            except Exception:  # one bad message never stops the subscription
                log.exception("handling a message on %s failed", msg.subject)

        if isinstance(self.nc, Wire):
            sub: AnySubscription = await self.nc.subscribe(subject, queue=queue, cb=on_msg, inline=inline)
        else:
            sub = await self.nc.subscribe(
                subject, queue=queue, cb=on_msg, pending_msgs_limit=-1, pending_bytes_limit=-1
            )
        self._subs.append((sub, takes_work))
        return sub

    async def stop_taking_work(self, timeout: float = 5.0) -> None:
        """Leave the queue groups that hand this instance new work (draining), without losing
        the work the server had already sent: it arrives and its handlers run (at most
        ``timeout`` seconds)."""

        async def leave(sub: AnySubscription) -> None:
            with contextlib.suppress(Exception):
                if isinstance(sub, WireSubscription):
                    await sub.drain(timeout)
                else:  # nats-py (a faststream broker's connection)
                    await sub.unsubscribe()

        await asyncio.gather(*(leave(sub) for sub, takes_work in self._subs if takes_work))
        with contextlib.suppress(Exception):
            await self.nc.flush(timeout=2)

    async def caught_up(self, timeout: float = 2.0) -> None:
        """Until what has arrived on the other subscriptions is handled (at most ``timeout``
        seconds; nats-py's subscriptions, behind TLS, are not waited for)."""
        if isinstance(self.nc, Wire):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self.nc.caught_up()

    async def request(
        self, subject: str, msg: BaseModel, reply_type: TypeAdapter[T], *, timeout: float, service: str
    ) -> T:
        """Request/reply with typed payloads. A ``BusError`` reply raises the ``ChorusError`` its code stands for; so
        do a timeout (TIMEOUT) and nobody listening for ``NO_RESPONDERS_GRACE_S`` (a replica
        restarting is given that long) (SERVICE_UNAVAILABLE)."""
        loop = asyncio.get_running_loop()
        data, headers = dump(msg), trace_headers()
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
        for nc in (self.nc, self._side):
            await _close(nc)

    async def close_side(self) -> None:
        """Only the JetStream connection this bus opened (the main one is shared)."""
        await _close(self._side)


async def _close(nc: Any) -> None:
    if nc is None:
        return
    with contextlib.suppress(Exception):
        await nc.drain()
    with contextlib.suppress(Exception):
        await nc.close()


Window = float | Callable[[], float]  # seconds, or asked at each frame


def _fixed(seconds: float) -> Callable[[], float]:
    return lambda: seconds


class Outbox(Generic[T, F]):
    """Items for one subject, sent together as one frame.

    ``put`` never waits. An urgent item (the first tokens of a generation: what its time to
    first token depends on) goes out at once, in the caller's step, with whatever else waits.
    Other items go out at once too when the last frame left more than ``window`` seconds ago
    (an engine producing a token every few milliseconds is never delayed); when they come
    faster, at most one frame per ``window`` carries everything put in the meantime, from
    every request: the cost per message stops growing with the number of tokens.

    ``window`` may be a function, asked at each frame: a sender under load stretches it (many
    generations in flight: each one's tokens then travel several to a message, and every hop
    after this one writes, parses and sends once per several tokens instead of per token).

    ``local``: the receiver lives in this process (a worker's parser); each frame is handed to
    it in the step that would have published it, with the same coalescing."""

    def __init__(
        self,
        bus: Bus,
        subject: str,
        frame: Callable[[list[T]], F],
        *,
        window: Window = 0.0,
        local: Callable[[F], None] | None = None,
    ) -> None:
        self.bus = bus
        self.subject = subject
        self._frame = frame
        self._local = local  # the receiver is in this process: its handler, called with each frame
        self._window = window if callable(window) else _fixed(window)
        self._timer: asyncio.TimerHandle | None = None
        self._items: list[T] = []
        self._ready = asyncio.Event()
        self._scheduled = False
        self._last = 0.0  # loop time of the last frame
        self._task: asyncio.Task[None] | None = None
        self._sending = False  # a frame is on its way (a large one waits for the object store)
        self.frames = 0

    def put(self, item: T, *, urgent: bool = False) -> None:
        self._items.append(item)
        if urgent and self._send_now():
            return
        if self._scheduled and not (urgent and self._timer is not None):
            return
        self._scheduled = True
        loop = asyncio.get_running_loop()
        if self._task is None:
            self._task = loop.create_task(self._run(), name=f"outbox {self.subject}")
        wait = 0.0 if urgent else self._last + self._window() - loop.time()
        if wait > 0:
            self._timer = loop.call_later(wait, self._ready.set)
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._ready.set()

    def _send_now(self) -> bool:
        """Everything waiting, sent in this step if the bus can (else the task sends it): never
        while an earlier frame is still on its way, which it would overtake."""
        if self._local is None and (self._sending or not self.bus.sends_nowait):
            return False  # (nats-py: the task sends it; no frame built twice)
        items = self._items
        try:
            if self._local is not None:
                self._local(self._frame(items))
            elif not self.bus.publish_nowait(self.subject, self._frame(items)):
                return False
        except Exception:  # the bus is down: the receiver's recovery takes over
            log.warning("sending %d item(s) to %s failed", len(items), self.subject, exc_info=True)
        self._items = []
        self.frames += 1
        self._last = asyncio.get_running_loop().time()
        return True

    @property
    def pending(self) -> int:
        return len(self._items)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._ready.wait()
            self._ready.clear()
            self._scheduled = False
            self._timer = None
            self._last = loop.time()
            await self.flush()

    async def flush(self) -> None:
        if not self._items:
            return
        items, self._items = self._items, []
        self.frames += 1
        self._sending = True
        try:
            if self._local is not None:
                self._local(self._frame(items))
            else:
                await self.bus.publish(self.subject, self._frame(items))
        except Exception:  # the bus is down: the receiver's recovery takes over
            log.warning("sending %d item(s) to %s failed", len(items), self.subject, exc_info=True)
        finally:
            self._sending = False

    async def close(self) -> None:
        await self.flush()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


class Outboxes(Generic[T, F]):
    """One ``Outbox`` per destination subject, created on first use."""

    def __init__(
        self,
        bus: Bus,
        frame: Callable[[list[T]], F],
        *,
        window: Window = 0.0,
        local: dict[str, Callable[[F], None]] | None = None,
    ) -> None:
        self.bus = bus
        self._frame = frame
        self._window = window
        self._boxes: dict[str, Outbox[T, F]] = {}
        # subjects whose receiver is in this process: frames are handed to it, not published
        self.local: dict[str, Callable[[F], None]] = local or {}

    def put(self, subject: str, item: T, *, urgent: bool = False) -> None:
        box = self._boxes.get(subject)
        if box is None:
            box = self._boxes[subject] = Outbox(
                self.bus, subject, self._frame, window=self._window, local=self.local.get(subject)
            )
        box.put(item, urgent=urgent)

    async def forget(self, subject: str) -> None:
        """A destination that died: drop its box."""
        box = self._boxes.pop(subject, None)
        if box is not None:
            box._items.clear()
            await box.close()

    async def flush(self) -> None:
        """Send everything waiting now (a draining service, before it says it stops)."""
        for box in list(self._boxes.values()):
            await box.flush()

    async def close(self) -> None:
        for box in list(self._boxes.values()):
            await box.close()
