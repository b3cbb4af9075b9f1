"""The MCP session pool against a real MCP server, without a bus."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from contracts.messages.tools import McpServer
from services.tools.cache import ServerKey, server_key
from services.tools.mcp_client import (
    ConnectFailed,
    ConnectOptions,
    SessionPool,
    is_sse_url,
    open_client,
)
from tests.mcp_servers import free_port, serve_mcp, silent_port


def pool(closed: Callable[[ServerKey], None] | None = None, *, idle_s: float = 60, max_sessions: int = 8,
         connect_timeout_s: float = 2, mode: str = "auto") -> SessionPool:
    opts = ConnectOptions(connect_timeout_s, 5, 1 << 20, mode)
    return SessionPool(lambda s: open_client(s, opts), connect_timeout_s=connect_timeout_s,
                       idle_s=idle_s, max_sessions=max_sessions, on_close=closed)


def target(url: str, **headers: str) -> tuple[ServerKey, McpServer]:
    return server_key(url, headers), McpServer(server_label="t", server_url=url, headers=headers)


@pytest.mark.parametrize(("url", "sse"), [("http://h/sse", True), ("http://h/sse/", True), ("http://h/mcp", False),
                                          ("http://h/sse/mcp", False), ("http://h/mysse", False)])
def test_sse_urls(url: str, sse: bool) -> None:
    assert is_sse_url(url) is sse


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_concurrent_callers_share_one_session(mode: str) -> None:
    async with serve_mcp() as srv, pool(mode=mode) as p:
        key, server = target(srv.url)

        async def call() -> str:
            async with p.session(key, server) as client:
                result = await client.call_tool("meet", {})
                return str(result.content[0].text)  # type: ignore[union-attr]

        assert await asyncio.gather(call(), call()) == ["met", "met"]
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
            assert (await client.call_tool("echo", {"text": "still here"})).content[0].text == "still here"  # type: ignore[union-attr]


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
            with pytest.raises(ConnectFailed, match="ConnectError: All connection attempts failed"):
                async with p.session(key, server):
                    pass
        assert len(p) == 0 and p.opened == 2


async def test_connect_timeout() -> None:
    async with pool(connect_timeout_s=0.2) as p:
        with silent_port() as port:
            key, server = target(f"http://127.0.0.1:{port}/mcp")
            with pytest.raises(ConnectFailed, match=r"no MCP handshake within 0.2s"):
                async with p.session(key, server):
                    pass
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
