"""The Responses API end to end: `chorus up` over real NATS + Redis, the official openai client."""

from __future__ import annotations

import json
from typing import cast

import openai
import pytest
from openai.types.responses import (
    FunctionToolParam,
    ResponseInputItemParam,
    ResponseInputText,
    ResponseItem,
    ResponseOutputItem,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
)
from openai.types.responses.response_input_param import FunctionCallOutput

from tests.e2e.conftest import MODEL, RunningStack

# without ``strict``, as clients send it (openai-python's type requires the key)
WEATHER = cast(
    FunctionToolParam,
    {
        "type": "function",
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
)


def _types(output: list[ResponseOutputItem]) -> list[str]:
    return [item.type for item in output]


def _text(item: ResponseItem) -> str:
    """The text of a message item's first part."""
    assert item.type == "message", item
    part = item.content[0]
    assert isinstance(part, ResponseInputText | ResponseOutputText), part
    return part.text


def test_plain_response(stack: RunningStack) -> None:
    client = stack.client()
    resp = client.responses.create(model=MODEL, input="Say hello to Chorus")
    assert resp.status == "completed"
    assert resp.id.startswith("resp_")
    assert _types(resp.output) == ["reasoning", "message"]
    reasoning = resp.output[0]
    assert reasoning.type == "reasoning" and reasoning.content
    assert reasoning.content[0].type == "reasoning_text" and reasoning.content[0].text
    assert resp.output_text and "<|" not in resp.output_text
    assert resp.usage is not None
    assert resp.usage.input_tokens > 0 and resp.usage.output_tokens > 0
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    assert resp.usage.output_tokens_details.reasoning_tokens > 0
    again = client.responses.retrieve(resp.id)
    assert again.model_dump() == resp.model_dump()


def test_streamed_events_and_bookkeeping(stack: RunningStack) -> None:
    client = stack.client()
    events = list(client.responses.create(model=MODEL, input="Stream please", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    for needed in (
        "response.output_item.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ):
        assert needed in kinds, needed
    added = [e.output_index for e in events if e.type == "response.output_item.added"]
    done = [e.output_index for e in events if e.type == "response.output_item.done"]
    assert added == done == list(range(len(added)))
    completed = events[-1]
    assert completed.type == "response.completed"
    final = completed.response
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.output_text == text
    # the streamed ids are the stored ids
    stored = client.responses.retrieve(final.id)
    assert [i.id for i in stored.output] == [e.item.id for e in events if e.type == "response.output_item.done"]


def test_stream_helper_runs_clean(stack: RunningStack) -> None:
    client = stack.client()
    with client.responses.stream(model=MODEL, input="What is the weather in Rome?", tools=[WEATHER]) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    calls = [i for i in final.output if i.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and json.loads(calls[0].arguments)["city"]


def test_function_tool_round_trip_with_previous_response_id(stack: RunningStack) -> None:
    client = stack.client()
    first = client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=[WEATHER])
    (call,) = [i for i in first.output if i.type == "function_call"]
    assert call.call_id.startswith("call_")
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        tools=[WEATHER],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Cloudy, 17 C"}],
    )
    assert second.status == "completed"
    assert "Cloudy, 17 C" in second.output_text


def test_multi_turn_chain_reaches_the_engine(stack: RunningStack) -> None:
    client = stack.client()
    r1 = client.responses.create(model=MODEL, input="My name is Ada and I like zebras.")
    r2 = client.responses.create(model=MODEL, input="What animal do I like?", previous_response_id=r1.id)
    r3 = client.responses.create(
        model=MODEL, input="And my name?", previous_response_id=r2.id, instructions="Answer in one word."
    )
    prompt = stack.engine_prompt(r3.id)
    assert "My name is Ada and I like zebras." in prompt
    assert "What animal do I like?" in prompt and "And my name?" in prompt
    assert r1.output_text in prompt and r2.output_text in prompt
    assert "Answer in one word." in prompt
    r4 = client.responses.create(model=MODEL, input="Anything else?", previous_response_id=r3.id)
    assert "Answer in one word." not in stack.engine_prompt(r4.id)  # instructions are not inherited


def test_stateless_history_matches_previous_response_id(stack: RunningStack) -> None:
    client = stack.client()
    first = client.responses.create(model=MODEL, input="What is the weather in Oslo?", tools=[WEATHER])
    call = next(i for i in first.output if i.type == "function_call")
    output_item: FunctionCallOutput = {"type": "function_call_output", "call_id": call.call_id, "output": "Snow"}
    chained = client.responses.create(model=MODEL, previous_response_id=first.id, tools=[WEATHER], input=[output_item])
    history: list[ResponseInputItemParam] = [{"role": "user", "content": "What is the weather in Oslo?"}]
    # each output item, dumped, is the input item that replays it
    history += [cast(ResponseInputItemParam, i.model_dump(exclude_none=True)) for i in first.output]
    stateless = client.responses.create(model=MODEL, tools=[WEATHER], input=[*history, output_item], store=False)
    assert stack.engine_prompt(chained.id) == stack.engine_prompt(stateless.id)


def test_store_false_and_delete(stack: RunningStack) -> None:
    client = stack.client()
    unstored = client.responses.create(model=MODEL, input="forget me", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="hi", previous_response_id=unstored.id)
    stored = client.responses.create(model=MODEL, input="delete me")
    client.responses.delete(stored.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(stored.id)
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model=MODEL, input="hi", previous_response_id=stored.id)
    assert stored.id in err.value.response.json()["error"]["message"]


def test_input_items_pagination(stack: RunningStack) -> None:
    client = stack.client()
    resp = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "one"},
            {"role": "user", "content": "two"},
            {"role": "user", "content": "three"},
        ],
    )
    page = client.responses.input_items.list(resp.id, limit=2, order="asc")
    assert len(page.data) == 2 and page.has_more
    rest = client.responses.input_items.list(resp.id, limit=2, order="asc", after=page.data[-1].id)
    texts = [_text(i) for i in [*page.data, *rest.data]]
    assert texts == ["one", "two", "three"]


def test_max_output_tokens_is_incomplete(stack: RunningStack) -> None:
    client = stack.client()
    resp = client.responses.create(model=MODEL, input="A long story please", max_output_tokens=16)
    assert resp.status == "incomplete"
    assert resp.incomplete_details is not None and resp.incomplete_details.reason == "max_output_tokens"
    last = resp.output[-1] if resp.output else None
    assert isinstance(last, ResponseReasoningItem | ResponseOutputMessage) and last.status == "incomplete"
    events = list(client.responses.create(model=MODEL, input="A long story please", max_output_tokens=16, stream=True))
    incomplete = events[-1]
    assert incomplete.type == "response.incomplete"
    assert incomplete.response.incomplete_details is not None
    assert incomplete.response.incomplete_details.reason == "max_output_tokens"


def test_background_cancel_and_resume(stack: RunningStack) -> None:
    client = stack.client()
    slow = "Take your time [[sim:tokens=4000]] [[sim:delay_ms=5]]"
    resp = client.responses.create(model=MODEL, input=slow, background=True)
    assert resp.status in ("queued", "in_progress")
    # attach to the running stream, read a little, then resume after the last seen event
    seen = []
    with client.responses.retrieve(resp.id, stream=True) as stream:
        for event in stream:
            seen.append(event)
            if len(seen) >= 5:
                break
    resumed = client.responses.retrieve(resp.id, stream=True, starting_after=seen[-1].sequence_number)
    first_resumed = next(iter(resumed))
    assert first_resumed.sequence_number == seen[-1].sequence_number + 1
    resumed.close()
    cancelled = client.responses.cancel(resp.id)
    assert cancelled.status == "cancelled"
    stack.wait_engine(lambda r: resp.id in (r.get("request_id") or "") and r.get("aborted"))
    assert client.responses.retrieve(resp.id).status == "cancelled"


def test_background_completes_and_replays(stack: RunningStack) -> None:
    client = stack.client()
    resp = client.responses.create(model=MODEL, input="quick one", background=True)
    events = list(client.responses.retrieve(resp.id, stream=True))
    assert events[-1].type == "response.completed"
    assert client.responses.retrieve(resp.id).status == "completed"
    replay = list(client.responses.retrieve(resp.id, stream=True, starting_after=2))
    assert [e.sequence_number for e in replay] == [e.sequence_number for e in events if e.sequence_number > 2]


def test_conversations(stack: RunningStack) -> None:
    client = stack.client()
    conv = client.conversations.create(items=[{"type": "message", "role": "user", "content": "I live in Lima."}])
    r1 = client.responses.create(model=MODEL, input="Where do I live?", conversation=conv.id)
    assert "I live in Lima." in stack.engine_prompt(r1.id)
    r2 = client.responses.create(model=MODEL, input="And the weather?", conversation=conv.id)
    prompt = stack.engine_prompt(r2.id)
    assert "Where do I live?" in prompt and r1.output_text in prompt
    items = client.conversations.items.list(conv.id)
    assert len(items.data) >= 5
    assert client.conversations.retrieve(conv.id).id == conv.id
    client.conversations.delete(conv.id)
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conv.id)


def test_bad_requests(stack: RunningStack) -> None:
    with stack.http() as http:
        r = http.post("/v1/responses", json={"model": MODEL, "input": "x", "frobnicate": True})
        assert r.status_code == 400 and r.json()["error"]["param"] == "frobnicate"
        r = http.post("/v1/responses", json={"model": MODEL, "input": "x", "previous_response_id": "resp_nope"})
        assert r.status_code == 404 and "resp_nope" in r.json()["error"]["message"]
        r = http.post("/v1/responses", json={"model": "nope", "input": "x"})
        assert r.status_code == 404 and r.json()["error"]["param"] == "model"


def test_gateway_restart_between_turns(stack: RunningStack) -> None:
    """Turn 1 through one gateway process, turn 2 through a new one: state lives in Redis."""

    proc, url = stack.start_gateway("gateway-turn")
    try:
        first = openai.OpenAI(base_url=url, api_key="x", max_retries=0).responses.create(
            model=MODEL, input="Remember the word pelican."
        )
    finally:
        proc.stop()
    proc, url = stack.start_gateway("gateway-turn")
    try:
        second = openai.OpenAI(base_url=url, api_key="x", max_retries=0).responses.create(
            model=MODEL, input="Which word?", previous_response_id=first.id
        )
    finally:
        proc.stop()
    assert second.status == "completed"
    assert "Remember the word pelican." in stack.engine_prompt(second.id)


def test_openai_agents_framework(stack: RunningStack) -> None:
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        calls.append(city)
        return f"Warm and dry in {city}"

    async def run() -> tuple[str, str]:
        client = stack.async_client()
        agent = Agent(
            name="weather",
            instructions="Use tools.",
            tools=[get_weather],
            model=OpenAIResponsesModel(model=MODEL, openai_client=client),
        )
        plain = await Runner.run(agent, "What is the weather in Lisbon?")
        streamed = Runner.run_streamed(agent, "What is the weather in Porto?")
        async for _ in streamed.stream_events():
            pass
        return str(plain.final_output), str(streamed.final_output)

    import asyncio

    plain, streamed = asyncio.run(run())
    assert len(calls) == 2
    assert "Warm and dry in" in plain and "Warm and dry in" in streamed
