"""Compatibility, continued (test_clients.py has the rest and says what each test covers): the
frameworks people build agents with, LangChain (langchain-openai), pydantic-ai and LiteLLM, each
driven end to end against `chorus up` (real services over NATS + Redis, the simulated engine).

Clients are imported inside fixtures: several take seconds to import, and the default test run
collects this module. litellm fetches a price list from the internet at import unless told not
to: it is kept on loopback."""

from __future__ import annotations

import importlib
import json
import os
from types import ModuleType
from typing import Any

import pytest

from tests.e2e.client_scenario import (
    CHAT_WEATHER,
    CITY_PROMPT,
    MINIMAL_CITY,
    RAW_JSON,
    RESPONSES_WEATHER,
    TOOL_CITY,
    City,
    answered,
    get_weather,
    reasoning_carried,
    weather_question,
)
from tests.e2e.conftest import MODEL, RunningStack

pytestmark = pytest.mark.slow


# ------------------------------------------------------------------------- langchain-openai


@pytest.fixture(scope="module")
def langchain() -> ModuleType:
    return importlib.import_module("langchain_openai")


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_langchain(stack: RunningStack, langchain: ModuleType, api: str) -> None:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool

    responses = api == "responses"
    reasoning = {"reasoning": {"effort": "low", "summary": "auto"}} if responses else {"reasoning_effort": "low"}
    llm = langchain.ChatOpenAI(
        model=MODEL,
        base_url=f"{stack.base_url}/v1",
        api_key="chorus",
        max_retries=0,
        use_responses_api=responses,
        **reasoning,
    )

    plain = llm.invoke("Say hello")
    assert plain.text == "Hello! You said: Say hello"
    chunks = list(llm.stream("Stream hello"))
    streamed: AIMessage = sum(chunks[1:], chunks[0])
    assert len(chunks) > 2 and streamed.text == "Hello! You said: Stream hello"
    thoughts = [b for m in (plain, streamed) for b in m.content_blocks if b["type"] == "reasoning"]
    if responses:  # Chat Completions' reasoning_content is not read by ChatOpenAI (see docs/clients.md)
        assert len(thoughts) == 2 and all(b.get("reasoning") for b in thoughts)

    city = "Lyon" if responses else "Nice"
    bound = llm.bind_tools([tool(get_weather)])
    messages: list[Any] = [HumanMessage(weather_question(city))]
    first = bound.invoke(messages)
    assert first.tool_calls and first.tool_calls[0]["args"] == {"city": city}
    messages += [first, ToolMessage(get_weather(**first.tool_calls[0]["args"]), tool_call_id=first.tool_calls[0]["id"])]
    assert bound.invoke(messages).text == answered(city)
    assert reasoning_carried(stack, city) is responses

    if responses:  # stateless, as Codex works: the reasoning goes back encrypted
        stateless = langchain.ChatOpenAI(
            model=MODEL,
            base_url=f"{stack.base_url}/v1",
            api_key="chorus",
            max_retries=0,
            use_responses_api=True,
            store=False,
            include=["reasoning.encrypted_content"],
        ).bind_tools([tool(get_weather)])
        messages = [HumanMessage(weather_question("Graz"))]
        first = stateless.invoke(messages)
        messages += [first, ToolMessage(get_weather("Graz"), tool_call_id=first.tool_calls[0]["id"])]
        assert stateless.invoke(messages).text == answered("Graz")
        assert reasoning_carried(stack, "Graz")

    assert llm.with_structured_output(City, method="json_schema").invoke(CITY_PROMPT) == MINIMAL_CITY
    assert llm.with_structured_output(City, method="function_calling").invoke(CITY_PROMPT) == TOOL_CITY
    if not responses:  # json_mode is a Chat Completions response_format
        mode = llm.with_structured_output(City, method="json_mode")
        assert mode.invoke(f"{CITY_PROMPT} Answer in JSON. {RAW_JSON}") == City(name="Tokyo", population=37000000)


# ------------------------------------------------------------------------------ pydantic-ai


@pytest.fixture(scope="module")
def pydantic_ai() -> ModuleType:
    importlib.import_module("pydantic_ai.models.openai")
    importlib.import_module("pydantic_ai.providers.openai")
    return importlib.import_module("pydantic_ai")


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_pydantic_ai(stack: RunningStack, pydantic_ai: ModuleType, api: str) -> None:
    from pydantic_ai.messages import ThinkingPart
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel, OpenAIResponsesModelSettings
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(openai_client=stack.async_client())
    if api == "chat":
        model: Any = OpenAIChatModel(MODEL, provider=provider)
        settings: Any = None
    else:
        model = OpenAIResponsesModel(MODEL, provider=provider)
        settings = OpenAIResponsesModelSettings(openai_reasoning_summary="detailed", openai_reasoning_effort="low")
    agent = pydantic_ai.Agent(model, model_settings=settings)

    result = await agent.run("Say hello")
    assert result.output == "Hello! You said: Say hello"
    thinking = [p for m in result.all_messages() for p in getattr(m, "parts", []) if isinstance(p, ThinkingPart)]
    assert len(thinking) == 1 and thinking[0].content
    async with agent.run_stream("Stream hello") as run:
        assert "".join([d async for d in run.stream_text(delta=True)]) == "Hello! You said: Stream hello"

    agent.tool_plain(get_weather)
    city = "Kyoto" if api == "chat" else "Osaka"
    result = await agent.run(weather_question(city))
    assert result.output == answered(city)
    carried = reasoning_carried(stack, city)
    async with agent.run_stream(weather_question("Porto")) as run:
        assert await run.get_output() == answered("Porto")
    if api == "responses":  # stateless: the reasoning goes back encrypted
        stateless = OpenAIResponsesModelSettings(openai_store=False, openai_reasoning_summary="auto")
        result = await agent.run(weather_question("Split"), model_settings=stateless)
        assert result.output == answered("Split") and reasoning_carried(stack, "Split")

    assert (await pydantic_ai.Agent(model, output_type=City).run(CITY_PROMPT)).output == TOOL_CITY
    native = pydantic_ai.Agent(model, output_type=pydantic_ai.NativeOutput(City))
    assert (await native.run(CITY_PROMPT)).output == MINIMAL_CITY
    async with native.run_stream(CITY_PROMPT) as run:
        assert [o async for o in run.stream_output()][-1] == MINIMAL_CITY
    assert carried


# ---------------------------------------------------------------------------------- litellm


@pytest.fixture(scope="module")
def litellm() -> ModuleType:
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # else it downloads a price list at import
    return importlib.import_module("litellm")


def test_litellm_chat(stack: RunningStack, litellm: ModuleType) -> None:
    target = {"model": f"openai/{MODEL}", "api_base": f"{stack.base_url}/v1", "api_key": "chorus"}
    plain = litellm.completion(
        messages=[{"role": "user", "content": "Say hello"}],
        reasoning_effort="low",
        allowed_openai_params=["reasoning_effort"],
        **target,
    )
    assert plain.choices[0].message.content == "Hello! You said: Say hello"
    assert plain.choices[0].message.reasoning_content
    chunks = list(litellm.completion(messages=[{"role": "user", "content": "Stream hello"}], stream=True, **target))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello! You said: Stream hello"

    messages: list[Any] = [{"role": "user", "content": weather_question("Cairo")}]
    streamed = litellm.stream_chunk_builder(
        list(litellm.completion(messages=messages, tools=[CHAT_WEATHER], stream=True, **target))
    )
    (call,) = streamed.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "Cairo"}
    first = litellm.completion(messages=messages, tools=[CHAT_WEATHER], **target)
    (call,) = first.choices[0].message.tool_calls
    messages += [
        first.choices[0].message.model_dump(),
        {"role": "tool", "tool_call_id": call.id, "content": get_weather("Cairo")},
    ]
    final = litellm.completion(messages=messages, tools=[CHAT_WEATHER], **target)
    assert final.choices[0].message.content == answered("Cairo")
    assert reasoning_carried(stack, "Cairo")

    structured = litellm.completion(messages=[{"role": "user", "content": CITY_PROMPT}], response_format=City, **target)
    assert City.model_validate_json(structured.choices[0].message.content) == MINIMAL_CITY


def test_litellm_responses(stack: RunningStack, litellm: ModuleType) -> None:
    target = {"model": f"openai/{MODEL}", "api_base": f"{stack.base_url}/v1", "api_key": "chorus"}
    plain = litellm.responses(input="Say hello", reasoning={"effort": "low", "summary": "auto"}, **target)
    assert [item.type for item in plain.output] == ["reasoning", "message"]
    assert plain.output[1].content[0].text == "Hello! You said: Say hello"
    events = list(litellm.responses(input="Stream hello", stream=True, **target))
    assert (
        "".join(getattr(e, "delta", "") for e in events if e.type == "response.output_text.delta")
        == "Hello! You said: Stream hello"
    )

    first = litellm.responses(input=weather_question("Hanoi"), tools=[RESPONSES_WEATHER], **target)
    (call,) = [item for item in first.output if item.type == "function_call"]
    final = litellm.responses(
        previous_response_id=first.id,
        tools=[RESPONSES_WEATHER],
        **target,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": get_weather("Hanoi")}],
    )
    assert final.output[-1].content[0].text == answered("Hanoi")
    assert reasoning_carried(stack, "Hanoi")
