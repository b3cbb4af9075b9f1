"""The tools service over real NATS when an MCP server is slow, down or refused: a hanging tool
timed out (within the settings' cap), a server down, silent, over the size cap, refused by the
egress rules or not an MCP server answered with one message that gives nothing away, a server
that failed remembered for a while (but not a caller's own failed handshake), a restarted
server given a new session, and a flood against a dead server turned away without delaying
calls to other servers."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from services.tools.runner import busy_message
from tests.mcp_servers import free_port, hanging_server, serve_mcp, silent_port
from tests.tools.fakes import FakeResolver
from tests.tools.service_client import UNREACHABLE, Tools, mcp, tools_service


async def test_hanging_tool_times_out_quickly(tools: Tools) -> None:
    async with serve_mcp() as srv:
        started = time.monotonic()
        result = await tools.call(mcp(srv.url), "hang", timeout_s=0.3)
        elapsed = time.monotonic() - started
        assert result.error is not None and "timed out after 0.3s" in result.error
        assert elapsed < 2
        # the session survives a timed-out call
        assert (await tools.call(mcp(srv.url), "add", '{"a": 2, "b": 2}')).output == "4"


async def test_timeout_is_capped_by_settings(nats_url: str, namespace: str) -> None:
    async with tools_service(nats_url, namespace, max_call_timeout_s=0.2) as tools, serve_mcp() as srv:
        result = await tools.call(mcp(srv.url), "hang", timeout_s=60)
    assert result.error is not None and "timed out after 0.2s" in result.error


async def test_server_down_is_a_result(tools: Tools) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    result = await tools.call(mcp(url), "add", '{"a": 1, "b": 2}')
    assert result.output is None and result.error == UNREACHABLE
    for detail in (str(port), "127.0.0.1", "ConnectError", "refused"):
        assert detail not in result.error
    assert "CHORUS_ALLOW_PRIVATE_NETWORKS" in result.error  # names the settings to change
    listed = await tools.list(mcp(url))
    assert listed.tools == [] and listed.error == UNREACHABLE


async def test_server_that_never_answers_is_a_result(nats_url: str, namespace: str) -> None:
    async with tools_service(nats_url, namespace, connect_timeout_s=0.3) as tools:
        with silent_port() as port:
            started = time.monotonic()
            result = await tools.call(mcp(f"http://127.0.0.1:{port}/mcp"), "add", timeout_s=5)
            assert time.monotonic() - started < 2
    assert result.error == UNREACHABLE


async def test_response_over_the_size_cap_is_an_error(nats_url: str, namespace: str) -> None:
    async with tools_service(nats_url, namespace, max_response_bytes=50_000) as tools, serve_mcp() as srv:
        result = await tools.call(mcp(srv.url), "big", timeout_s=5)
        assert (await tools.call(mcp(srv.url), "echo", '{"text": "ok"}')).output == "ok"
    assert result.error is not None and "50000" in result.error


async def test_refused_and_unreachable_servers_look_the_same(nats_url: str, namespace: str) -> None:
    """A refused destination, a closed port, a port that never answers (the handshake times out,
    or the call's own deadline passes while connecting), a name that does not resolve, an HTTP
    server that is not an MCP server, and a server that failed moments ago: one message."""
    resolver = FakeResolver(
        {"localhost": ["127.0.0.1"], "mcp.pinned.test": ["127.0.0.1"], "public.example.com": ["93.184.216.34"]}
    )
    outcomes: dict[str, tuple[str | None, str | None]] = {}

    async def both(tools: Tools, case: str, url: str, **kw: Any) -> None:
        listed = await tools.list(mcp(url))
        called = await tools.call(mcp(url), "add", '{"a": 1, "b": 2}', **kw)
        outcomes[case] = (listed.error, called.error)

    async with serve_mcp() as live:
        async with tools_service(
            nats_url, namespace, resolver, allow_loopback=False, allowed_servers=["*.pinned.test"], unreachable_ttl_s=0
        ) as strict:
            await both(strict, "refused loopback", live.url)
            await both(strict, "refused name -> loopback", f"http://mcp.pinned.test:{live.port}/mcp")
            await both(strict, "refused unlisted public", "http://public.example.com/mcp")
        assert live.requests == []  # nothing was sent to the refused destination
        async with tools_service(nats_url, namespace, resolver, connect_timeout_s=0.3, unreachable_ttl_s=0) as dev:
            await both(dev, "connection refused", f"http://127.0.0.1:{free_port()}/mcp")
            with silent_port() as port:
                await both(dev, "no handshake", f"http://127.0.0.1:{port}/mcp")
            await both(dev, "name not found", "http://nowhere.invalid/mcp")
            await both(dev, "not an MCP server", live.url.replace("/mcp", "/nope"))
        async with tools_service(nats_url, namespace, resolver, connect_timeout_s=30, list_timeout_s=0.3) as slow:
            with silent_port() as port:
                await both(slow, "deadline while connecting", f"http://localhost:{port}/mcp", timeout_s=0.3)
            await slow.call(mcp(f"http://127.0.0.1:{free_port()}/mcp"), "add")
        async with tools_service(nats_url, namespace, resolver, unreachable_ttl_s=60) as remembering:
            port = free_port()
            await remembering.call(mcp(f"http://127.0.0.1:{port}/mcp"), "add")
            await both(remembering, "recently unreachable", f"http://127.0.0.1:{port}/mcp")
    assert len(outcomes) == 9
    assert {case: errors for case, errors in outcomes.items() if errors != (UNREACHABLE, UNREACHABLE)} == {}


async def test_restarted_server_gets_a_new_session(nats_url: str, namespace: str) -> None:
    port = free_port()
    async with tools_service(nats_url, namespace, unreachable_ttl_s=0) as tools:
        async with serve_mcp(port=port) as srv:
            assert (await tools.call(mcp(srv.url), "add", '{"a": 1, "b": 2}')).output == "3"
        down = await tools.call(mcp(srv.url), "add", '{"a": 1, "b": 2}', timeout_s=3)
        assert down.error is not None
        async with serve_mcp(port=port) as srv:
            assert (await tools.call(mcp(srv.url), "add", '{"a": 2, "b": 3}')).output == "5"


async def test_an_unreachable_server_fails_fast_for_a_while(nats_url: str, namespace: str) -> None:
    port = free_port()
    async with tools_service(nats_url, namespace, unreachable_ttl_s=60) as tools:
        url = f"http://127.0.0.1:{port}/mcp"
        assert (await tools.call(mcp(url), "add")).error == UNREACHABLE
        async with serve_mcp(port=port) as srv:  # back up, but remembered as down
            assert (await tools.call(mcp(url, Authorization="another caller"), "add")).error == UNREACHABLE
            assert (await tools.list(mcp(url.replace("/mcp", "/other")))).error == UNREACHABLE
            assert srv.requests == []  # no new connection attempt


async def test_a_callers_failed_handshake_does_not_block_others(nats_url: str, namespace: str) -> None:
    """Only network failures are remembered: a bad path or bad credentials (the server is up and
    said no to this caller) must not make the server fail fast for everyone else."""
    async with tools_service(nats_url, namespace, unreachable_ttl_s=60) as tools, serve_mcp() as srv:
        assert (await tools.call(mcp(srv.url.replace("/mcp", "/nope")), "add")).error == UNREACHABLE
        assert (await tools.call(mcp(srv.url), "add", '{"a": 1, "b": 2}')).output == "3"


async def test_a_flood_against_a_dead_server_does_not_delay_other_servers(nats_url: str, namespace: str) -> None:
    """20 calls (each its own session) against a server that accepts connections and never
    answers, on a replica handling 8 requests at once: at most 2 connect, 2 more wait, the rest
    are turned away at once. A call to a healthy server completes while the flood is pending."""
    # on exit the dead server closes its connections first, then the flood is awaited
    async with (
        tools_service(
            nats_url,
            namespace,
            max_concurrency=8,
            max_concurrency_per_server=2,
            max_waiting_per_server=2,
            server_queue_timeout_s=60,
            connect_timeout_s=60,
            unreachable_ttl_s=0,
        ) as tools,
        serve_mcp() as healthy,
        asyncio.TaskGroup() as tg,
        hanging_server() as dead,
    ):
        flood = [
            tg.create_task(tools.call(mcp(dead.url, **{"X-Flood": str(i)}), "add", timeout_s=60)) for i in range(20)
        ]
        async with asyncio.timeout(5):
            await dead.wait_for_connections(2)
            result = await tools.call(mcp(healthy.url), "add", '{"a": 1, "b": 2}')
        assert result.output == "3"
        pending = [t for t in flood if not t.done()]
        assert len(pending) >= 2, "the calls connecting to the dead server are still pending"
        assert dead.connections == 2  # never more than the per-server limit
        turned_away = [t.result() for t in flood if t.done()]
        assert turned_away and {r.error for r in turned_away} == {busy_message("test")}
    # the dead server went away: every call of the flood ended as a result
    assert {t.result().error for t in flood} <= {busy_message("test"), UNREACHABLE}
