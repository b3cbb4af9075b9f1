"""Chat Completions end to end: `chorus up` over real NATS + Redis, driven by the openai client."""

from __future__ import annotations

import json
import uuid
from typing import Any, cast

import httpx
import openai
import pytest
from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageParam,
)
from openai.types.shared_params import ResponseFormatJSONSchema

from tests.e2e.conftest import MODEL, EngineRecord, RunningStack, Stacks

WEATHER_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def test_models_and_health(stack: RunningStack) -> None:
    client = stack.client()
    assert [m.id for m in client.models.list().data] == [MODEL]
    with stack.http() as http:
        health = http.get("/health")
        assert health.status_code == 200
        assert {"encoder", "dispatcher", "parser"} <= health.json()["services"].keys()


def test_plain_completion(any_stack: RunningStack) -> None:
    client = any_stack.client()
    resp = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello to Chorus"}])
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content
    extra = choice.message.model_extra or {}
    assert extra["reasoning_content"] and extra["reasoning"] == extra["reasoning_content"]
    assert "<|" not in choice.message.content
    assert resp.usage is not None and resp.usage.prompt_tokens > 0
    assert resp.usage.completion_tokens > 0
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    details = resp.usage.completion_tokens_details
    assert details is not None and (details.reasoning_tokens or 0) > 0


def test_streamed_completion(any_stack: RunningStack) -> None:
    client = any_stack.client()
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Stream me an answer"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    reasoning = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks if c.choices
    )
    reasoning_vllm = "".join((c.choices[0].delta.model_extra or {}).get("reasoning") or "" for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert reasoning and reasoning == reasoning_vllm
    assert content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    usage_chunks = [c for c in chunks if not c.choices]
    usage = usage_chunks[0].usage if len(usage_chunks) == 1 else None
    assert usage is not None and usage.completion_tokens > 0
    assert chunks[-1] is usage_chunks[0]
    # the same request unstreamed says the same thing
    whole = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Stream me an answer"}])
    assert whole.choices[0].message.content == content


def test_tool_call(any_stack: RunningStack) -> None:
    client = any_stack.client()
    resp = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the weather in Paris?"}], tools=[WEATHER_TOOL]
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments), dict)
    assert "city" in json.loads(call.function.arguments)
    assert not (choice.message.content or "").strip().startswith("{")


def test_streamed_tool_call(any_stack: RunningStack) -> None:
    client = any_stack.client()
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Weather in Oslo please"}],
            tools=[WEATHER_TOOL],
            stream=True,
        )
    )
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].index == 0 and (deltas[0].id or "").startswith("call_")
    assert all(d.function for d in deltas)
    assert deltas[0].function and deltas[0].function.name == "get_weather"
    args = "".join(d.function.arguments or "" for d in deltas if d.function)
    assert json.loads(args)["city"]
    assert all(d.id is None for d in deltas[1:])
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_tool_result_turn(any_stack: RunningStack) -> None:
    client = any_stack.client()
    first = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the weather in Paris?"}], tools=[WEATHER_TOOL]
    )
    call = (first.choices[0].message.tool_calls or [])[0]
    assert call.type == "function"
    reasoning = (first.choices[0].message.model_extra or {}).get("reasoning")
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "What is the weather in Paris?"},
        # ``reasoning`` (vLLM's field for the thought before the call) is not in openai-python's type
        cast(
            ChatCompletionAssistantMessageParam,
            {
                "role": "assistant",
                "content": None,
                "reasoning": reasoning,
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.function.name, "arguments": call.function.arguments},
                    }
                ],
            },
        ),
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 C"},
    ]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL])
    assert second.choices[0].finish_reason == "stop"
    assert "Sunny, 24 C" in (second.choices[0].message.content or "")


def test_agent_history_with_reasoning_content_and_parallel_calls(stack: RunningStack) -> None:
    """OpenCode-style history: one assistant message with reasoning, content and two calls."""
    client = stack.client()
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        # off openai-python's type, as agents send it: ``reasoning_content``, and arguments as an object
        cast(
            ChatCompletionAssistantMessageParam,
            {
                "role": "assistant",
                "content": "Checking both.",
                "reasoning_content": "Two cities.",
                "tool_calls": [
                    {
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    },
                    {
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Rome"}},
                    },
                ],
            },
        ),
        {"role": "tool", "tool_call_id": "call_a", "content": "Paris: rain"},
        {"role": "tool", "tool_call_id": "call_b", "content": "Rome: sun"},
    ]
    resp = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL])
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].message.content


def test_max_tokens_cut(stack: RunningStack) -> None:
    client = stack.client()
    resp = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me a long story"}], max_tokens=5
    )
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None and resp.usage.completion_tokens == 5


def test_client_disconnect_aborts_engine(stack: RunningStack) -> None:
    client = stack.client()
    stream = client.chat.completions.create(
        model=MODEL,
        stream=True,
        messages=[{"role": "user", "content": "go on forever [[sim:tokens=5000]] [[sim:delay_ms=5]]"}],
    )
    request_id = None
    for i, chunk in enumerate(stream):
        request_id = chunk.id
        if i >= 3:
            break
    stream.close()
    assert request_id
    record = stack.wait_engine(lambda r: r.get("request_id") == request_id and r.get("aborted"))
    assert record["aborted"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_a_client_leaving_a_whole_answer_aborts_the_engine(stack: RunningStack, path: str) -> None:
    """Not streamed: the client gives up (its connection closes) while the engine generates."""
    marker = f"leaving-{uuid.uuid4().hex[:8]}"
    text = f"{marker} go on forever [[sim:tokens=5000]] [[sim:delay_ms=5]]"
    body = (
        {"model": MODEL, "messages": [{"role": "user", "content": text}]}
        if "chat" in path
        else {"model": MODEL, "input": text}
    )
    with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=stack.base_url, timeout=1.5) as http:
        http.post(path, json=body)
    record = stack.wait_engine(lambda r: marker in r.get("prompt_text", "") and r.get("aborted"))
    assert record["completion_tokens"] < 5000


def test_an_engine_abort_is_an_error_not_a_finished_answer(any_stack: RunningStack) -> None:
    """An engine that gives up on a generation itself, a dozen tokens in (vLLM's finish reason
    ``abort``, SGLang's abort finish), has cut the answer short: Chat Completions answers an
    error, whole or streamed, and never a choice finished with ``stop``; a response fails (no
    incomplete reason names it: it was a 500 when the run called it "interrupted"), and the
    Messages API answers an error too."""
    content = f"Tell me everything {uuid.uuid4().hex[:8]} [[sim:abort_after=12]]"
    messages: list[Any] = [{"role": "user", "content": content}]
    client = any_stack.client()
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model=MODEL, messages=messages)
    assert err.value.status_code >= 500  # the engine's doing, not the caller's
    assert err.value.response.json()["error"]["type"] == "server_error"
    with any_stack.http() as http:
        resp = http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "stream": True})
    assert resp.status_code == 200
    data = [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: {")]
    finishes = [c["finish_reason"] for chunk in data for c in chunk.get("choices") or ()]
    assert "stop" not in finishes and "length" not in finishes, finishes
    assert "error" in data[-1] and data[-1]["error"]["message"], data[-1]
    response = client.responses.create(model=MODEL, input=content)  # no incomplete reason fits
    assert response.status == "failed" and response.error is not None, response
    assert response.error.code == "server_error" and response.error.message
    with any_stack.http() as http:
        answer = http.post(
            "/v1/messages",
            json={"model": MODEL, "max_tokens": 200, "messages": messages},
            headers={"anthropic-version": "2023-06-01"},
        )
    assert answer.status_code >= 500 and answer.json()["type"] == "error", answer.text


def test_engine_down_is_a_clear_error(stacks: Stacks) -> None:
    down = stacks.get("engine-down")
    client = down.client()
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code in (502, 503)
    body = err.value.response.json()
    assert body["error"]["message"] and body["error"]["type"] == "server_error"
    with pytest.raises(openai.APIStatusError) as err2:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True)
    assert err2.value.status_code in (502, 503)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL}, "messages"),
        ({"model": MODEL, "messages": []}, "messages"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "logprobs": True}, "logprobs"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "bogus": 1}, "bogus"),
        ({"model": MODEL, "messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": 9}, "temperature"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, "tool_choice"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0]",
        ),
    ],
)
def test_bad_requests_get_openai_errors(stack: RunningStack, body: dict[str, Any], param: str) -> None:
    with stack.http() as http:
        resp = http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"]


def test_bad_json_and_unknown_model(stack: RunningStack) -> None:
    with stack.http() as http:
        resp = http.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
        assert resp.status_code == 400 and "JSON" in resp.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError) as err:
        stack.client().chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert err.value.response.json()["error"]["param"] == "model"


def test_unknown_route_is_openai_shaped(stack: RunningStack) -> None:
    resp = httpx.get(f"{stack.base_url}/v1/nothing-here")
    assert resp.status_code == 404 and "error" in resp.json()


def test_penalties_reach_the_engine(stacks: Stacks) -> None:
    for name in ("vllm", "sglang"):
        stack = stacks.get(name)
        client = stack.client()
        resp = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], presence_penalty=0.5, frequency_penalty=-1.25
        )

        def this_request(r: EngineRecord, rid: str = resp.id) -> bool:
            return bool(r.get("request_id") == rid)

        record = stack.wait_engine(this_request)
        params = record["params"] if name == "vllm" else record["params"]["sampling_params"]
        assert (params["presence_penalty"], params["frequency_penalty"]) == (0.5, -1.25), params
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], presence_penalty=2.5
            )
        assert isinstance(err.value.body, dict) and err.value.body["param"] == "presence_penalty"


def test_a_schema_no_answer_can_satisfy_is_a_400_before_any_work(stack: RunningStack) -> None:
    marker = f"unsatisfiable-{uuid.uuid4().hex[:8]}"
    fmt: ResponseFormatJSONSchema = {
        "type": "json_schema",
        "json_schema": {
            "name": "x",
            "schema": {
                "type": "object",
                "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 1}},
                "required": ["a"],
            },
        },
    }
    with pytest.raises(openai.BadRequestError) as err:
        stack.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": marker}], response_format=fmt
        )
    assert "minimum 5 above maximum 1" in err.value.message
    assert not [r for r in stack.engine_requests() if marker in r.get("prompt_text", "")]


@pytest.mark.parametrize("choice", ["required", "named"])
def test_a_forced_tool_call_is_a_call_even_where_the_model_would_answer(any_stack: RunningStack, choice: str) -> None:
    """After a tool result the model wants to answer; ``tool_choice`` required (or naming the
    function) must still give a call, never call syntax inside an answer. The simulated engine
    generates through the grammar Chorus sends, as vLLM and SGLang do."""
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "What is the weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Snow, -3C"},
    ]
    tool_choice: Any = "required" if choice == "required" else {"type": "function", "function": {"name": "get_weather"}}
    answer = any_stack.client().chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER_TOOL], tool_choice=tool_choice
    )
    choice_0 = answer.choices[0]
    assert choice_0.finish_reason == "tool_calls", choice_0
    (call,) = choice_0.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    assert "to=functions" not in (choice_0.message.content or "")
