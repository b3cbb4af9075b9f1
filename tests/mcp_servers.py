"""Real MCP servers for tests, served over HTTP on a free loopback port inside the test process.

    async with serve_mcp() as srv:            # streamable HTTP at srv.url (".../mcp")
        ...                                   # srv.requests: every HTTP request it received
    async with serve_mcp(transport="sse") as srv:   # legacy HTTP+SSE at srv.url (".../sse")

The default server (``tool_server()``) has the tools a tool loop needs to be tested against:

    add(a: int, b: int) -> a + b             echo(text) -> text
    get_weather(city) -> "Sunny, 21 C in <city>"
    secret_tool() -> "the secret is 42" only with ``Authorization: Bearer sekrit``, else an error
    boom() -> a tool error ("kaboom")        hang() -> never returns
    big() -> BIG_OUTPUT_BYTES of text        meet() -> "met" once two calls wait together

The socket is bound and listening before the server task starts, so the URL is usable at once
(connections queue in the backlog until uvicorn accepts them): no sleeps, no polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from starlette.types import ASGIApp, Message, Receive, Scope, Send

SECRET_TOKEN = "sekrit"
BIG_OUTPUT_BYTES = 200_000


def tool_server(name: str = "test-tools", *, meet_parties: int = 2) -> MCPServer:
    """A fresh MCPServer with the test tools (state such as ``meet``'s barrier is per server)."""
    server = MCPServer(name, log_level="WARNING")
    barrier = asyncio.Barrier(meet_parties)

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def echo(text: str) -> str:
        """Echo the text back."""
        return text

    @server.tool()
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        return f"Sunny, 21 C in {city}"

    @server.tool()
    def secret_tool(ctx: Context) -> str:
        """Tells the secret to callers holding the right bearer token."""
        headers = ctx.headers or {}
        if headers.get("authorization") != f"Bearer {SECRET_TOKEN}":
            raise ToolError("unauthorized")
        return "the secret is 42"

    @server.tool()
    def boom() -> str:
        """Always fails."""
        raise ToolError("kaboom")

    @server.tool()
    async def hang() -> str:
        """Never returns."""
        await asyncio.Event().wait()
        return "unreachable"

    @server.tool()
    def big() -> str:
        """Returns a very long text."""
        return "x" * BIG_OUTPUT_BYTES

    @server.tool()
    async def meet() -> str:
        """Returns once ``meet_parties`` calls are waiting at the same time (5 s at most)."""
        async with asyncio.timeout(5):
            await barrier.wait()
        return "met"

    return server


@dataclass
class SeenRequest:
    method: str
    path: str
    headers: dict[str, str]
    rpc: str | None = None  # the JSON-RPC method of a POSTed message, e.g. "tools/list"


@dataclass
class RunningServer:
    url: str
    port: int
    requests: list[SeenRequest] = field(default_factory=list)

    def headers_seen(self, name: str) -> list[str | None]:
        return [r.headers.get(name.lower()) for r in self.requests]

    def rpc_count(self, *methods: str) -> int:
        return sum(1 for r in self.requests if r.rpc in methods)

    @property
    def handshakes(self) -> int:
        """Sessions opened: an ``initialize`` (handshake era) or ``server/discover`` (2026)."""
        return self.rpc_count("initialize", "server/discover")


class _Recorder:
    """ASGI middleware recording every HTTP request's method, path, headers and JSON-RPC method."""

    def __init__(self, app: ASGIApp, seen: list[SeenRequest]) -> None:
        self._app = app
        self._seen = seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        seen = SeenRequest(scope["method"], scope["path"], headers)
        self._seen.append(seen)
        body = bytearray()

        async def recording_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                body.extend(message.get("body", b""))
                if not message.get("more_body") and body:
                    with contextlib.suppress(ValueError, AttributeError):
                        seen.rpc = json.loads(body).get("method")
            return message

        await self._app(scope, recording_receive, send)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # leave the test process's signal handlers alone


def listening_socket(port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(64)
    return sock


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def silent_port() -> Iterator[int]:
    """A loopback port that accepts TCP connections (into the backlog) and never answers."""
    sock = listening_socket()
    try:
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


@contextlib.asynccontextmanager
async def serve_mcp(
    server: MCPServer | None = None,
    *,
    transport: Literal["streamable-http", "sse"] = "streamable-http",
    port: int = 0,
    **app_options: Any,
) -> AsyncIterator[RunningServer]:
    """Serve ``server`` (default: ``tool_server()``) on loopback ``port`` (default: a free one)
    until exit. ``app_options`` go to ``streamable_http_app`` / ``sse_app``."""
    server = server or tool_server()
    sock = listening_socket(port)
    port = int(sock.getsockname()[1])
    if transport == "sse":
        app: ASGIApp = server.sse_app(**app_options)
        url = f"http://127.0.0.1:{port}/sse"
    else:
        app = server.streamable_http_app(**app_options)
        url = f"http://127.0.0.1:{port}/mcp"
    running = RunningServer(url=url, port=port)
    config = uvicorn.Config(
        _Recorder(app, running.requests),
        log_level="warning",
        lifespan="on",
        # uvicorn annotates whole seconds, but waits any number of them (asyncio.wait_for)
        timeout_graceful_shutdown=0.25,  # type: ignore[arg-type]
    )
    uv = _Server(config)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(uv.serve(sockets=[sock]))
        try:
            yield running
        finally:
            uv.should_exit = True
            await task
            sock.close()


@dataclass
class HangingServer:
    """A loopback port that accepts TCP connections, reads what arrives, and never answers."""

    url: str
    port: int
    connections: int = 0
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def wait_for_connections(self, count: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.connections >= count)

    async def accepted(self) -> None:
        async with self._changed:
            self.connections += 1
            self._changed.notify_all()


@contextlib.asynccontextmanager
async def hanging_server() -> AsyncIterator[HangingServer]:
    """A server that never answers, at ``srv.url`` (".../mcp"); ``srv.connections`` counts the
    connections it accepted. On exit every connection is closed."""
    sock = listening_socket()
    port = int(sock.getsockname()[1])
    running = HangingServer(url=f"http://127.0.0.1:{port}/mcp", port=port)
    writers: list[asyncio.StreamWriter] = []
    done = asyncio.Event()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        await running.accepted()
        with contextlib.suppress(ConnectionError):
            while not done.is_set() and await reader.read(65536):
                pass

    server = await asyncio.start_server(on_connect, sock=sock)
    try:
        yield running
    finally:
        done.set()
        server.close()
        for writer in writers:
            writer.close()
        await server.wait_closed()
