"""MCP client sessions: the transport for a server URL, and a pool of live sessions.

One session per (server_url, headers digest), shared by concurrent calls (MCP multiplexes
requests on a session) and closed after ``idle_s`` without use. Each session is owned by one
task of the pool's task group, which enters the SDK client, hands it out, and exits it: the
SDK's anyio task groups must be entered and exited by the same task, and a caller's timeout
must never tear down a session other callers share.

A caller's headers travel only to its own server: they are set on an HTTP client made for that
one session, redirects are followed only within the server's origin (the SDK's rule), an SSE
endpoint on another origin is refused (the SDK's rule too), and proxies / .netrc from the
environment are ignored.

Every session's HTTP client is pinned to the addresses the policy checked when it opened
(``PinnedTransport``): the TCP connection goes to a checked IP while the Host header and TLS
(SNI and the certificate check) keep the server's name, so a DNS answer that changes between
the check and the connection (rebinding) is never used.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

import httpx2
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED, Implementation

from contracts.messages.tools import McpServer
from services.tools.cache import ServerKey
from services.tools.egress import IPAddress, parse_ip
from services.tools.results import describe, leaf_exception

log = logging.getLogger("chorus.tools")

CLIENT_INFO = Implementation(name="chorus-tools", version="0.1.0")


class ConnectFailed(ConnectionError):
    """No MCP session could be opened: unreachable, refused, no handshake in time, or a
    handshake the server answered with an error. ``unreachable`` says the network failed
    (name lookup, TCP connect, no handshake in time): that does not depend on who asked, the
    rest (a refused destination, a handshake error) may."""

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


def _network_failure(exc: BaseException) -> bool:
    leaf = leaf_exception(exc)
    return isinstance(leaf, httpx2.ConnectError | httpx2.ConnectTimeout | OSError)


class ResponseTooLarge(httpx2.StreamError):
    """An MCP server sent a response over the size cap."""


class _CappedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, max_bytes: int, declared: str) -> None:
        self._inner = inner
        self._max_bytes = max_bytes
        self._declared = int(declared) if declared.isdigit() else 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = self._declared
        if seen <= self._max_bytes:
            seen = 0
            async for chunk in self._inner:
                seen += len(chunk)
                if seen > self._max_bytes:
                    break
                yield chunk
            else:
                return
        raise ResponseTooLarge(f"the MCP server's response exceeded {self._max_bytes} bytes")

    async def aclose(self) -> None:
        await self._inner.aclose()


class CappedTransport(httpx2.AsyncBaseTransport):
    """Caps the body of every response to a POST (one JSON-RPC answer, JSON or SSE). GET
    streams are the long-lived server-to-client channels; their events are capped one by one
    by the SDK's SSE readers instead.

    The cap is enforced while the body is read, as a ``StreamError``: the SDK turns that into
    an error answer to the one request, where an exception from sending would take the whole
    session down."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, max_bytes: int) -> None:
        self._inner = inner
        self._max_bytes = max_bytes

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if request.method == "GET":
            return response
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        capped = _CappedStream(response.stream, self._max_bytes, response.headers.get("content-length", ""))
        return httpx2.Response(
            response.status_code, headers=response.headers, stream=capped, extensions=response.extensions
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


class PinnedTransport(httpx2.AsyncBaseTransport):
    """Sends the requests for ``host`` to ``addresses`` (checked by the policy), in order until
    one accepts the connection, and refuses requests for any other host. The URL's host becomes
    the address; the Host header (set by the client from the URL) and the TLS server name stay
    ``host``."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, host: str, addresses: Sequence[IPAddress]) -> None:
        if not addresses:
            raise ValueError("a pinned transport needs at least one address")
        self._inner = inner
        self._host = host
        self._addresses = list(addresses)
        self._tls_name = None if parse_ip(host) is not None else host

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.host != self._host:
            raise httpx2.ConnectError("not the checked MCP server's host", request=request)
        extensions = dict(request.extensions)
        if self._tls_name is not None:
            extensions["sni_hostname"] = self._tls_name
        for address in list(self._addresses):
            pinned = httpx2.Request(
                request.method,
                request.url.copy_with(host=str(address)),
                headers=request.headers,
                stream=request.stream,
                extensions=extensions,
            )
            try:
                response = await self._inner.handle_async_request(pinned)
            except (httpx2.ConnectError, httpx2.ConnectTimeout):  # nothing was sent
                if address == self._addresses[-1]:
                    raise
                continue
            if address != self._addresses[0]:  # later connections start with the one that works
                self._addresses.remove(address)
                self._addresses.insert(0, address)
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass(frozen=True)
class ConnectOptions:
    connect_timeout_s: float
    read_timeout_s: float
    max_response_bytes: int
    protocol_mode: str = "auto"


def is_sse_url(url: str) -> bool:
    """The legacy HTTP+SSE transport is used for URLs whose path ends with ``/sse``."""
    return httpx2.URL(url).path.rstrip("/").endswith("/sse")


def _http_client(headers: dict[str, str], opts: ConnectOptions, pin: PinnedTransport) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(
        headers=headers,
        timeout=httpx2.Timeout(opts.read_timeout_s, connect=opts.connect_timeout_s),
        transport=CappedTransport(pin, opts.max_response_bytes),
        follow_redirects=False,
        trust_env=False,
    )


@contextlib.asynccontextmanager
async def _streamable_http(
    url: str, headers: dict[str, str], opts: ConnectOptions, pin: PinnedTransport
) -> AsyncIterator[Any]:
    async with (
        _http_client(headers, opts, pin) as http,
        streamable_http_client(url, http_client=http, max_sse_event_size=opts.max_response_bytes) as streams,
    ):
        yield streams


def open_client(server: McpServer, opts: ConnectOptions, addresses: Sequence[IPAddress]) -> Client:
    """An (unentered) SDK client for ``server``, connecting only to ``addresses`` (checked for
    its host): streamable HTTP, or SSE for ``.../sse``."""
    headers = dict(server.headers)
    pin = PinnedTransport(httpx2.AsyncHTTPTransport(trust_env=False), httpx2.URL(server.server_url).host, addresses)
    if is_sse_url(server.server_url):

        def factory(
            headers: dict[str, str] | None = None,
            timeout: httpx2.Timeout | None = None,
            auth: httpx2.Auth | None = None,
        ) -> httpx2.AsyncClient:
            return _http_client(headers or {}, opts, pin)

        transport: Any = sse_client(
            server.server_url,
            headers=headers,
            timeout=opts.connect_timeout_s,
            sse_read_timeout=opts.read_timeout_s,
            httpx_client_factory=factory,
        )
    else:
        transport = _streamable_http(server.server_url, headers, opts, pin)
    return Client(transport, mode=opts.protocol_mode, cache=None, client_info=CLIENT_INFO)


Connector = Callable[[McpServer], AbstractAsyncContextManager[Client]]


def checked_connector(addresses: Callable[[str], Awaitable[Sequence[IPAddress]]], opts: ConnectOptions) -> Connector:
    """Connects to a server only after ``addresses(url)`` (the policy's resolve-and-check)
    has answered, and only to those addresses."""

    @contextlib.asynccontextmanager
    async def connect(server: McpServer) -> AsyncIterator[Client]:
        checked = await addresses(server.server_url)
        async with open_client(server, opts, checked) as client:
            yield client

    return connect


@dataclass(eq=False)
class _Session:
    key: ServerKey
    server: McpServer
    ready: asyncio.Future[Client]
    last_used: float
    in_use: int = 0
    retired: bool = False
    closing: asyncio.Event = field(default_factory=asyncio.Event)


class SessionPool:
    """Live MCP sessions keyed by (server_url, headers digest). Use as an async context
    manager around the service's lifetime; ``session(key, server)`` lends one out."""

    def __init__(
        self,
        connect: Connector,
        *,
        connect_timeout_s: float,
        idle_s: float,
        max_sessions: int,
        clock: Callable[[], float] = time.monotonic,
        on_close: Callable[[ServerKey], None] | None = None,
    ) -> None:
        self._connect = connect
        self._connect_timeout_s = connect_timeout_s
        self._idle_s = idle_s
        self._max_sessions = max_sessions
        self._clock = clock
        self._on_close = on_close
        self._sessions: dict[ServerKey, _Session] = {}
        self._tasks: asyncio.TaskGroup | None = None
        self.opened = 0  # sessions opened so far (for tests and metrics)

    async def __aenter__(self) -> SessionPool:
        self._tasks = asyncio.TaskGroup()
        await self._tasks.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for session in list(self._sessions.values()):
            self._retire(session, now=True)
        assert self._tasks is not None
        tasks, self._tasks = self._tasks, None
        await tasks.__aexit__(None, None, None)

    def __len__(self) -> int:
        return len(self._sessions)

    @contextlib.asynccontextmanager
    async def session(self, key: ServerKey, server: McpServer) -> AsyncIterator[Client]:
        """A connected client for ``server``. Failures other than a timeout, a cancellation or
        a JSON-RPC error answer retire the session: the next caller reconnects."""
        entry = self._sessions.get(key)
        if entry is None:
            entry = self._open(key, server)
        entry.in_use += 1
        try:
            client = await asyncio.shield(entry.ready)
            yield client
        except (asyncio.CancelledError, TimeoutError):
            raise
        except MCPError as exc:
            if exc.error.code == CONNECTION_CLOSED:
                self._retire(entry)
            raise
        except BaseException:
            self._retire(entry)
            raise
        finally:
            entry.in_use -= 1
            entry.last_used = self._clock()
            if entry.retired and entry.in_use == 0:
                entry.closing.set()

    def _open(self, key: ServerKey, server: McpServer) -> _Session:
        if self._tasks is None:
            raise RuntimeError("the session pool is not running")
        if len(self._sessions) >= self._max_sessions:
            self._evict_idlest()
        loop = asyncio.get_running_loop()
        entry = _Session(key, server, loop.create_future(), last_used=self._clock())
        self._sessions[key] = entry
        self.opened += 1
        self._tasks.create_task(self._own(entry), name=f"mcp-session {key}")
        return entry

    def _evict_idlest(self) -> None:
        idle = [s for s in self._sessions.values() if s.in_use == 0]
        if idle:
            self._retire(min(idle, key=lambda s: s.last_used), now=True)
        else:
            log.warning("%d MCP sessions, all busy; opening one more", len(self._sessions))

    def _retire(self, entry: _Session, *, now: bool = False) -> None:
        """No new callers; close once the last current caller is done (or at once)."""
        entry.retired = True
        if self._sessions.get(entry.key) is entry:
            del self._sessions[entry.key]
        if now or entry.in_use == 0:
            entry.closing.set()

    async def _own(self, entry: _Session) -> None:
        """The session's life, in its own task: connect, lend, idle out or close."""
        try:
            async with contextlib.AsyncExitStack() as stack:
                try:
                    async with asyncio.timeout(self._connect_timeout_s):
                        client = await stack.enter_async_context(self._connect(entry.server))
                except TimeoutError as exc:
                    raise ConnectFailed(
                        f"no MCP handshake within {self._connect_timeout_s:g}s", unreachable=True
                    ) from exc
                except Exception as exc:
                    raise ConnectFailed(describe(exc), unreachable=_network_failure(exc)) from exc
                entry.ready.set_result(client)
                log.debug("MCP session open: %s", entry.key)
                await self._hold(entry)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - (anyio may group errors) a failed connect goes to the callers
            if not entry.ready.done():
                entry.ready.set_exception(exc)
                entry.ready.exception()  # retrieved: the callers may have gone
            else:
                log.debug("MCP session %s ended: %s", entry.key, describe(exc))
        finally:
            if not entry.ready.done():
                entry.ready.set_exception(ConnectFailed("the MCP session was closed"))
                entry.ready.exception()
            self._retire(entry)
            log.debug("MCP session closed: %s", entry.key)
            if self._on_close is not None:
                self._on_close(entry.key)

    async def _hold(self, entry: _Session) -> None:
        while True:
            idle_for = self._clock() - entry.last_used
            wait = max(self._idle_s - idle_for, 0.0) if entry.in_use == 0 else self._idle_s
            try:
                async with asyncio.timeout(wait):
                    await entry.closing.wait()
                return
            except TimeoutError:
                if entry.in_use == 0 and self._clock() - entry.last_used >= self._idle_s:
                    return
