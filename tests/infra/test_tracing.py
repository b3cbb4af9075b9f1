"""One API request is one trace across the services, seen through a real OTLP/HTTP receiver
(traces.py): a streamed chat completion, a response ending in a function call, a response
with MCP tool calls, and a request continuing the caller's ``traceparent``.

The whole stack runs from `chorus up` with only the standard variables set
(``OTEL_EXPORTER_OTLP_ENDPOINT`` and a fast ``OTEL_BSP_SCHEDULE_DELAY``)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
from openai.types.responses import FunctionToolParam
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from tests.e2e.conftest import MODEL, RunningStack, start_stack
from tests.infra.traces import (
    DISPATCHER,
    ENCODER,
    ENGINE,
    GATEWAY,
    GENAI,
    PARSER,
    TOOLS,
    TURN,
    Receiver,
    assert_engine_span,
    assert_genai,
    assert_one_tree,
    assert_whole,
    one,
)
from tests.mcp_servers import serve_mcp


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


@pytest.fixture(scope="module")
def traced(receiver: Receiver, nats_url: str, redis_url: str) -> Iterator[RunningStack]:
    stack = start_stack(
        "tracing",
        nats_url,
        redis_url,
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100"},
    )
    try:
        yield stack
    finally:
        stack.stop()  # before the receiver: the services export what is left as they stop


async def test_streamed_chat_completion_is_one_trace(traced: RunningStack, receiver: Receiver) -> None:
    client = traced.async_client()
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hello"}],
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=64,
        temperature=0.5,
        top_p=0.9,
    )
    (request_id,) = {chunk.id async for chunk in stream}
    trace = await receiver.trace_of(
        request_id, {(GATEWAY, GENAI): 1, (ENCODER, "render"): 1, (DISPATCHER, ENGINE): 1, (PARSER, "parse"): 1}
    )
    genai = assert_one_tree(trace)
    assert {s.service for s in trace} == {GATEWAY, ENCODER, DISPATCHER, PARSER}
    for service in (ENCODER, DISPATCHER, PARSER):  # the job carries the GenAI span's context
        assert {s.parent_id for s in trace if s.service == service} == {genai.span_id}
    assert_genai(genai, response_id=request_id, api="chat", max_tokens=64, temperature=0.5, top_p=0.9)
    assert genai.attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert_engine_span(one(trace, DISPATCHER, ENGINE), traced)
    assert_whole(receiver, request_id, trace)


async def test_response_with_a_function_call_is_one_trace(traced: RunningStack, receiver: Receiver) -> None:
    client = traced.async_client()
    # openai-python requires "strict"; the API (and this gateway) take a tool without it
    weather: FunctionToolParam = {  # type: ignore[typeddict-item]
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
    resp = await client.responses.create(
        model=MODEL,
        input="What is the weather in Paris?",
        tools=[weather],
        max_output_tokens=200,
        temperature=0.7,
        top_p=0.95,
    )
    assert [i.type for i in resp.output][-1] == "function_call"
    trace = await receiver.trace_of(
        resp.id,
        {
            (GATEWAY, GENAI): 1,
            (GATEWAY, TURN): 1,
            (ENCODER, "render"): 1,
            (DISPATCHER, ENGINE): 1,
            (PARSER, "parse"): 1,
        },
    )
    genai = assert_one_tree(trace)
    assert {s.service for s in trace} == {GATEWAY, ENCODER, DISPATCHER, PARSER}
    turn = one(trace, GATEWAY, TURN)
    assert turn.parent_id == genai.span_id
    for service, name in ((ENCODER, "render"), (DISPATCHER, ENGINE), (PARSER, "parse")):
        assert one(trace, service, name).parent_id == turn.span_id  # the turn's job carries the turn
    assert_genai(genai, response_id=resp.id, api="responses", max_tokens=200, temperature=0.7, top_p=0.95)
    assert genai.attributes["gen_ai.response.finish_reasons"] == ["tool_calls"]  # the model's, not the status
    assert_engine_span(one(trace, DISPATCHER, ENGINE), traced)
    assert_whole(receiver, resp.id, trace)


async def test_mcp_tool_calls_join_the_trace(traced: RunningStack, receiver: Receiver) -> None:
    client = traced.async_client()
    async with serve_mcp() as server:
        resp = await client.responses.create(
            model=MODEL,
            input="Please add two numbers with add",
            max_output_tokens=300,
            temperature=0.2,
            top_p=0.5,
            tools=[{"type": "mcp", "server_label": "t", "server_url": server.url, "require_approval": "never"}],
        )
    assert resp.status == "completed" and [i.type for i in resp.output if i.type == "mcp_call"] == ["mcp_call"]
    trace = await receiver.trace_of(
        resp.id,
        {
            (GATEWAY, GENAI): 1,
            (GATEWAY, TURN): 2,
            (ENCODER, "render"): 2,
            (DISPATCHER, ENGINE): 2,
            (PARSER, "parse"): 2,
            (TOOLS, "tools/list"): 1,
            (TOOLS, "execute_tool add"): 1,
        },
    )
    genai = assert_one_tree(trace)
    assert {s.service for s in trace} == {GATEWAY, ENCODER, DISPATCHER, PARSER, TOOLS}
    call = one(trace, TOOLS, "execute_tool add")
    assert call.parent_id == genai.span_id and call.kind == PbSpan.SPAN_KIND_SERVER
    assert call.attributes["gen_ai.operation.name"] == "execute_tool"
    assert call.attributes["gen_ai.tool.name"] == "add"
    assert one(trace, TOOLS, "tools/list").parent_id == genai.span_id
    turns = {s.span_id for s in trace if s.name == TURN}
    assert {s.parent_id for s in trace if s.name == TURN} == {genai.span_id}
    assert {s.parent_id for s in trace if s.service in (ENCODER, DISPATCHER, PARSER)} == turns
    assert_genai(genai, response_id=resp.id, api="responses", max_tokens=300, temperature=0.2, top_p=0.5)
    for engine in (s for s in trace if s.name == ENGINE):
        assert_engine_span(engine, traced)
    assert_whole(receiver, resp.id, trace)


async def test_the_callers_traceparent_is_continued(traced: RunningStack, receiver: Receiver) -> None:
    trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    completion = await traced.async_client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hello"}],
        max_tokens=32,
        extra_headers={"traceparent": f"00-{trace_id}-{caller_span}-01"},
    )
    trace = await receiver.trace_of(
        completion.id,
        {(GATEWAY, GENAI): 1, (ENCODER, "render"): 1, (DISPATCHER, ENGINE): 1, (PARSER, "parse"): 1},
        caller_span,
    )
    genai = assert_one_tree(trace, caller_span)
    assert genai.trace_id == trace_id
    assert {s.parent_id for s in trace if s.service != GATEWAY} == {genai.span_id}
    assert_whole(receiver, completion.id, trace)
