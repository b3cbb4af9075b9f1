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
import ssl
from collections.abc import Callable
from dataclasses import dataclass

from services.dispatcher.engines.http_connection import AcceptTimeout as AcceptTimeout
from services.dispatcher.engines.http_connection import BadResponse as BadResponse
from services.dispatcher.engines.http_connection import ConnectFailed as ConnectFailed
from services.dispatcher.engines.http_connection import Connection, Target, request_head, target_of
from services.dispatcher.engines.http_connection import ConnectionBroken as ConnectionBroken
from services.dispatcher.engines.http_connection import HttpError as HttpError
from services.dispatcher.engines.http_connection import HttpTimeout as HttpTimeout
from services.dispatcher.engines.http_connection import ReadTimeout as ReadTimeout

IDLE_EXPIRY_S = 4.0  # below uvicorn's default keep-alive (5 s), which vLLM and SGLang keep


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    headers: dict[str, str]  # names in lower case


class HttpStream:
    """An answer whose status and headers arrived; its body is read by ``start`` (streamed to a
    callback) or ``read_all``. ``done`` resolves when the answer ended, or fails with
    ``ConnectionBroken``, ``ReadTimeout`` or ``BadResponse`` (or the callback's own exception).
    ``close`` must follow: a complete answer's connection is reused, any other closed."""

    def __init__(self, conn: Connection, pool: EngineHttp) -> None:
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
        self._idle: dict[tuple[str, str, int], dict[Connection, None]] = {}
        self._open: set[Connection] = set()
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
        reply = await self.fetch(method, url, body, timeout=timeout)
        return reply.status, reply.body

    async def fetch(self, method: str, url: str, body: bytes | None = None, *, timeout: float) -> Reply:
        """A small call, answer read whole within ``timeout``, its headers too."""
        try:
            async with asyncio.timeout(timeout):
                answer = await self._exchange(method, url, body, timeout, timeout)
                try:
                    return Reply(answer.status, await answer.read_all(), answer.headers)
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
        target = target_of(url)
        request = request_head(method, target, body) + (body or b"")
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

    async def _connect(self, target: Target, deadline: float) -> Connection:
        loop = asyncio.get_running_loop()
        limit = min(self.connect_timeout, deadline - loop.time())
        context = None
        if target.tls:
            context = self._ssl = self._ssl or ssl.create_default_context()
        try:
            async with asyncio.timeout(limit):
                transport, conn = await loop.create_connection(
                    lambda: Connection(self, target.key),
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

    def _take(self, key: tuple[str, str, int]) -> Connection | None:
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

    def put(self, conn: Connection) -> None:
        idle = self._idle.setdefault(conn.key, {})
        if self._closed or len(idle) >= self.max_connections:
            conn._close()
            return
        conn.idle_since = conn.loop.time()
        idle[conn] = None

    def opened(self, conn: Connection) -> None:
        self._open.add(conn)

    def lost(self, conn: Connection) -> None:
        self._open.discard(conn)
        idle = self._idle.get(conn.key)
        if idle is not None:
            idle.pop(conn, None)
