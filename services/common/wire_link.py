"""How a ``Wire`` gets and keeps its connection (``wire.py`` has what goes over it).

- The handshake: TCP, then the server's INFO (in plain text, or after TLS with
  ``tls_handshake_first``), TLS when the URL, the options or the INFO ask for it
  (``loop.start_tls``), CONNECT with the credentials (``wire_auth.py``), and a PING answered.
- The servers: one round over the URL's list at start (``wire_servers.py``), the cluster's
  other servers learnt from INFO; a refused or dead server is skipped, and the error when none
  answers names each one with what it said.
- Upkeep: PINGs every ``ping_interval`` (too many unanswered: the connection is stale), and a
  lost connection replaced by the next server in turn, forever, resubscribing and sending what
  was published meanwhile.
- Lame duck mode (a server's INFO with ``ldm``: it is shutting down): the client flushes what it
  sent there, moves to another server and sends what was published during the move (nothing
  published is lost; the subscriptions are away from the cluster for that moment, as in any
  reconnect)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

import nats.errors

from services.common import nats_frames as frames
from services.common.nats_frames import CRLF
from services.common.wire_auth import Auth
from services.common.wire_protocol import LinkProtocol
from services.common.wire_servers import Server, ServerPool
from services.common.wire_tls import describe

if TYPE_CHECKING:
    from services.common.wire_subscription import Subscription

log = logging.getLogger("chorus.wire")

DEFAULT_MAX_PAYLOAD = 1024 * 1024
CONNECT_ERRORS = (OSError, TimeoutError, nats.errors.Error)  # an attempt that failed: try the next server

Hook = Callable[[], Awaitable[None]]
ErrorHook = Callable[[Exception], Awaitable[None]]


class ConnectError(nats.errors.Error):
    """One server could not be used (its message says why)."""


class NoServersAnswered(nats.errors.NoServersError):
    """None of the servers could be connected to: each one and what it said."""

    def __init__(self, failures: list[str]) -> None:
        super().__init__(failures)
        self.failures = failures

    def __str__(self) -> str:
        return "nats: no server could be connected to: " + "; ".join(self.failures)


class Link:
    """The connecting and reconnecting half of ``Wire`` (whose ``__init__`` sets all of this)."""

    name: str
    pool: ServerPool
    auth: Auth
    tls: ssl.SSLContext | None
    tls_hostname: str | None
    tls_handshake_first: bool
    reconnect_time_wait: float
    connect_timeout: float
    ping_interval: float
    max_outstanding_pings: int
    max_payload: int
    server_info: dict[str, Any]
    _disconnected_cb: Hook | None
    _reconnected_cb: Hook | None
    _error_cb: ErrorHook | None
    _proto: LinkProtocol | None
    _subs: dict[int, Subscription]
    _pongs: deque[asyncio.Future[None]]
    _info: asyncio.Future[dict[str, Any]] | None
    _pending: bytearray
    _ready: bool
    _reconnecting: bool
    _refusal: str | None
    _closed: bool
    _tasks: set[asyncio.Task[None]]

    def _new_protocol(self) -> LinkProtocol:
        return LinkProtocol(self._message, self._control, self._connection_lost)

    def _message(
        self, subject: str, sid: int, reply: str, headers: dict[str, str] | None, status: int | None, data: bytes
    ) -> None:
        raise NotImplementedError

    def _control(self, line: bytes) -> None:
        raise NotImplementedError

    def _write(self, data: bytes) -> None:
        raise NotImplementedError

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # connecting ---------------------------------------------------------------------------
    async def _connect_first(self) -> None:
        """One round over the servers; ``NoServersAnswered`` when none could be used."""
        failures: list[str] = []
        last: BaseException | None = None
        for server in self.pool.round():
            try:
                await self._attempt(server)
                return
            except CONNECT_ERRORS as exc:
                failures.append(f"{server.label}: {self._reason(exc)}")
                last = exc
        raise NoServersAnswered(failures) from last

    async def _attempt(self, server: Server) -> None:
        """``_open``, not sooner than ``reconnect_time_wait`` after the previous try of ``server``."""
        wait = server.last_attempt + self.reconnect_time_wait - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        server.last_attempt = time.monotonic()
        await self._open(server)

    def _reason(self, exc: BaseException) -> str:
        if isinstance(exc, ssl.SSLError):
            return describe(exc)
        if isinstance(exc, ConnectionRefusedError):
            return "connection refused"
        return str(exc) or type(exc).__name__

    async def _open(self, server: Server) -> None:
        """One connection attempt, within ``connect_timeout`` (a timeout says what did not come)."""
        waiting = ["TCP connection"]
        try:
            async with asyncio.timeout(self.connect_timeout):
                info = await self._handshake(server, waiting)
        except TimeoutError:
            hint = " (a TLS-first server needs tls_handshake_first)" if waiting[-1] == "INFO" else ""
            raise ConnectError(f"no {waiting[-1]} within {self.connect_timeout:g} s{hint}") from None
        self.max_payload = int(info.get("max_payload", DEFAULT_MAX_PAYLOAD))
        self.server_info = info
        self.pool.current = server
        self._learn(info)
        self._ready = True

    async def _handshake(self, server: Server, waiting: list[str]) -> dict[str, Any]:
        """TCP, INFO, TLS, CONNECT, PING/PONG: the server's INFO (``waiting``: the step under way)."""
        loop = asyncio.get_running_loop()
        info_received: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._info, self._refusal, self._ready = info_received, None, False
        first = self.tls_handshake_first
        transport, proto = await loop.create_connection(
            self._new_protocol,
            server.host,
            server.port,
            ssl=self._tls_context() if first else None,
            server_hostname=self._tls_name(server) if first else None,
        )
        self._proto = proto
        pong: asyncio.Future[None] = loop.create_future()
        try:
            waiting.append("INFO")
            await asyncio.wait([info_received, proto.lost], return_when=asyncio.FIRST_COMPLETED)
            if not info_received.done():
                raise ConnectError(_closed(proto, "the server closed the connection before its INFO"))
            info = info_received.result()
            if not first and self._wants_tls(server, info):
                waiting.append("TLS handshake")
                upgraded = await loop.start_tls(
                    transport, proto, self._tls_context(), server_hostname=self._tls_name(server)
                )
                if upgraded is None:
                    raise ConnectError("the TLS handshake gave no transport")
                transport = proto.transport = upgraded
            connect: dict[str, Any] = {
                "verbose": False,
                "pedantic": False,
                "lang": "python-chorus",
                "version": "1",
                "protocol": 1,
                "headers": True,
                "no_responders": True,
                "name": self.name,
                **self.auth.connect_fields(server, info),
            }
            self._pongs.appendleft(pong)  # the first PING on this connection (queued ones follow)
            waiting.append("answer to CONNECT")
            transport.write(b"CONNECT " + json.dumps(connect).encode() + CRLF + b"PING" + CRLF)
            await asyncio.wait([pong, proto.lost], return_when=asyncio.FIRST_COMPLETED)
            if not pong.done() or proto.lost.done():
                raise ConnectError(self._refused(server) or _closed(proto, "the server closed the connection"))
        except BaseException:
            transport.abort()
            self._proto = None
            with contextlib.suppress(ValueError):  # unanswered: later PONGs must not match it
                self._pongs.remove(pong)
            raise
        return info

    def _wants_tls(self, server: Server, info: dict[str, Any]) -> bool:
        """Whether to start TLS after this INFO (an error if the client wants it and the server
        does not offer it)."""
        wanted = server.scheme == "tls" or self.tls is not None
        if info.get("tls_required") or (wanted and info.get("tls_available")):
            return True
        if wanted:
            raise ConnectError("TLS was asked for but the server does not offer it")
        return False

    def _tls_context(self) -> ssl.SSLContext:
        """The context given, or (a server requires TLS and none was) the system's trust store."""
        return self.tls if self.tls is not None else _system_context()

    def _tls_name(self, server: Server) -> str:
        return self.tls_hostname or server.tls_name or server.host

    def _refused(self, server: Server) -> str | None:
        """The server's -ERR during the handshake, said as a refused login where it is one."""
        refusal = self._refusal
        if refusal and ("Authorization" in refusal or "Authentication" in refusal):
            return f"login refused ({self.auth.describe(server)}): {refusal}"
        return refusal

    # what the servers say ---------------------------------------------------------------
    def _info_update(self, info: dict[str, Any]) -> None:
        """An INFO after the handshake: a new max_payload, the cluster's servers, lame duck mode
        (only the current connection reads: a connection left is closed, its reading stopped)."""
        proto = self._proto
        self.max_payload = int(info.get("max_payload", self.max_payload))
        self.server_info = info
        self._learn(info)
        if info.get("ldm") and proto is not None and self._ready:
            if self.pool.has_others():
                self._spawn(self._leave(proto))
            else:
                log.warning("%s: the NATS server is shutting down (lame duck mode), no other known", self.name)

    def _learn(self, info: dict[str, Any]) -> None:
        urls = info.get("connect_urls")
        if urls:
            added = self.pool.learn([str(u) for u in urls], bool(info.get("tls_required")))
            if added:
                log.debug("%s: NATS servers learnt: %s", self.name, ", ".join(s.label for s in added))

    async def _leave(self, proto: LinkProtocol) -> None:
        """Lame duck mode: what was sent here reaches the server (a PING answered), then the
        connection is given up as if lost, and what is published meanwhile waits for the next."""
        if proto is not self._proto or not self._ready or self._closed or proto.transport is None:
            return
        current = self.pool.current
        log.info("%s: %s is shutting down (lame duck mode); moving", self.name, current and current.label)
        self._ready = False  # from here publishes wait in _pending for the next server
        pong: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pongs.append(pong)  # every PING before it went to this server: their PONGs come first
        proto.transport.write(b"PING" + CRLF)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.connect_timeout):
                await asyncio.wait([pong, proto.lost], return_when=asyncio.FIRST_COMPLETED)
        if proto is not self._proto or self._closed:
            return
        answered = pong.done() and not pong.cancelled() and pong.exception() is None
        proto.transport.close()
        self._lost(fail_pongs=not answered)  # the PINGs still waiting are in _pending: kept

    # keeping the connection ---------------------------------------------------------------
    async def _pinger(self) -> None:
        """PING every ``ping_interval``; too many unanswered: the connection is stale."""
        loop = asyncio.get_running_loop()
        outstanding: list[asyncio.Future[None]] = []
        while not self._closed:
            await asyncio.sleep(self.ping_interval)
            proto = self._proto
            if proto is None or proto.lost.done():
                outstanding.clear()
                if proto is not None and not self._reconnecting:  # a loss nobody is handling
                    self._lost()
                continue
            if not self._ready:  # a handshake or a move under way: nothing to ping
                outstanding.clear()
                continue
            outstanding = [f for f in outstanding if not f.done()]
            if len(outstanding) >= self.max_outstanding_pings:
                log.warning("%s: NATS server stopped answering PINGs; reconnecting", self.name)
                outstanding.clear()
                if proto.transport is not None:
                    proto.transport.abort()
                continue
            try:
                self._write(b"PING" + CRLF)
            except nats.errors.Error:
                continue
            pong: asyncio.Future[None] = loop.create_future()
            self._pongs.append(pong)
            outstanding.append(pong)

    def _fail_pongs(self, error: Exception) -> None:
        for pong in self._pongs:
            if not pong.done():
                pong.set_exception(error)
                pong.exception()  # a flush awaiting it raises; the pinger's own are not awaited
        self._pongs.clear()

    def _connection_lost(self, proto: LinkProtocol, exc: Exception | None) -> None:
        if proto is not self._proto or self._closed or not self._ready:
            return  # an attempt that failed during its handshake (or a move) says so itself
        self._lost()

    def _lost(self, *, fail_pongs: bool = True) -> None:
        """The connection is gone: its PINGs with it, and a reconnect starts (unless one runs)."""
        self._proto, self._ready = None, False
        if fail_pongs:
            self._fail_pongs(nats.errors.UnexpectedEOF())
        if not self._reconnecting:
            self._spawn(self._reconnect())

    async def _reconnect(self) -> None:
        self._reconnecting = True
        try:
            while not self._closed:
                await self._reconnect_loop()
                if self._ready:
                    return  # else lost again while the hook ran (its loss spawned no reconnect)
        finally:
            self._reconnecting = False

    async def _reconnect_loop(self) -> None:
        if self._disconnected_cb is not None:
            await self._call(self._disconnected_cb)
        while not self._closed:
            for server in self.pool.round():  # the others first, the one lost last
                if self._closed:
                    return
                try:
                    await self._attempt(server)
                except CONNECT_ERRORS as exc:
                    log.debug("%s: reconnecting to %s failed: %s", self.name, server.label, self._reason(exc))
                    continue
                resubscribe = b"".join(frames.sub(sub.subject, sub.queue, sub.sid) for sub in self._subs.values())
                pending, self._pending = bytes(self._pending), bytearray()
                self._write(resubscribe + pending)
                if self._reconnected_cb is not None:
                    await self._call(self._reconnected_cb)
                return

    async def _report(self, error: Exception) -> None:
        if self._error_cb is not None:
            with contextlib.suppress(Exception):
                await self._error_cb(error)

    async def _call(self, hook: Hook) -> None:
        try:
            await hook()
        except Exception:  # a callback's failure never stops the connection
            log.exception("%s: a NATS connection callback failed", self.name)


@functools.cache
def _system_context() -> ssl.SSLContext:
    return ssl.create_default_context()


def _closed(proto: LinkProtocol, what: str) -> str:
    """``what``, with the reason the connection ended if there was one (a TLS alert, a reset)."""
    exc = proto.lost.result() if proto.lost.done() else None
    return f"{what} ({describe(exc)})" if exc is not None else what
