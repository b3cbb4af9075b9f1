"""A lean NATS client for the hops on a request's path (its frames: ``nats_frames.py``).

With nats-py each side of a hop runs through its own tasks (a flusher before the bytes leave,
a reader and a task per subscription before a callback runs); in a process idle for a few
milliseconds each is a cold step. ``Wire`` works from the socket's callbacks instead:

- ``publish`` writes the frame at once (the transport sends it in the same call when its
  buffer is empty; a full buffer makes ``publish`` wait: back-pressure, not memory);
- ``MSG``/``HMSG`` frames are parsed in ``data_received`` and handed to the subscription's
  callback in order, one task per burst of messages rather than one per message;
- the connection is watched with PINGs and reconnects forever, resubscribing and sending
  what was published meanwhile (up to ``buffer_limit`` bytes), with the same callbacks and
  errors as nats-py (``nats.errors``), so ``Bus`` is written once for both.

It covers what Chorus's services use: publish (with headers and reply subjects), queue
subscriptions, request/reply (with the server's no-responders status), flush, drain and close;
and how a production fleet runs NATS (``wire_link.py``): TLS (``wire_tls.py``), user/password,
token, nkey and creds-file logins (``wire_auth.py``), a cluster (the servers in the URL and the
ones learnt from INFO, ``wire_servers.py``) and lame duck mode. JetStream stays with nats-py."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import ssl
import uuid
from collections import deque
from pathlib import Path
from typing import Any

import nats.errors

from services.common import nats_frames as frames
from services.common.nats_frames import CRLF
from services.common.wire_auth import Auth
from services.common.wire_link import DEFAULT_MAX_PAYLOAD, ErrorHook, Hook, Link, NoServersAnswered
from services.common.wire_protocol import LinkProtocol
from services.common.wire_servers import ServerPool
from services.common.wire_subscription import Callback, Msg, Received, Subscription
from services.common.wire_tls import tls_context

__all__ = ["Msg", "NoServersAnswered", "Received", "Subscription", "Wire", "tls_context"]

log = logging.getLogger("chorus.wire")


class Wire(Link):
    """One service's connection to NATS (see the module's docstring)."""

    def __init__(
        self,
        servers: list[str],
        *,
        name: str = "",
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        nkeys_seed: str | Path | None = None,
        nkeys_seed_str: str | None = None,
        user_credentials: str | Path | None = None,
        tls: ssl.SSLContext | None = None,
        tls_hostname: str | None = None,
        tls_handshake_first: bool = False,
        dont_randomize: bool = False,
        reconnect_time_wait: float = 0.25,
        connect_timeout: float = 2.0,
        ping_interval: float = 2.0,
        max_outstanding_pings: int = 2,
        buffer_limit: int = 2 * 1024 * 1024,
        disconnected_cb: Hook | None = None,
        reconnected_cb: Hook | None = None,
        error_cb: ErrorHook | None = None,
    ) -> None:
        """``servers``: ``nats://`` or ``tls://`` URLs (credentials in a URL are used for that
        server); the login options are as in nats-py (``nkeys_seed`` and ``user_credentials``
        are files); ``tls``: a context (``tls_context`` builds one from file paths)."""
        self.servers = servers
        self.pool = ServerPool(servers, randomize=not dont_randomize)
        self.name = name
        self.auth = Auth(user, password, token, nkeys_seed, nkeys_seed_str, user_credentials)
        self.auth.check()
        self.tls, self.tls_hostname, self.tls_handshake_first = tls, tls_hostname, tls_handshake_first
        self.reconnect_time_wait = reconnect_time_wait
        self.connect_timeout = connect_timeout
        self.ping_interval = ping_interval
        self.max_outstanding_pings = max_outstanding_pings
        self.buffer_limit = buffer_limit
        self._disconnected_cb, self._reconnected_cb, self._error_cb = disconnected_cb, reconnected_cb, error_cb
        self.max_payload = DEFAULT_MAX_PAYLOAD
        self.server_info: dict[str, Any] = {}
        self._proto: LinkProtocol | None = None
        self._sids = itertools.count(1)
        self._subs: dict[int, Subscription] = {}
        self._pongs: deque[asyncio.Future[None]] = deque()
        self._info: asyncio.Future[dict[str, Any]] | None = None
        self._pending = bytearray()  # published while disconnected, sent after the reconnect
        self._ready = False  # connected and past CONNECT: frames go to the socket
        self._reconnecting = False
        self._refusal: str | None = None  # the server's -ERR during the last attempt
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()
        # request/reply: one wildcard inbox, a token per request
        self._inbox_prefix = f"_INBOX.{uuid.uuid4().hex}"
        self._requests: dict[str, asyncio.Future[Msg]] = {}
        self._request_sub: Subscription | None = None
        self._tokens = itertools.count(1)

    @classmethod
    async def connect(cls, url: str, **options: Any) -> Wire:
        """Connected to one of the servers in ``url`` (a comma-separated list), or
        ``NoServersAnswered`` (a ``nats.errors.NoServersError``) naming each server tried and
        what it said (a refused login, a certificate refused, no answer)."""
        wire = cls([u.strip() for u in url.split(",") if u.strip()], **options)
        await wire._connect_first()
        wire._spawn(wire._pinger())
        return wire

    # the protocol -------------------------------------------------------------------------
    def _message(
        self, subject: str, sid: int, reply: str, headers: dict[str, str] | None, status: int | None, data: bytes
    ) -> None:
        sub = self._subs.get(sid)
        if sub is None:
            return  # unsubscribed meanwhile
        msg = Msg(subject, reply, data, headers, self)
        if sub is self._request_sub:
            self._answer(msg, status)
        else:
            sub._deliver(msg)

    def _control(self, line: bytes) -> None:
        if line == b"PING":
            self._write(b"PONG" + CRLF)
        elif line == b"PONG":  # answers the oldest PING, whether its waiter still waits or not
            if self._pongs and not (pong := self._pongs.popleft()).done():
                pong.set_result(None)
        elif line.startswith(b"INFO "):
            info = json.loads(line[5:])
            if self._info is not None and not self._info.done():
                self._info.set_result(info)
            else:
                self._info_update(info)
        elif line.startswith(b"-ERR"):
            message = line[4:].strip().strip(b"'").decode(errors="replace")
            self._refusal = message
            # while connecting, the refusal is what connect() raises (and says): not logged twice
            log.log(logging.WARNING if self._ready else logging.DEBUG, "NATS server error: %s", message)
            self._spawn(self._report(nats.errors.Error(message)))
        # +OK (verbose is off) and anything unknown: nothing to do

    # sending ----------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        proto = self._proto
        if self._ready and proto is not None and proto.transport is not None and not proto.transport.is_closing():
            proto.transport.write(data)
        elif len(self._pending) + len(data) <= self.buffer_limit:
            self._pending += data  # sent after the reconnect
        else:
            raise nats.errors.OutboundBufferLimitError()

    async def publish(
        self, subject: str, payload: bytes = b"", reply: str = "", headers: dict[str, str] | None = None
    ) -> None:
        self.publish_nowait(subject, payload, reply, headers)
        proto = self._proto
        if proto is not None and not proto.writable.is_set():
            await proto.writable.wait()  # the socket's buffer is full: wait for it to drain

    def publish_nowait(
        self, subject: str, payload: bytes = b"", reply: str = "", headers: dict[str, str] | None = None
    ) -> None:
        """``publish`` without waiting for a full socket buffer to drain (for the few messages
        that must leave in the caller's step: a generation's first tokens)."""
        if self._closed:
            raise nats.errors.ConnectionClosedError()
        if not subject or " " in subject:
            raise nats.errors.BadSubjectError()
        if len(payload) > self.max_payload:
            raise nats.errors.MaxPayloadError()
        self._write(frames.pub(subject, payload, reply, headers))

    async def subscribe(
        self, subject: str, queue: str = "", cb: Callback | None = None, *, inline: bool = False, **_: Any
    ) -> Subscription:
        """``cb`` gets every message (nats-py's pending limits are accepted and ignored:
        messages wait in the subscription's backlog, which a burst task empties). ``inline``:
        a message arriving while none is being handled starts ``cb`` in the socket's callback
        (for callbacks on a request's path; such a callback does not see itself as a task,
        so ``asyncio.timeout`` and ``current_task`` are not for its first step)."""
        if self._closed:
            raise nats.errors.ConnectionClosedError()
        sub = Subscription(self, next(self._sids), subject, queue, cb, inline=inline)
        self._subs[sub.sid] = sub
        self._write(frames.sub(subject, queue, sub.sid))
        return sub

    def _unsubscribe(self, sub: Subscription, *, forget: bool = True) -> None:
        """UNSUB sent once; ``forget``: messages still arriving for it are dropped."""
        if sub.sid in self._subs and not sub.unsubscribed and not self._closed:
            sub.unsubscribed = True
            with contextlib.suppress(nats.errors.Error):
                self._write(b"UNSUB %d\r\n" % sub.sid)
        if forget:
            self._subs.pop(sub.sid, None)

    def _idle(self) -> bool:
        """No message received on this connection is waiting to be handled."""
        return all(sub.handling is None for sub in self._subs.values())

    def new_inbox(self) -> str:
        return f"_INBOX.{uuid.uuid4().hex}"

    async def request(
        self, subject: str, payload: bytes = b"", timeout: float = 1.0, headers: dict[str, str] | None = None
    ) -> Msg:
        """The first reply; ``nats.errors.NoRespondersError`` when nobody listens on
        ``subject``, ``nats.errors.TimeoutError`` when no reply came in ``timeout`` seconds."""
        if self._request_sub is None:
            self._request_sub = await self.subscribe(f"{self._inbox_prefix}.*")
        token = str(next(self._tokens))
        future: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
        self._requests[token] = future
        try:
            await self.publish(subject, payload, reply=f"{self._inbox_prefix}.{token}", headers=headers)
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            raise nats.errors.TimeoutError() from None
        finally:
            self._requests.pop(token, None)

    def _answer(self, msg: Msg, status: int | None) -> None:
        future = self._requests.get(msg.subject.rsplit(".", 1)[-1])
        if future is None or future.done():
            return
        if status == 503:
            future.set_exception(nats.errors.NoRespondersError())
        else:
            future.set_result(msg)

    async def flush(self, timeout: float = 2.0) -> None:
        """Wait until the server has everything sent so far (a PING answered)."""
        if self._closed:
            raise nats.errors.ConnectionClosedError()
        self._write(b"PING" + CRLF)
        pong: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pongs.append(pong)
        try:
            async with asyncio.timeout(timeout):
                await pong
        except TimeoutError:
            raise nats.errors.TimeoutError() from None

    # state ------------------------------------------------------------------------------
    @property
    def is_connected(self) -> bool:
        proto = self._proto
        return not self._closed and self._ready and proto is not None and not proto.lost.done()

    @property
    def is_closed(self) -> bool:
        return self._closed

    async def drain(self, timeout: float = 30.0) -> None:
        """Stop receiving (UNSUB everywhere), let what the server had already sent arrive and
        be handled (at most ``timeout`` seconds), then close."""
        if self._closed:
            return
        await self._drain([sub for sub in self._subs.values() if sub is not self._request_sub], timeout)
        await self.close()

    async def caught_up(self) -> None:
        """Until every message received so far has been handled, on every subscription but the
        caller's own: what a peer sent before saying "I stop" is handled before that news is
        acted on (each subscription hands its messages to its callback in its own task)."""
        me = asyncio.current_task()
        await asyncio.gather(
            *(sub.handled_upto(sub.delivered) for sub in list(self._subs.values()) if sub.handling not in (None, me))
        )

    async def _drain(self, subs: list[Subscription], timeout: float) -> None:
        """UNSUB each, one round trip (everything the server sent before has arrived), then
        forget them and wait until their messages are handled (at most ``timeout`` seconds)."""
        for sub in subs:
            self._unsubscribe(sub, forget=False)
        with contextlib.suppress(nats.errors.Error):
            await self.flush(timeout=min(timeout, 5.0))
        for sub in subs:
            self._unsubscribe(sub)
        handling = {sub.handling for sub in subs if sub.handling is not None}
        if handling:
            await asyncio.wait(handling, timeout=timeout)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for request in self._requests.values():
            if not request.done():
                request.set_exception(nats.errors.ConnectionClosedError())
        self._fail_pongs(nats.errors.ConnectionClosedError())
        self._subs.clear()
        proto, self._proto = self._proto, None
        if proto is not None and proto.transport is not None:
            proto.writable.set()  # a publisher waiting for the buffer to drain goes on (and fails)
            if proto.transport.get_write_buffer_size():
                proto.transport.abort()  # a server that stopped reading would hold close() forever
            else:
                proto.transport.close()
