"""A lean keep-alive HTTP/1.1 client for the engines: an asyncio ``Protocol`` per connection
and ``httptools`` parsing the answer, so a streamed body reaches its consumer synchronously from
``data_received`` (one call per socket read, no task wake-up, no future per chunk).

``EngineHttp`` (one per dispatcher) keeps idle connections per host: only a connection whose
last answer was read to its end is reused, and one the engine closed while idle is dropped, not
used (an idle connection is also dropped after ``idle_expiry``, before uvicorn's 5 s keep-alive
closes it under us; should that race still be lost, the request is sent once more on a new
connection). ``https://`` works through the standard ``ssl`` module.

Failures are typed (``HttpError``): ``ConnectFailed`` (no connection, or it closed before the
first byte of the answer: another engine may take the request), ``AcceptTimeout`` (no status in
time), ``ConnectionBroken`` (the answer was cut off: the engine died), ``ReadTimeout`` (the body
stalled), ``BadResponse`` (not HTTP/1.x)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

IDLE_EXPIRY_S = 4.0  # below uvicorn's default keep-alive (5 s), which vLLM and SGLang keep


class HttpError(Exception):
    """An engine call without a usable answer; ``retryable``: another engine may serve it."""

    retryable = False


class ConnectFailed(HttpError):
    """No connection, or it closed before the first byte of the answer."""

    retryable = True


class ConnectionBroken(HttpError):
    """The connection broke in the middle of the answer."""

    retryable = True


class HttpTimeout(HttpError):
    """An answer that did not come in time."""


class AcceptTimeout(HttpTimeout):
    """No status line and headers within the accept time."""


class ReadTimeout(HttpTimeout):
    """No body data within the read time."""


class BadResponse(HttpError):
    """Bytes that are not an HTTP/1.x answer."""


@dataclass(frozen=True, slots=True)
class _Target:
    key: tuple[str, str, int]  # scheme, host, port: the pool an idle connection goes back to
    host: str
    port: int
    tls: bool
    path: str  # with the query
    authority: str  # the Host header


@functools.lru_cache(maxsize=1024)
def _target(url: str) -> _Target:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http:// or https:// URL: {url!r}")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return _Target(
        (parts.scheme, parts.hostname, port), parts.hostname, port, tls, path, parts.netloc.rpartition("@")[2]
    )


def _head(method: str, target: _Target, body: bytes | None) -> bytes:
    head = f"{method} {target.path} HTTP/1.1\r\nHost: {target.authority}\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + "\r\n").encode("latin-1")


class _Connection(asyncio.Protocol):
    """One TCP connection and the answer being read on it (``httptools`` calls back here)."""

    def __init__(self, pool: EngineHttp, key: tuple[str, str, int]) -> None:
        self.pool, self.key = pool, key
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.reading = False  # an answer is expected or under way
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.on_data: Callable[[bytes], None] | None = None
        self.pace: Callable[[], float] | None = None  # seconds to leave the socket unread after a read
        self.paused: asyncio.TimerHandle | None = None
        self.received = False  # any byte of the answer
        self.complete = False
        self.keep_alive = False  # the answer allows another on its connection
        self.until_eof = False  # neither length nor chunks: the body ends with the connection
        self.read_timeout = 0.0
        self.last_data = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.answered: asyncio.Future[None] = self.loop.create_future()
        self.done: asyncio.Future[None] = self.loop.create_future()

    # the exchange ------------------------------------------------------------------------
    def send(self, request: bytes, read_timeout: float) -> None:
        """Write a request; the answer's state starts afresh."""
        assert self.transport is not None
        loop = self.loop
        self.parser = httptools.HttpResponseParser(self)
        self.status, self.headers, self.body, self.on_data, self.pace = 0, {}, [], None, None
        self.received = self.complete = self.keep_alive = self.until_eof = False
        self.read_timeout = read_timeout
        self.answered, self.done = loop.create_future(), loop.create_future()
        self.reading = True
        self.transport.write(request)

    def release(self) -> None:
        """The answer's owner is done with it: a connection whose answer was read to its end
        goes back to the pool, any other is closed."""
        if self.reading:
            self._stop()
            self._settle(None)
            self._close()
            return
        if self.done.done() and not self.done.cancelled():
            self.done.exception()  # retrieved: whoever wanted the failure had their chance
        if self.complete and self.keep_alive and not self.closed:
            self.pool._put(self)
        else:
            self._close()

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _stop(self) -> None:
        self.reading = False
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self._resume()

    def _rest(self) -> None:
        """Leave the socket unread for a while (``pace``): what the engine sends meanwhile
        waits in the kernel and arrives as one read, not one read per event."""
        wait = self.pace() if self.pace is not None else 0.0
        if wait > 0 and self.transport is not None and not self.closed:
            self.transport.pause_reading()
            self.paused = self.loop.call_later(wait, self._resume)

    def _resume(self) -> None:
        if self.paused is None:
            return
        self.paused.cancel()
        self.paused = None
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def _settle(self, error: BaseException | None) -> None:
        """``error`` fails ``answered`` before the headers, ``done`` after them; without an
        error, what is unsettled is cancelled (the owner gave up)."""
        if error is None:
            for fut in (self.answered, self.done):
                if not fut.done():
                    fut.cancel()
            return
        fut = self.done if self.status else self.answered
        if not fut.done():
            fut.set_exception(error)

    def _fail(self, error: BaseException) -> None:
        self._stop()
        self._settle(error)
        self._close()

    def _finish(self) -> None:
        self._stop()
        if not self.done.done():
            self.done.set_result(None)

    def _check_read(self) -> None:
        """The one read timer: it wakes once per ``read_timeout`` while data flows."""
        self.timer = None
        if not self.reading:
            return
        idle = self.loop.time() - self.last_data
        if idle < self.read_timeout:
            self.timer = self.loop.call_later(self.read_timeout - idle, self._check_read)
        else:
            self._fail(ReadTimeout(f"the engine sent nothing for {self.read_timeout:g}s"))

    # asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.opened(transport)

    def opened(self, transport: asyncio.BaseTransport) -> None:
        """The transport, from ``connection_made`` or ``create_connection``, whichever comes
        first (uvloop may call ``connection_made`` later)."""
        if self.transport is not None:
            return
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.pool._opened(self)

    def data_received(self, data: bytes) -> None:
        if not self.reading:  # bytes nobody asked for: the connection cannot be trusted
            self._close()
            return
        self.last_data = self.loop.time()
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(BadResponse(f"the engine's answer is not HTTP/1.x: {exc}"))
            return
        body = self.body
        if body and self.on_data is not None:
            chunk = body[0] if len(body) == 1 else b"".join(body)
            body.clear()
            try:
                self.on_data(chunk)
            except Exception as exc:  # noqa: BLE001 - the consumer's failure ends the answer
                self._fail(exc)
                return
        if self.complete:
            self._finish()
        elif self.pace is not None and self.reading:
            self._rest()

    def eof_received(self) -> bool | None:
        return None  # close: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._lost(self)
        if not self.reading:
            return
        if self.status and self.until_eof:
            self.complete = True
            self._finish()
        elif not self.received:
            self._fail(ConnectFailed("the engine closed the connection before answering"))
        else:
            why = f"{type(exc).__name__}: {exc}" if exc is not None else "closed by the engine"
            self._fail(ConnectionBroken(f"the connection to the engine broke ({why})"))

    # httptools callbacks -------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:  # informational (103 Early Hints, say): the answer is still to come
            self.headers = {}
            return
        self.status = status
        headers = self.headers
        self.until_eof = (
            "content-length" not in headers and "chunked" not in headers.get("transfer-encoding", "").lower()
        )
        if not self.answered.done():
            self.answered.set_result(None)
        self.timer = self.loop.call_later(self.read_timeout, self._check_read)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if not self.status:  # the end of an informational answer
            return
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()  # reset once the message is over


class HttpStream:
    """An answer whose status and headers arrived; its body is read by ``start`` (streamed to a
    callback) or ``read_all``. ``done`` resolves when the answer ended, or fails with
    ``ConnectionBroken``, ``ReadTimeout`` or ``BadResponse`` (or the callback's own exception).
    ``close`` must follow: a complete answer's connection is reused, any other closed."""

    def __init__(self, conn: _Connection, pool: EngineHttp) -> None:
        self._conn, self._pool = conn, pool
        self.status = conn.status
        self.headers = conn.headers
        self.done = conn.done
        self._closed = False

    def start(self, on_data: Callable[[bytes], None], pace: Callable[[], float] | None = None) -> None:
        """Hand every body chunk to ``on_data``, synchronously, as it arrives (one call per
        socket read); what arrived before is handed over now. An exception from ``on_data``
        fails ``done`` (raised by ``start`` itself for what had arrived before). ``pace``, asked
        after each read, says how long to leave the socket unread before the next one (a busy
        reader then takes many events per read)."""
        conn = self._conn
        if conn.on_data is not None:
            raise RuntimeError("the body is already being read")
        conn.on_data = on_data
        conn.pace = pace
        if conn.body:
            data = b"".join(conn.body)
            conn.body.clear()
            on_data(data)

    async def read_all(self) -> bytes:
        """The whole body (for small answers, error answers among them)."""
        if self._conn.on_data is not None:
            raise RuntimeError("the body is being streamed")
        await self.done
        return b"".join(self._conn.body)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._conn.release()
        self._pool._slots.release()


class EngineHttp:
    """The dispatcher's HTTP client for its engines: a pool of idle connections per host and
    at most ``max_connections`` answers in hand at once (further requests wait for one)."""

    def __init__(
        self,
        *,
        connect_timeout: float = 3.0,
        max_connections: int = 1024,
        idle_expiry: float = IDLE_EXPIRY_S,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.max_connections = max_connections
        self.idle_expiry = idle_expiry
        self._ssl = ssl_context
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: dict[tuple[str, str, int], dict[_Connection, None]] = {}
        self._open: set[_Connection] = set()
        self._closed = False

    @property
    def connections(self) -> int:
        """Connections open now, idle ones included."""
        return len(self._open)

    async def stream(self, url: str, body: bytes, *, accept_timeout: float, read_timeout: float) -> HttpStream:
        """POST ``body`` (JSON) and return once the status line and headers arrived."""
        return await self._exchange("POST", url, body, accept_timeout, read_timeout)

    async def request(self, method: str, url: str, body: bytes | None = None, *, timeout: float) -> tuple[int, bytes]:
        """A small call, answer read whole within ``timeout``: (status, body)."""
        try:
            async with asyncio.timeout(timeout):
                answer = await self._exchange(method, url, body, timeout, timeout)
                try:
                    return answer.status, await answer.read_all()
                finally:
                    answer.close()
        except TimeoutError as exc:
            raise HttpTimeout(f"no whole answer within {timeout:g}s") from exc

    async def close(self) -> None:
        self._closed = True
        for conn in list(self._open):
            conn._close()
        self._idle.clear()

    # internals -----------------------------------------------------------------------------
    async def _exchange(
        self, method: str, url: str, body: bytes | None, accept_timeout: float, read_timeout: float
    ) -> HttpStream:
        if self._closed:
            raise RuntimeError("the engine HTTP client is closed")
        target = _target(url)
        request = _head(method, target, body) + (body or b"")
        deadline = asyncio.get_running_loop().time() + accept_timeout
        if self._slots.locked():
            try:
                async with asyncio.timeout_at(deadline):
                    await self._slots.acquire()
            except TimeoutError as exc:
                raise AcceptTimeout(f"no free engine connection within {accept_timeout:g}s") from exc
        else:
            await self._slots.acquire()
        try:
            for attempt in range(2):
                conn = self._take(target.key)
                reused = conn is not None
                if conn is None:
                    conn = await self._connect(target, deadline)
                conn.send(request, read_timeout)
                try:
                    async with asyncio.timeout_at(deadline):
                        await conn.answered
                except ConnectFailed:
                    if reused and attempt == 0:
                        continue  # closed by the engine as it was reused: once more, on a new one
                    raise
                except TimeoutError as exc:
                    conn.release()
                    raise AcceptTimeout(f"the engine did not answer within {accept_timeout:g}s") from exc
                except BaseException:
                    conn.release()
                    raise
                return HttpStream(conn, self)
            raise AssertionError("unreachable")
        except BaseException:
            self._slots.release()
            raise

    async def _connect(self, target: _Target, deadline: float) -> _Connection:
        loop = asyncio.get_running_loop()
        limit = min(self.connect_timeout, deadline - loop.time())
        context = None
        if target.tls:
            context = self._ssl = self._ssl or ssl.create_default_context()
        try:
            async with asyncio.timeout(limit):
                transport, conn = await loop.create_connection(
                    lambda: _Connection(self, target.key),
                    target.host,
                    target.port,
                    ssl=context,
                    server_hostname=target.host if context else None,
                )
        except TimeoutError as exc:
            if limit < self.connect_timeout:
                raise AcceptTimeout(f"the engine did not answer within {limit:g}s") from exc
            raise ConnectFailed(f"connecting timed out after {limit:g}s") from exc
        except OSError as exc:  # refused, unreachable, unknown host, TLS
            raise ConnectFailed(f"{type(exc).__name__}: {exc.strerror or exc}") from exc
        conn.opened(transport)
        return conn

    def _take(self, key: tuple[str, str, int]) -> _Connection | None:
        """The most recently used idle connection still worth using."""
        idle = self._idle.get(key)
        if not idle:
            return None
        oldest_ok = asyncio.get_running_loop().time() - self.idle_expiry
        while idle:
            conn, _ = idle.popitem()
            if conn.closed or conn.transport is None or conn.transport.is_closing():
                continue
            if conn.idle_since < oldest_ok:
                conn._close()
                continue
            return conn
        return None

    def _put(self, conn: _Connection) -> None:
        idle = self._idle.setdefault(conn.key, {})
        if self._closed or len(idle) >= self.max_connections:
            conn._close()
            return
        conn.idle_since = conn.loop.time()
        idle[conn] = None

    def _opened(self, conn: _Connection) -> None:
        self._open.add(conn)

    def _lost(self, conn: _Connection) -> None:
        self._open.discard(conn)
        idle = self._idle.get(conn.key)
        if idle is not None:
            idle.pop(conn, None)
