"""The tools service over real NATS, against real MCP servers on loopback ports."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
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
from services.common.bus import BusFailure
from services.tools.app import run
from services.tools.settings import Settings
from tests.mcp_servers import (
    BIG_OUTPUT_BYTES,
    SECRET_TOKEN,
    free_port,
    serve_mcp,
    silent_port,
)

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
        reply: ToolsListed = await bus.request(
            self.nc, self.settings.subjects.tools_list, req, LIST_REPLY,
            request_id=rid, timeout=10, service="tools",
        )
        return reply

    async def call(self, server: McpServer, name: str, arguments: str = "{}", **kw: Any) -> ToolResult:
        rid = uuid.uuid4().hex
        req = CallToolRequest(request_id=rid, server=server, name=name, arguments=arguments, **kw)
        reply: ToolResult = await bus.request(
            self.nc, self.settings.subjects.tools_call, req, CALL_REPLY,
            request_id=rid, timeout=10, service="tools",
        )
        return reply


@contextlib.asynccontextmanager
async def tools_service(nats_url: str, namespace: str, **overrides: Any) -> AsyncIterator[Tools]:
    settings = Settings(nats_url=nats_url, namespace=namespace, **overrides)
    stop, ready = asyncio.Event(), asyncio.Event()
    nc = await bus.connect(nats_url, "tools-test")
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(run(settings, stop, ready=ready))
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


async def test_server_down_is_a_result(tools: Tools) -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"
    result = await tools.call(mcp(url), "add", '{"a": 1, "b": 2}')
    assert result.output is None
    assert result.error is not None and "could not connect to MCP server 'test'" in result.error
    assert "ConnectError" in result.error
    listed = await tools.list(mcp(url))
    assert listed.tools == [] and listed.error is not None and "Could not list tools" in listed.error


async def test_server_that_never_answers_is_a_result(nats_url: str, namespace: str) -> None:
    async with tools_service(nats_url, namespace, connect_timeout_s=0.3) as tools:
        with silent_port() as port:
            started = time.monotonic()
            result = await tools.call(mcp(f"http://127.0.0.1:{port}/mcp"), "add", timeout_s=5)
            assert time.monotonic() - started < 2
    assert result.error is not None and "no MCP handshake within 0.3s" in result.error


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


@pytest.mark.parametrize("url", ["http://example.com/mcp", "https://10.0.0.1/mcp", "file:///etc/passwd",
                                 "http://user:pw@127.0.0.1/mcp", "not a url"])
async def test_disallowed_server_is_invalid_request(tools: Tools, url: str) -> None:
    with pytest.raises(BusFailure) as call:
        await tools.call(mcp(url), "add", '{"a": 1, "b": 2}')
    with pytest.raises(BusFailure) as listing:
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
    async with serve_mcp() as builtin, serve_mcp() as other:
        overrides = {"builtin_tools": {"calc": builtin.url}, "allow_loopback": False}
        async with tools_service(nats_url, namespace, **overrides) as tools:
            listed = await tools.list(McpServer.builtin("calc"))
            assert listed.server_label == "calc" and "add" in {t.name for t in listed.tools}
            result = await tools.call(McpServer.builtin("calc"), "add", '{"a": 1, "b": 1}')
            assert result.output == "2"
            # a configured server is allowed by URL too; loopback in general is not
            assert (await tools.call(mcp(builtin.url), "echo", '{"text": "x"}')).output == "x"
            with pytest.raises(BusFailure) as refused:
                await tools.call(mcp(other.url), "echo", '{"text": "x"}')
            assert refused.value.error.code is ErrorCode.INVALID_REQUEST
            with pytest.raises(BusFailure) as unknown:
                await tools.list(McpServer.builtin("browser"))
            assert "browser" in unknown.value.error.message


async def test_restarted_server_gets_a_new_session(tools: Tools) -> None:
    port = free_port()
    async with serve_mcp(port=port) as srv:
        assert (await tools.call(mcp(srv.url), "add", '{"a": 1, "b": 2}')).output == "3"
    down = await tools.call(mcp(srv.url), "add", '{"a": 1, "b": 2}', timeout_s=3)
    assert down.error is not None
    async with serve_mcp(port=port) as srv:
        assert (await tools.call(mcp(srv.url), "add", '{"a": 2, "b": 3}')).output == "5"


async def test_garbage_on_the_bus_does_not_stop_the_service(tools: Tools) -> None:
    subjects = tools.settings.subjects
    for subject in (subjects.tools_call, subjects.tools_list):
        await tools.nc.publish(subject, b"not json")
        await tools.nc.publish(subject, b'{"kind": "call_tool"}')
    async with serve_mcp() as srv:
        assert (await tools.call(mcp(srv.url), "add", '{"a": 1, "b": 2}')).output == "3"
