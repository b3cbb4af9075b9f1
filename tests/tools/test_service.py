"""The tools service over real NATS, against real MCP servers on loopback ports, when things work:
tools listed (and the listing cached per server and headers), tools called in the session of a
listing, a tool's own failure or bad arguments as a result, big outputs truncated, malformed
server URLs refused as the caller's mistake, calls in parallel, headers kept to their own
server, the SSE transport, built-in tool servers, and the connection made to the address that
was checked. What happens when a server is slow, down, refused or flooded is in
test_service_failures.py."""

from __future__ import annotations

import asyncio

import pytest
from mcp.server.transport_security import TransportSecuritySettings

from contracts.errors import ErrorCode
from contracts.messages.tools import McpServer, ToolResult
from services.common.errors import ChorusError
from tests.mcp_servers import BIG_OUTPUT_BYTES, SECRET_TOKEN, serve_mcp
from tests.tools.fakes import FakeResolver
from tests.tools.service_client import UNREACHABLE, Tools, mcp, tools_service


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
