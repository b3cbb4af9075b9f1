"""The tools service over real NATS, against real MCP servers on loopback ports."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import TypeAdapter

from contracts.errors import ErrorCode
from contracts.messages.tools import (
    CallToolReply,
    CallToolRequest,
    ListToolsReply,
    ListToolsRequest,
    McpServer,
    ToolResult,
    ToolsListed,
)
from services.common import bus
from services.common.errors import ChorusError
from services.tools.app import run
from services.tools.runner import busy_message, unreachable_message
from services.tools.settings import Settings
from tests.mcp_servers import BIG_OUTPUT_BYTES, SECRET_TOKEN, free_port, hanging_server, serve_mcp, silent_port
from tests.tools.fakes import FakeResolver

LIST_REPLY: TypeAdapter[Any] = TypeAdapter(ListToolsReply)
CALL_REPLY: TypeAdapter[Any] = TypeAdapter(CallToolReply)


class Tools:
    """A client of the tools service, the way the gateway talks to it."""

    def __init__(self, nc: Any, settings: Settings) -> None:
        self.nc = nc
        self.settings = settings

    async def list(self, server: McpServer) -> ToolsListed:
        rid = uuid.uuid4().hex
        req = ListToolsRequest(request_id=rid, server=server)
        reply: ToolsListed = await bus.Bus(self.nc, self.settings.subjects).request(
            self.settings.subjects.tools_list, req, LIST_REPLY, timeout=10, service="tools"
        )
        return reply

    async def call(self, server: McpServer, name: str, arguments: str = "{}", **kw: Any) -> ToolResult:
        rid = uuid.uuid4().hex
        req = CallToolRequest(request_id=rid, server=server, name=name, arguments=arguments, **kw)
        reply: ToolResult = await bus.Bus(self.nc, self.settings.subjects).request(
            self.settings.subjects.tools_call, req, CALL_REPLY, timeout=10, service="tools"
        )
        return reply


@contextlib.asynccontextmanager
async def tools_service(
    nats_url: str, namespace: str, resolver: FakeResolver | None = None, **overrides: Any
) -> AsyncIterator[Tools]:
    """The tools service as `chorus up` on 127.0.0.1 runs it (loopback MCP servers allowed,
    unless ``overrides`` say otherwise), with a fake resolver: no test looks up a real name."""
    settings = Settings(nats_url=nats_url, namespace=namespace, **{"allow_loopback": True, **overrides})
    resolver = resolver or FakeResolver({"localhost": ["127.0.0.1"]})
    stop, ready = asyncio.Event(), asyncio.Event()
    nc = await bus.connect(nats_url, "tools-test")
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(run(settings, stop, ready=ready, resolve=resolver))
            try:
                async with asyncio.timeout(5):
                    await ready.wait()
                yield Tools(nc, settings)
            finally:
                stop.set()
    finally:
        await nc.close()


@pytest.fixture
async def tools(nats_url: str, namespace: str) -> AsyncIterator[Tools]:
    async with tools_service(nats_url, namespace) as client:
        yield client


def mcp(url: str, **headers: str) -> McpServer:
    return McpServer(server_label="test", server_url=url, headers=headers)


async def test_list_tools(tools: Tools) -> None:
    async with serve_mcp() as srv:
        listed = await tools.list(mcp(srv.url))
    assert listed.error is None
    assert listed.server_label == "test"
    by_name = {t.name: t for t in listed.tools}
    assert set(by_name) >= {"add", "echo", "get_weather", "secret_tool", "boom", "hang", "big"}
    add = by_name["add"]
    assert add.description == "Add two integers."
    assert add.input_schema["properties"].keys() == {"a", "b"}
    assert add.input_schema["required"] == ["a", "b"]
    assert add.annotations == {"readOnlyHint": True}


async def test_listing_is_cached_per_server_and_headers(tools: Tools) -> None:
    async with serve_mcp() as srv:
        first = await tools.list(mcp(srv.url, **{"X-Caller": "alice"}))
        seen = len(srv.requests)
        assert srv.rpc_count("tools/list") == 1
        again = await tools.list(mcp(srv.url, **{"X-Caller": "alice"}))
        assert again == first
        assert len(srv.requests) == seen  # served from the cache: the server saw nothing

        other = await tools.list(mcp(srv.url, **{"X-Caller": "bob"}))
        assert other.tools == first.tools
        bob = srv.requests[seen:]
        assert srv.rpc_count("tools/list") == 2, "bob must not be served alice's listing"
        assert srv.handshakes == 2  # and not alice's session either
        assert {r.headers.get("x-caller") for r in bob} == {"bob"}
        assert {r.headers.get("x-caller") for r in srv.requests[:seen]} == {"alice"}


async def test_call_add(tools: Tools) -> None:
    async with serve_mcp() as srv:
        result = await tools.call(mcp(srv.url), "add", '{"a": 1, "b": 2}')
    assert result == ToolResult(output="3")


async def test_call_reuses_the_session_of_a_listing(tools: Tools) -> None:
    async with serve_mcp() as srv:
        await tools.list(mcp(srv.url))
        await tools.call(mcp(srv.url), "echo", '{"text": "hi"}')
        result = await tools.call(mcp(srv.url), "get_weather", '{"city": "Paris"}')
        assert result.output == "Sunny, 21 C in Paris"
        assert srv.handshakes == 1  # one session for the listing and both calls


async def test_tool_error_is_a_result(tools: Tools) -> None:
    async with serve_mcp() as srv:
        result = await tools.call(mcp(srv.url), "boom")
        unknown = await tools.call(mcp(srv.url), "no_such_tool")
        bad_args = await tools.call(mcp(srv.url), "add", '{"a": "x"}')
    assert result.output is None and result.error is not None and "kaboom" in result.error
    assert unknown.error is not None and "no_such_tool" in unknown.error
    assert bad_args.error is not None and "validation" in bad_args.error


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


UNREACHABLE = unreachable_message("test")


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


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object, not list"),
        ('"text"', "must be a JSON object, not str"),
    ],
)
async def test_invalid_arguments_never_reach_the_server(tools: Tools, arguments: str, expected: str) -> None:
    async with serve_mcp() as srv:
        result = await tools.call(mcp(srv.url), "add", arguments)
        assert srv.requests == []
    assert result.error is not None and expected in result.error and "'add'" in result.error


async def test_big_output_is_truncated(tools: Tools) -> None:
    cap = tools.settings.max_output_bytes
    async with serve_mcp() as srv:
        result = await tools.call(mcp(srv.url), "big")
    assert result.truncated
    assert result.output is not None
    assert result.output.startswith("x" * cap)
    assert result.output.endswith(f"\n[... truncated {BIG_OUTPUT_BYTES - cap} bytes]")


async def test_response_over_the_size_cap_is_an_error(nats_url: str, namespace: str) -> None:
    async with tools_service(nats_url, namespace, max_response_bytes=50_000) as tools, serve_mcp() as srv:
        result = await tools.call(mcp(srv.url), "big", timeout_s=5)
        assert (await tools.call(mcp(srv.url), "echo", '{"text": "ok"}')).output == "ok"
    assert result.error is not None and "50000" in result.error


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "http://user:pw@127.0.0.1/mcp", "not a url", "http://127.000.000.001/mcp"]
)
async def test_malformed_server_url_is_invalid_request(tools: Tools, url: str) -> None:
    """Malformed on its face, whatever the network: the caller's mistake."""
    with pytest.raises(ChorusError) as call:
        await tools.call(mcp(url), "add", '{"a": 1, "b": 2}')
    with pytest.raises(ChorusError) as listing:
        await tools.list(mcp(url))
    for failure in (call.value, listing.value):
        assert failure.error.code is ErrorCode.INVALID_REQUEST
        assert failure.error.param == "tools"
        assert "server_url" in failure.error.message


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


async def test_parallel_calls_run_concurrently(tools: Tools) -> None:
    async with serve_mcp() as srv:
        # `meet` returns only when two calls wait at its barrier together
        results = await asyncio.gather(tools.call(mcp(srv.url), "meet"), tools.call(mcp(srv.url), "meet"))
    assert [r.output for r in results] == ["met", "met"]


async def test_parallel_calls_with_different_headers(tools: Tools) -> None:
    async with serve_mcp() as srv:
        results = await asyncio.gather(
            tools.call(mcp(srv.url, **{"X-Caller": "alice"}), "meet"),
            tools.call(mcp(srv.url, **{"X-Caller": "bob"}), "meet"),
        )
    assert [r.output for r in results] == ["met", "met"]


async def test_headers_go_only_to_their_own_server(tools: Tools) -> None:
    async with serve_mcp() as a, serve_mcp() as b:
        auth = {"Authorization": f"Bearer {SECRET_TOKEN}"}
        secret = await tools.call(mcp(a.url, **auth), "secret_tool")
        denied = await tools.call(mcp(b.url), "secret_tool")
        assert secret.output == "the secret is 42"
        assert denied.error is not None and "unauthorized" in denied.error
        assert set(a.headers_seen("authorization")) == {f"Bearer {SECRET_TOKEN}"}
        assert set(b.headers_seen("authorization")) == {None}
        # same URL without the header: a session of its own, no token
        seen = len(a.requests)
        again = await tools.call(mcp(a.url), "secret_tool")
        assert again.error is not None and "unauthorized" in again.error
        assert set(a.headers_seen("authorization")[seen:]) == {None}


async def test_sse_transport(tools: Tools) -> None:
    async with serve_mcp(transport="sse") as srv:
        listed = await tools.list(mcp(srv.url))
        result = await tools.call(mcp(srv.url), "add", '{"a": 40, "b": 2}')
    assert "add" in {t.name for t in listed.tools}
    assert result.output == "42"


async def test_builtin_tool_servers(nats_url: str, namespace: str) -> None:
    async with (
        serve_mcp() as builtin,
        serve_mcp() as other,
        tools_service(nats_url, namespace, builtin_tools={"calc": builtin.url}, allow_loopback=False) as tools,
    ):
        listed = await tools.list(McpServer.builtin("calc"))
        assert listed.server_label == "calc" and "add" in {t.name for t in listed.tools}
        result = await tools.call(McpServer.builtin("calc"), "add", '{"a": 1, "b": 1}')
        assert result.output == "2"
        # a configured server is allowed by URL too; loopback in general is not
        assert (await tools.call(mcp(builtin.url), "echo", '{"text": "x"}')).output == "x"
        refused = await tools.call(mcp(other.url), "echo", '{"text": "x"}')
        assert refused.error == UNREACHABLE and other.requests == []
        with pytest.raises(ChorusError) as unknown:
            await tools.list(McpServer.builtin("browser"))
        assert "browser" in unknown.value.error.message


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


async def test_the_service_connects_to_the_checked_address(nats_url: str, namespace: str) -> None:
    """A made-up name resolved (by the fake resolver) to loopback: the MCP server on loopback
    answers, and sees the name in the Host header."""
    resolver = FakeResolver({"mcp.pinned.test": ["127.0.0.1"]})
    only_the_name = TransportSecuritySettings(allowed_hosts=["mcp.pinned.test:*"])
    async with (
        tools_service(nats_url, namespace, resolver) as tools,
        serve_mcp(transport_security=only_the_name) as srv,
    ):
        url = f"http://mcp.pinned.test:{srv.port}/mcp"
        assert "add" in {t.name for t in (await tools.list(mcp(url))).tools}
        assert (await tools.call(mcp(url), "add", '{"a": 1, "b": 2}')).output == "3"
        assert set(srv.headers_seen("host")) == {f"mcp.pinned.test:{srv.port}"}
        assert resolver.lookups == [("mcp.pinned.test", srv.port)]  # one session, one lookup


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
