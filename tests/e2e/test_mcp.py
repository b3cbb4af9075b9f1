"""The Responses tool loop with MCP, end to end: real MCP servers (mcp SDK, streamable HTTP) in
the test process, the whole stack from `chorus up`, the official openai client."""

from __future__ import annotations

import json
import uuid

import openai
import pytest
import redis.asyncio as aioredis
from openai.types.chat import ChatCompletionMessageFunctionToolCall
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseMcpCallCompletedEvent,
    ResponseOutputItemDoneEvent,
)
from openai.types.responses.mcp_tool_call_error import McpToolExecutionError
from openai.types.responses.response_function_web_search import ActionSearch
from openai.types.responses.response_output_item import McpCall
from openai.types.responses.tool_param import CodeInterpreter, Mcp, McpAllowedTools, McpRequireApproval

from tests.e2e.conftest import MODEL, RunningStack, Stacks
from tests.mcp_servers import hanging_server, serve_mcp, silent_port
from tests.waiting import until


def error_text(call: McpCall) -> str:
    """A failed mcp_call's error text (typed as a tool execution error)."""
    error = call.error
    assert isinstance(error, McpToolExecutionError)
    assert isinstance(error.content, list)  # typed `object` by the SDK: the MCP content parts
    return "".join(part["text"] for part in error.content)


@pytest.fixture(scope="module")
def mcp_stack(stacks: Stacks) -> RunningStack:
    return stacks.get("mcp")


def _mcp(
    url: str,
    *,
    allowed_tools: McpAllowedTools | None = None,
    require_approval: McpRequireApproval = "never",
    authorization: str | None = None,
    headers: dict[str, str] | None = None,
) -> Mcp:
    """An mcp tool for server "t" at ``url``; the optional fields are sent only when given."""
    tool: Mcp = {"type": "mcp", "server_label": "t", "server_url": url, "require_approval": require_approval}
    if allowed_tools is not None:
        tool["allowed_tools"] = allowed_tools
    if authorization is not None:
        tool["authorization"] = authorization
    if headers is not None:
        tool["headers"] = headers
    return tool


def _types(resp: Response) -> list[str]:
    return [i.type for i in resp.output]


async def test_list_call_and_answer(mcp_stack: RunningStack) -> None:
    client = mcp_stack.async_client()
    async with serve_mcp() as server:
        resp = await client.responses.create(
            model=MODEL, input="Please add two numbers with add", tools=[_mcp(server.url)]
        )
    assert resp.status == "completed"
    assert _types(resp)[0] == "mcp_list_tools" and _types(resp)[-1] == "message"
    listing = resp.output[0]
    assert listing.type == "mcp_list_tools"
    assert listing.server_label == "t" and {"add", "echo", "get_weather"} <= {t.name for t in listing.tools}
    (call,) = [i for i in resp.output if i.type == "mcp_call"]
    assert call.name == "add" and call.server_label == "t" and call.output == "2" and call.error is None
    assert "2" in resp.output_text
    # usage sums both model turns
    turns = [r for r in mcp_stack.engine_requests() if r["request_id"].split(".")[0] == resp.id]
    assert len(turns) == 2
    assert resp.usage is not None and resp.usage.input_tokens == sum(r["prompt_tokens"] for r in turns)


async def test_allowed_tools_hide_the_rest(mcp_stack: RunningStack) -> None:
    client = mcp_stack.async_client()
    async with serve_mcp() as server:
        resp = await client.responses.create(
            model=MODEL, input="Please echo hello", tools=[_mcp(server.url, allowed_tools=["echo"])]
        )
    listing = resp.output[0]
    assert listing.type == "mcp_list_tools" and [t.name for t in listing.tools] == ["echo"]
    prompt = mcp_stack.engine_prompt(resp.id)
    assert "echo" in prompt and "secret_tool" not in prompt and "type add" not in prompt


async def test_approval_round_trip(mcp_stack: RunningStack) -> None:
    client = mcp_stack.async_client()
    async with serve_mcp() as server:
        tools = [_mcp(server.url, require_approval="always")]
        first = await client.responses.create(model=MODEL, input="Weather via get_weather in Paris", tools=tools)
        assert first.status == "completed"
        (ask,) = [i for i in first.output if i.type == "mcp_approval_request"]
        assert ask.name == "get_weather" and not [i for i in first.output if i.type == "mcp_call"]
        approved = await client.responses.create(
            model=MODEL,
            previous_response_id=first.id,
            tools=tools,
            input=[{"type": "mcp_approval_response", "approval_request_id": ask.id, "approve": True}],
        )
        (call,) = [i for i in approved.output if i.type == "mcp_call"]
        assert call.approval_request_id == ask.id and call.output is not None and "Sunny" in call.output
        assert "Sunny" in approved.output_text
        declined = await client.responses.create(
            model=MODEL,
            previous_response_id=first.id,
            tools=tools,
            input=[{"type": "mcp_approval_response", "approval_request_id": ask.id, "approve": False}],
        )
        (call,) = [i for i in declined.output if i.type == "mcp_call"]
        assert "declined" in error_text(call) and call.output is None
        assert declined.status == "completed"


async def test_parallel_calls_run_concurrently(mcp_stack: RunningStack) -> None:
    """`meet` returns only when two calls wait at once (a barrier): both must run together."""
    client = mcp_stack.async_client()
    call = "<|start|>assistant<|channel|>commentary to=t.meet <|constrain|>json<|message|>{}"
    raw = f"{call}<|end|>{call}<|call|>"
    async with serve_mcp() as server:
        resp = await client.responses.create(model=MODEL, input=f"[[sim:raw={raw}]]", tools=[_mcp(server.url)])
    calls = [i for i in resp.output if i.type == "mcp_call"]
    assert [c.output for c in calls] == ["met", "met"]
    assert resp.status == "completed"


async def test_failures_are_results(mcp_stack: RunningStack) -> None:
    client = mcp_stack.async_client()
    async with serve_mcp() as server:
        boom = await client.responses.create(model=MODEL, input="call boom now", tools=[_mcp(server.url)])
        hang = await client.responses.create(model=MODEL, input="call hang now", tools=[_mcp(server.url)])
    (call,) = [i for i in boom.output if i.type == "mcp_call"]
    assert "kaboom" in error_text(call) and boom.status == "completed"
    assert "kaboom" in boom.output_text  # the model was told
    (call,) = [i for i in hang.output if i.type == "mcp_call"]
    assert "time" in error_text(call).lower() and hang.status == "completed"
    with silent_port() as port:
        down = await client.responses.create(
            model=MODEL, input="hi there", tools=[_mcp(f"http://127.0.0.1:{port}/mcp")]
        )
    assert down.status == "completed"
    listing = down.output[0]
    assert listing.type == "mcp_list_tools" and listing.error


async def test_streaming_events_tell_the_truth(mcp_stack: RunningStack) -> None:
    client = mcp_stack.async_client()
    async with serve_mcp() as server:
        events = [
            e
            async for e in await client.responses.create(
                model=MODEL, input="Please add two numbers with add", tools=[_mcp(server.url)], stream=True
            )
        ]
        async with client.responses.stream(
            model=MODEL, input="Please add with add", tools=[_mcp(server.url)]
        ) as stream:
            async for _ in stream:
                pass
            final = await stream.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds: list[str] = [e.type for e in events]
    order = [
        "response.created",
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.completed",
        "response.completed",
    ]
    positions = [kinds.index(k) for k in order]
    assert positions == sorted(positions)
    call_index = next(e.output_index for e in events if isinstance(e, ResponseMcpCallCompletedEvent))
    done = next(e for e in events if isinstance(e, ResponseOutputItemDoneEvent) and e.output_index == call_index)
    assert kinds.index("response.mcp_call.completed") < events.index(done)
    assert done.item.type == "mcp_call" and done.item.output == "2"
    assert [i.type for i in final.output].count("mcp_call") == 1


async def test_budget_spans_the_loop(mcp_stack: RunningStack) -> None:
    client = mcp_stack.async_client()
    async with serve_mcp() as server:
        resp = await client.responses.create(
            model=MODEL, input="Please add two numbers with add", tools=[_mcp(server.url)], max_output_tokens=40
        )
    assert resp.usage is not None and resp.usage.output_tokens <= 40
    assert resp.status == "incomplete"
    assert resp.incomplete_details is not None and resp.incomplete_details.reason == "max_output_tokens"


async def test_loopback_spellings_are_refused_unless_allowed(nats_url: str, redis_url: str) -> None:
    """With loopback not allowed, every spelling of it is refused before any connection: the
    caller gets the same result error as for an unreachable server (nothing about why)."""
    from tests.e2e.conftest import start_stack

    closed = start_stack("mcp-closed", nats_url, redis_url, env={"CHORUS_ALLOW_LOOPBACK": "false"})
    try:
        client = closed.async_client()
        async with hanging_server() as srv:
            for host in ("127.0.0.1", "127.1", "0x7f000001", "2130706433", "[::1]", "[::ffff:127.0.0.1]", "localhost"):
                resp = await client.responses.create(
                    model=MODEL, input="hi", tools=[_mcp(f"http://{host}:{srv.port}/mcp")]
                )
                assert resp.status == "completed", host
                listing = resp.output[0]
                assert listing.type == "mcp_list_tools" and listing.tools == [], host
                assert listing.error is not None and "could not be reached" in listing.error, host
                assert str(srv.port) not in listing.error and "loopback" not in listing.error.split(".")[0]
            assert srv.connections == 0
        # a URL that is wrong on its face is still the caller's 400
        for url in ("ftp://127.0.0.1/mcp", "http://user:pw@127.0.0.1/mcp"):
            with pytest.raises(openai.BadRequestError) as err:
                await client.responses.create(model=MODEL, input="hi", tools=[_mcp(url)])
            assert err.value.response.json()["error"]["param"].startswith("tools")
    finally:
        closed.stop()


async def test_chat_keeps_plain_function_calling(mcp_stack: RunningStack) -> None:
    client = mcp_stack.async_client()
    resp = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Oslo"}],
        tools=[
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                },
            }
        ],
    )
    assert resp.choices[0].finish_reason == "tool_calls"
    tool_calls = resp.choices[0].message.tool_calls
    assert tool_calls is not None and isinstance(tool_calls[0], ChatCompletionMessageFunctionToolCall)
    assert json.loads(tool_calls[0].function.arguments)["city"] == "Oslo"


async def test_builtin_browser_routed_to_mcp(stacks: Stacks) -> None:
    """`--builtin-tool browser=URL`: a web_search tool request declares Harmony's browser, and
    the model's browser.search call runs on that MCP server; the item is a web_search_call."""
    from mcp.server.mcpserver import MCPServer

    stack = stacks.get("builtin")
    browser = MCPServer("browser", log_level="WARNING")

    @browser.tool()
    def search(query: str, topn: int = 10) -> str:
        """Search the web."""
        return f"3 results for {query}"

    raw = '<|channel|>analysis to=browser.search <|constrain|>json<|message|>{"query": "chorus nats"}<|call|>'
    client = stack.async_client()
    async with serve_mcp(browser, port=stacks.builtin_port):
        events = [
            e
            async for e in await client.responses.create(
                model=MODEL, input=f"[[sim:raw={raw}]]", tools=[{"type": "web_search_preview"}], stream=True
            )
        ]
    last = events[-1]
    assert isinstance(last, ResponseCompletedEvent)
    final = last.response
    assert final.status == "completed"
    (search_call,) = [i for i in final.output if i.type == "web_search_call"]
    assert isinstance(search_call.action, ActionSearch) and search_call.action.query == "chorus nats"
    assert search_call.status == "completed"
    assert "3 results for chorus nats" in final.output_text
    kinds = [e.type for e in events]
    assert kinds.index("response.web_search_call.searching") < kinds.index("response.web_search_call.completed")
    assert "namespace browser {" in stack.engine_prompt(final.id)
    code_interpreter: CodeInterpreter = {"type": "code_interpreter", "container": {"type": "auto"}}
    with pytest.raises(openai.BadRequestError):  # not configured on this stack
        await mcp_stack_client(stacks).responses.create(model=MODEL, input="x", tools=[code_interpreter])


def mcp_stack_client(stacks: Stacks) -> openai.AsyncOpenAI:
    return stacks.get("builtin").async_client()


async def test_mcp_credentials_are_used_and_never_echoed_logged_or_stored_in_clear(mcp_stack: RunningStack) -> None:
    """The authorization and headers a client sends for an MCP server reach that server, and
    nothing else: not the stored response, its input items, a background job in Redis, or any
    service's log."""
    token, key = f"tok-{uuid.uuid4().hex}", f"key-{uuid.uuid4().hex}"
    client = mcp_stack.async_client()
    async with serve_mcp() as server:
        tool = _mcp(server.url, authorization=token, headers={"X-Api-Key": key})
        resp = await client.responses.create(model=MODEL, input="Please add two numbers with add", tools=[tool])
        queued = await client.responses.create(
            model=MODEL, input="Please add two numbers with add", tools=[tool], background=True
        )
        queued_id = queued.id

        async def finished() -> Response | None:
            got = await client.responses.retrieve(queued_id)
            return None if got.status in ("queued", "in_progress") else got

        queued = await until(finished, 60, "the background response finished", every=0.1)
    assert resp.status == queued.status == "completed"
    assert f"Bearer {token}" in server.headers_seen("authorization")
    assert key in server.headers_seen("x-api-key")
    with mcp_stack.http() as http:
        for rid in (resp.id, queued.id):
            for path in (f"/v1/responses/{rid}", f"/v1/responses/{rid}/input_items"):
                body = http.get(path).text
                assert token not in body and key not in body, path
    stored = await redis_values(mcp_stack)
    assert stored and not [v for v in stored if token.encode() in v or key.encode() in v]
    logs = "".join(p.read_text(errors="replace") for p in mcp_stack.log_dir.glob("*.log"))
    assert token not in logs and key not in logs


def _raw(reply: bytes | str | None) -> bytes:
    """One reply of a client without decode_responses (bytes; None for a missing key) as bytes:
    redis-py types replies as ``bytes | str`` whatever the client."""
    assert not isinstance(reply, str)
    return reply or b""


async def redis_values(stack: RunningStack) -> list[bytes]:
    """Every value under the stack's namespace in Redis (strings, lists, sets, hashes, streams)."""
    r = aioredis.from_url(stack.redis_url)
    out: list[bytes] = []
    try:
        async for name in r.scan_iter(match=f"{stack.namespace}*", count=1000):
            kind = _raw(await r.type(name)).decode()
            if kind == "string":
                out.append(_raw(await r.get(name)))
            elif kind == "list":
                out += [_raw(v) for v in await r.lrange(name, 0, -1)]
            elif kind == "set":
                out += [_raw(v) for v in await r.smembers(name)]
            elif kind == "hash":
                out += [_raw(k) + b"=" + _raw(v) for k, v in (await r.hgetall(name)).items()]
            elif kind == "stream":
                entries = await r.xrange(name)
                assert entries is not None
                for _, fields in entries:
                    assert fields is not None
                    out.append(b"".join(_raw(k) + _raw(v) for k, v in fields.items()))
    finally:
        await r.aclose()
    return out
