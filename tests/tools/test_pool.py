"""The MCP session pool against a real MCP server, without a bus; the connection pinned to
the addresses the policy checked."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable

import httpx2
import pytest
from mcp import types
from mcp.server.transport_security import TransportSecuritySettings

from contracts.messages.tools import McpServer
from services.tools.cache import ServerKey, server_key
from services.tools.egress import EgressRules
from services.tools.mcp_client import (
    ConnectFailed,
    ConnectOptions,
    PinnedTransport,
    SessionPool,
    checked_connector,
    is_sse_url,
    open_client,
)
from services.tools.policy import ServerPolicy
from tests.mcp_servers import free_port, serve_mcp, silent_port
from tests.tools.fakes import FakeResolver

LOCAL = [ipaddress.ip_address("127.0.0.1")]
# an MCP server that accepts only requests whose Host header names it mcp.pinned.test
PINNED_NAME_ONLY = TransportSecuritySettings(allowed_hosts=["mcp.pinned.test:*"])


def pool(
    closed: Callable[[ServerKey], None] | None = None,
    *,
    idle_s: float = 60,
    max_sessions: int = 8,
    connect_timeout_s: float = 2,
    mode: str = "auto",
) -> SessionPool:
    opts = ConnectOptions(connect_timeout_s, 5, 1 << 20, mode)
    return SessionPool(
        lambda s: open_client(s, opts, LOCAL),
        connect_timeout_s=connect_timeout_s,
        idle_s=idle_s,
        max_sessions=max_sessions,
        on_close=closed,
    )


def checked_pool(resolver: FakeResolver, *, allow_loopback: bool = True) -> SessionPool:
    """A pool that resolves with ``resolver`` and checks like the service does."""
    policy = ServerPolicy([], {}, rules=EgressRules(allow_loopback=allow_loopback), max_header_bytes=1024)
    opts = ConnectOptions(2, 5, 1 << 20)
    connect = checked_connector(lambda url: policy.addresses(url, resolver, 1), opts)
    return SessionPool(connect, connect_timeout_s=2, idle_s=60, max_sessions=8)


def text_of(result: types.CallToolResult) -> str:
    """The text of a tool result's first block."""
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def target(url: str, **headers: str) -> tuple[ServerKey, McpServer]:
    return server_key(url, headers), McpServer(server_label="t", server_url=url, headers=headers)


@pytest.mark.parametrize(
    ("url", "sse"),
    [
        ("http://h/sse", True),
        ("http://h/sse/", True),
        ("http://h/mcp", False),
        ("http://h/sse/mcp", False),
        ("http://h/mysse", False),
    ],
)
def test_sse_urls(url: str, sse: bool) -> None:
    assert is_sse_url(url) is sse


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_concurrent_callers_share_one_session(mode: str) -> None:
    async with serve_mcp() as srv, pool(mode=mode) as p:
        key, server = target(srv.url)

        async def call() -> str:
            async with p.session(key, server) as client:
                return text_of(await client.call_tool("meet", {}))

        assert list(await asyncio.gather(call(), call())) == ["met", "met"]  # typeshed says tuple; it is a list
        assert p.opened == 1 and len(p) == 1 and srv.handshakes == 1


async def test_idle_sessions_close() -> None:
    closed: asyncio.Queue[ServerKey] = asyncio.Queue()
    async with serve_mcp() as srv, pool(closed.put_nowait, idle_s=0.05) as p:
        key, server = target(srv.url)
        async with p.session(key, server) as client:
            await client.list_tools()
        async with asyncio.timeout(2):
            assert await closed.get() == key
        assert len(p) == 0
        async with p.session(key, server) as client:
            await client.list_tools()
        assert p.opened == 2


async def test_busy_sessions_do_not_idle_out() -> None:
    closed: asyncio.Queue[ServerKey] = asyncio.Queue()
    async with serve_mcp() as srv, pool(closed.put_nowait, idle_s=0.05) as p:
        key, server = target(srv.url)
        async with p.session(key, server) as client:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):
                    await client.call_tool("hang", {})
            assert closed.empty()
            assert text_of(await client.call_tool("echo", {"text": "still here"})) == "still here"


async def test_least_recently_used_idle_session_is_evicted() -> None:
    closed: asyncio.Queue[ServerKey] = asyncio.Queue()
    async with serve_mcp() as srv, pool(closed.put_nowait, max_sessions=1) as p:
        alice, alice_server = target(srv.url, Authorization="alice")
        bob, bob_server = target(srv.url, Authorization="bob")
        async with p.session(alice, alice_server) as client:
            await client.list_tools()
        async with p.session(bob, bob_server) as client:
            await client.list_tools()
        async with asyncio.timeout(2):
            assert await closed.get() == alice
        assert len(p) == 1


async def test_failed_connect_is_not_pooled() -> None:
    async with pool() as p:
        key, server = target(f"http://127.0.0.1:{free_port()}/mcp")
        for _ in range(2):
            with pytest.raises(ConnectFailed, match="ConnectError: All connection attempts failed") as failed:
                async with p.session(key, server):
                    pass
            assert failed.value.unreachable  # the network said no: worth remembering for a moment
        assert len(p) == 0 and p.opened == 2


async def test_a_handshake_error_is_not_unreachable() -> None:
    """Answered with an HTTP error: the server is up (and the answer may depend on the caller)."""
    async with serve_mcp() as srv, pool() as p:
        key, server = target(srv.url.replace("/mcp", "/nope"))
        with pytest.raises(ConnectFailed) as failed:
            async with p.session(key, server):
                pass
        assert not failed.value.unreachable


async def test_connect_timeout() -> None:
    async with pool(connect_timeout_s=0.2) as p:
        with silent_port() as port:
            key, server = target(f"http://127.0.0.1:{port}/mcp")
            with pytest.raises(ConnectFailed, match=r"no MCP handshake within 0.2s") as failed:
                async with p.session(key, server):
                    pass
            assert failed.value.unreachable
        assert len(p) == 0


async def test_exit_closes_every_session() -> None:
    closed: list[ServerKey] = []
    async with serve_mcp() as srv:
        async with pool(closed.append, mode="legacy") as p:
            keys = [target(srv.url, Authorization=who) for who in ("a", "b")]
            for key, server in keys:
                async with p.session(key, server) as client:
                    await client.list_tools()
        assert sorted(closed) == sorted(key for key, _ in keys)
        assert srv.rpc_count("initialize") == 2
        assert sum(1 for r in srv.requests if r.method == "DELETE") == 2  # sessions terminated


async def test_pool_must_be_running() -> None:
    key, server = target("http://127.0.0.1:1/mcp")
    with pytest.raises(RuntimeError, match="not running"):
        async with pool().session(key, server):
            pass


async def test_the_connection_goes_to_the_checked_address() -> None:
    """A made-up name resolves (once) to loopback; the MCP server on loopback gets the calls,
    with the name in its Host header; a later DNS answer (rebinding) is never used by the
    session, and a new session is checked against the new answer."""
    async with serve_mcp(transport_security=PINNED_NAME_ONLY) as srv:
        resolver = FakeResolver({"mcp.pinned.test": ["127.0.0.1"]})
        url = f"http://mcp.pinned.test:{srv.port}/mcp"
        async with checked_pool(resolver) as p:
            key, server = target(url)
            async with p.session(key, server) as client:
                assert text_of(await client.call_tool("add", {"a": 1, "b": 2})) == "3"
                resolver.answers["mcp.pinned.test"] = ["127.0.0.2"]  # nothing listens there
                assert text_of(await client.call_tool("add", {"a": 2, "b": 2})) == "4"
            assert resolver.lookups == [("mcp.pinned.test", srv.port)]
            assert srv.requests and set(srv.headers_seen("host")) == {f"mcp.pinned.test:{srv.port}"}
            seen = len(srv.requests)
            other_key, other = target(url, Authorization="other caller")  # a new session: a new lookup
            with pytest.raises(ConnectFailed, match="ConnectError"):
                async with p.session(other_key, other):
                    pass
            assert resolver.lookups[-1] == ("mcp.pinned.test", srv.port)
            assert len(srv.requests) == seen  # it went to 127.0.0.2, the address checked this time


async def test_a_name_pointing_at_loopback_is_refused_before_connecting() -> None:
    async with serve_mcp() as srv:
        resolver = FakeResolver({"mcp.pinned.test": ["127.0.0.1"]})
        async with checked_pool(resolver, allow_loopback=False) as p:
            key, server = target(f"http://mcp.pinned.test:{srv.port}/mcp")
            with pytest.raises(ConnectFailed, match=r"matches no allowed_servers entry") as failed:
                async with p.session(key, server):
                    pass
            assert not failed.value.unreachable
        assert srv.requests == []


async def test_the_next_checked_address_is_tried_when_one_refuses() -> None:
    async with serve_mcp(transport_security=PINNED_NAME_ONLY) as srv:
        resolver = FakeResolver({"mcp.pinned.test": ["::1", "127.0.0.2", "127.0.0.1"]})
        async with checked_pool(resolver) as p:
            key, server = target(f"http://mcp.pinned.test:{srv.port}/mcp")
            async with p.session(key, server) as client:
                assert text_of(await client.call_tool("echo", {"text": "here"})) == "here"
        assert srv.handshakes == 1


class Capture(httpx2.AsyncBaseTransport):
    """Records what would be sent; refuses connections to ``down``."""

    def __init__(self, *down: str) -> None:
        self.sent: list[httpx2.Request] = []
        self.down = set(down)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.host in self.down:
            raise httpx2.ConnectError("refused", request=request)
        await request.aread()
        self.sent.append(request)
        return httpx2.Response(200, text="ok")


async def test_pinned_requests_keep_the_name_for_host_and_tls() -> None:
    inner = Capture("2001:db8::1")  # a documentation address: never a real connection
    pin = PinnedTransport(
        inner, "mcp.example.com", [ipaddress.ip_address("2001:db8::1"), ipaddress.ip_address("192.0.2.7")]
    )
    async with httpx2.AsyncClient(transport=pin) as http:
        for _ in range(2):
            await http.post("https://mcp.example.com:8443/mcp?x=1", content=b"{}")
        with pytest.raises(httpx2.ConnectError, match="not the checked"):
            await http.get("https://elsewhere.example.com/")
    assert len(inner.sent) == 2
    for sent in inner.sent:
        assert str(sent.url) == "https://192.0.2.7:8443/mcp?x=1"
        assert sent.headers["host"] == "mcp.example.com:8443"
        assert sent.extensions["sni_hostname"] == "mcp.example.com"
        assert sent.content == b"{}"


async def test_pinned_ip_literals_keep_their_own_tls_name() -> None:
    inner = Capture()
    pin = PinnedTransport(inner, "::1", [ipaddress.ip_address("::1")])
    async with httpx2.AsyncClient(transport=pin) as http:
        await http.get("https://[::1]:9/x")
    (sent,) = inner.sent
    assert sent.url.host == "::1" and "sni_hostname" not in sent.extensions
    with pytest.raises(ValueError):
        PinnedTransport(inner, "x", [])
