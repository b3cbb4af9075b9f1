"""One keep-alive HTTP/1.1 connection to an engine (an asyncio ``Protocol``; ``httptools``
parses the answer and calls back here), and the typed failures of an engine call. The pool that
owns connections is ``EngineHttp`` (``http.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, cast
from urllib.parse import urlsplit

import httptools


class Pool(Protocol):
    """What a connection tells the pool that owns it."""

    def put(self, conn: Connection) -> None:
        """The answer was read to its end: the connection may be reused."""

    def opened(self, conn: Connection) -> None: ...

    def lost(self, conn: Connection) -> None: ...


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
class Target:
    key: tuple[str, str, int]  # scheme, host, port: the pool an idle connection goes back to
    host: str
    port: int
    tls: bool
    path: str  # with the query
    authority: str  # the Host header


@functools.lru_cache(maxsize=1024)
def target_of(url: str) -> Target:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http:// or https:// URL: {url!r}")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(
        (parts.scheme, parts.hostname, port), parts.hostname, port, tls, path, parts.netloc.rpartition("@")[2]
    )


def request_head(method: str, target: Target, body: bytes | None) -> bytes:
    head = f"{method} {target.path} HTTP/1.1\r\nHost: {target.authority}\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + "\r\n").encode("latin-1")


class Connection(asyncio.Protocol):
    """One TCP connection and the answer being read on it (``httptools`` calls back here)."""

    def __init__(self, pool: Pool, key: tuple[str, str, int]) -> None:
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
            self.pool.put(self)
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
        self.pool.opened(self)

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
        self.pool.lost(self)
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
