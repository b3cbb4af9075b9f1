"""A tiny scripted HTTP/1.1 server for the engine HTTP client's tests: what an engine rarely
does on purpose (resets, stalls, silence, closing idle connections), scripted per case; and the
runner that puts a scripted case on uvloop, the services' event loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypedDict, Unpack

import uvloop

from services.dispatcher.engines.http import EngineHttp

SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def answer_with(body: bytes, *, status: int = 200, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n%s\r\n%s" % (status, len(body), extra, body)


@dataclass
class Tiny:
    """A scripted HTTP/1.1 server: ``answer(server, writer, n)`` answers the n-th request (from
    1) on a connection and says whether to keep the connection."""

    answer: Callable[[Tiny, asyncio.StreamWriter, int], Awaitable[bool]]
    url: str = ""
    accepted: int = 0  # connections
    requests: list[bytes] = field(default_factory=list)  # as received, head and body
    closed: asyncio.Event = field(default_factory=asyncio.Event)  # a connection ended
    go: asyncio.Event = field(default_factory=asyncio.Event)  # the test lets a script go on
    over: asyncio.Event = field(default_factory=asyncio.Event)  # the test is over
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        self.accepted += 1
        try:
            n = 0
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                self.requests.append(head + await reader.readexactly(length))
                n += 1
                if not await self.answer(self, writer, n):
                    return
        finally:
            writer.close()
            self.closed.set()


@contextlib.asynccontextmanager
async def tiny(
    answer: Callable[[Tiny, asyncio.StreamWriter, int], Awaitable[bool]], ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[Tiny]:
    state = Tiny(answer)
    server = await asyncio.start_server(state.handle, "127.0.0.1", 0, ssl=ssl_context)
    port = server.sockets[0].getsockname()[1]
    state.url = f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"
    try:
        yield state
    finally:
        server.close()
        state.over.set()  # scripts waiting for nothing end; the client closed its connections
        await asyncio.gather(*state.tasks)


class HttpOptions(TypedDict, total=False):
    """``EngineHttp``'s keyword arguments."""

    connect_timeout: float
    max_connections: int
    idle_expiry: float
    ssl_context: ssl.SSLContext | None


@contextlib.asynccontextmanager
async def client(**options: Unpack[HttpOptions]) -> AsyncIterator[EngineHttp]:
    http = EngineHttp(**options)
    try:
        yield http
    finally:
        await http.close()


async def kept(server: Tiny, writer: asyncio.StreamWriter, n: int) -> bool:
    """A short JSON answer; the connection stays open."""
    writer.write(answer_with(b'{"n": %d}' % n))
    await writer.drain()
    return True


async def silent(server: Tiny, writer: asyncio.StreamWriter, n: int) -> bool:
    await server.over.wait()
    return False


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset, not a FIN."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def on_uvloop(scenario: Callable[[], Awaitable[None]]) -> None:
    """Run a scripted case on uvloop, in a thread (the test session's loop stays as it is) and
    bounded in time (a hung thread would hang the session)."""

    async def bounded() -> None:
        async with asyncio.timeout(30):
            await scenario()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(uvloop.run, bounded()).result()
