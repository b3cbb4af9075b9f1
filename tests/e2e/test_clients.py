"""Compatibility: the Python clients people point at an OpenAI-compatible server, each driven end
to end against `chorus up` (real services over NATS + Redis, the simulated engine).

For each client, on Chat Completions and on Responses where it speaks both: a plain answer, a
streamed one, a tool-calling loop (the client runs the tool and sends its result back),
structured output, and the model's reasoning where the client shows it. docs/clients.md is
written from these tests.

The simulated model (services/simengine/script.py) calls a declared tool when the user's
message is last, answers "According to TOOL: OUTPUT" after a tool result, and follows a JSON
schema (a grammar or the prompt's "# Response Formats") with a minimal conforming value.

Clients are imported inside fixtures: several take seconds to import, and the default test run
collects this module. litellm fetches a price list from the internet at import unless told not
to; openai-agents exports traces to OpenAI unless tracing is off; both are kept on loopback."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from openai.types.shared import Reasoning
from pydantic import BaseModel

from tests.e2e.conftest import MODEL, RunningStack

pytestmark = pytest.mark.slow

INSTRUCTOR_VERSION = "1.17.0"
CACHE = Path(os.environ.get("CHORUS_TEST_CACHE", Path.home() / ".cache" / "chorus-tests"))

WEATHER_PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}},
                      "required": ["city"], "additionalProperties": False}
CHAT_WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city",
                                                 "parameters": WEATHER_PARAMETERS}}
RESPONSES_WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather for a city",
                     "parameters": WEATHER_PARAMETERS}
# What the simulated model thinks before calling the tool the user names (its analysis).
CALL_THOUGHT = "I should call get_weather."
# The simulated model fills a tool's string argument with the user's quoted phrase.
CITY_PROMPT = 'The largest city is "Tokyo". Give its name and population.'
# A JSON answer written out, for clients whose JSON mode describes the schema only in prose.
RAW_JSON = '[[sim:raw=<|channel|>final<|message|>{"name": "Tokyo", "population": 37000000}<|return|>]]'


class City(BaseModel):
    name: str
    population: int


MINIMAL_CITY = City(name="", population=0)  # what a schema-following grammar makes the model say
TOOL_CITY = City(name="Tokyo", population=1)  # a tool call's arguments, synthesized from the prompt


def get_weather(city: str) -> str:
    """Current weather for a city."""
    return f"Sunny in {city}, 21 C"


def weather_question(city: str) -> str:
    return f"What is the weather in {city}?"


def answered(city: str) -> str:
    """The simulated model's final answer after get_weather(city) ran."""
    return f"According to get_weather: {get_weather(city)}"


def prompts_with(stack: RunningStack, marker: str) -> list[str]:
    """The prompts of the engine's generations whose text contains ``marker``, oldest first."""
    return [r["prompt_text"] for r in stack.engine_requests() if marker in (r.get("prompt_text") or "")]


def reasoning_carried(stack: RunningStack, city: str) -> bool:
    """Whether the generation after the tool result saw the model's thought before the call:
    gpt-oss keeps its analysis between a call and its result, and a client that drops it
    (instead of sending it back) makes the model work without it."""
    prompts = prompts_with(stack, weather_question(city))
    assert len(prompts) >= 2, "the tool loop never reached a second generation"
    return CALL_THOUGHT in prompts[-1]


# ---------------------------------------------------------------------------------- openai


def test_openai_chat(stack: RunningStack) -> None:
    client = stack.client()
    plain = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello"}])
    assert plain.choices[0].message.content == "Hello! You said: Say hello"
    assert (plain.choices[0].message.model_extra or {})["reasoning_content"]

    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Stream hello"}], stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    thought = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
                      for c in chunks if c.choices)
    assert text == "Hello! You said: Stream hello" and thought
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0

    messages: list[Any] = [{"role": "user", "content": weather_question("Paris")}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[CHAT_WEATHER])
    (call,) = first.choices[0].message.tool_calls or []
    assert first.choices[0].finish_reason == "tool_calls"
    messages += [first.choices[0].message,  # the SDK's own message object, as the cookbook does
                 {"role": "tool", "tool_call_id": call.id, "content": get_weather(**json.loads(call.function.arguments))}]
    final = client.chat.completions.create(model=MODEL, messages=messages, tools=[CHAT_WEATHER])
    assert final.choices[0].message.content == answered("Paris")
    assert reasoning_carried(stack, "Paris")

    parsed = client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": CITY_PROMPT}],
                                           response_format=City)
    assert parsed.choices[0].message.parsed == MINIMAL_CITY
    with client.chat.completions.stream(model=MODEL, messages=[{"role": "user", "content": CITY_PROMPT}],
                                        response_format=City) as stream:
        for _ in stream:
            pass
        assert stream.get_final_completion().choices[0].message.parsed == MINIMAL_CITY


def test_openai_responses(stack: RunningStack) -> None:
    client = stack.client()
    plain = client.responses.create(model=MODEL, input="Say hello", reasoning={"summary": "auto"})
    assert plain.output_text == "Hello! You said: Say hello"
    (reasoning,) = [item for item in plain.output if item.type == "reasoning"]
    assert reasoning.summary and reasoning.summary[0].text

    with client.responses.stream(model=MODEL, input="Stream hello", reasoning={"summary": "auto"}) as stream:
        kinds = [event.type for event in stream]
        assert stream.get_final_response().output_text == "Hello! You said: Stream hello"
    assert "response.output_text.delta" in kinds and "response.reasoning_summary_text.delta" in kinds

    # chained with previous_response_id
    first = client.responses.create(model=MODEL, input=weather_question("Lima"), tools=[RESPONSES_WEATHER])
    (call,) = [item for item in first.output if item.type == "function_call"]
    output = get_weather(**json.loads(call.arguments))
    final = client.responses.create(model=MODEL, previous_response_id=first.id, tools=[RESPONSES_WEATHER],
                                    input=[{"type": "function_call_output", "call_id": call.call_id, "output": output}])
    assert final.output_text == answered("Lima")
    assert reasoning_carried(stack, "Lima")

    # stateless: the output sent back, the reasoning encrypted
    history: list[Any] = [{"role": "user", "content": weather_question("Oslo")}]
    first = client.responses.create(model=MODEL, input=history, tools=[RESPONSES_WEATHER], store=False,
                                    include=["reasoning.encrypted_content"])
    (call,) = [item for item in first.output if item.type == "function_call"]
    history += [item.model_dump(exclude_none=True) for item in first.output]
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": get_weather("Oslo")})
    final = client.responses.create(model=MODEL, input=history, tools=[RESPONSES_WEATHER], store=False,
                                    include=["reasoning.encrypted_content"])
    assert final.output_text == answered("Oslo")
    assert reasoning_carried(stack, "Oslo")

    parsed = client.responses.parse(model=MODEL, input=CITY_PROMPT, text_format=City)
    assert parsed.output_parsed == MINIMAL_CITY
    with client.responses.stream(model=MODEL, input=CITY_PROMPT, text_format=City) as stream:
        for _ in stream:
            pass
        assert stream.get_final_response().output_parsed == MINIMAL_CITY


async def test_openai_async(stack: RunningStack) -> None:
    client = stack.async_client()
    chat = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello"}],
                                                stream=True)
    assert "".join([c.choices[0].delta.content or "" async for c in chat if c.choices]) == "Hello! You said: Say hello"
    events = await client.responses.create(model=MODEL, input="Say hello", stream=True)
    texts = [e.response.output_text async for e in events if e.type == "response.completed"]
    assert texts == ["Hello! You said: Say hello"]

    messages: list[Any] = [{"role": "user", "content": weather_question("Quito")}]
    first = await client.chat.completions.create(model=MODEL, messages=messages, tools=[CHAT_WEATHER])
    (call,) = first.choices[0].message.tool_calls or []
    messages += [first.choices[0].message, {"role": "tool", "tool_call_id": call.id, "content": get_weather("Quito")}]
    final = await client.chat.completions.create(model=MODEL, messages=messages, tools=[CHAT_WEATHER])
    assert final.choices[0].message.content == answered("Quito")

    parsed = await client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": CITY_PROMPT}],
                                                 response_format=City)
    assert parsed.choices[0].message.parsed == MINIMAL_CITY
    rparsed = await client.responses.parse(model=MODEL, input=CITY_PROMPT, text_format=City)
    assert rparsed.output_parsed == MINIMAL_CITY


# --------------------------------------------------------------------------- openai-agents


@pytest.fixture(scope="module")
def agents() -> ModuleType:
    return importlib.import_module("agents")


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_openai_agents(stack: RunningStack, agents: ModuleType, api: str) -> None:
    if api == "chat":  # without the hook, the SDK sends reasoning back to DeepSeek models only
        model = agents.OpenAIChatCompletionsModel(model=MODEL, openai_client=stack.async_client(),
                                                  should_replay_reasoning_content=lambda _: True)
    else:
        model = agents.OpenAIResponsesModel(model=MODEL, openai_client=stack.async_client())
    config = agents.RunConfig(tracing_disabled=True)  # traces would go to OpenAI
    settings = agents.ModelSettings(reasoning=Reasoning(effort="low", summary="auto"))
    calls: list[str] = []

    @agents.function_tool(name_override="get_weather")
    def weather(city: str) -> str:
        """Current weather for a city."""
        calls.append(city)
        return get_weather(city)

    agent = agents.Agent(name="forecaster", instructions="Answer briefly.", model=model, tools=[weather],
                         model_settings=settings)
    city = "Bern" if api == "chat" else "Rome"
    result = await agents.Runner.run(agent, weather_question(city), run_config=config)
    assert result.final_output == answered(city)
    assert calls == [city]
    assert reasoning_carried(stack, city)
    kinds = [type(item).__name__ for item in result.new_items]
    assert kinds == ["ReasoningItem", "ToolCallItem", "ToolCallOutputItem", "ReasoningItem", "MessageOutputItem"]

    streamed = agents.Runner.run_streamed(agent, weather_question("Bonn"), run_config=config)
    deltas = [e async for e in streamed.stream_events() if e.type == "raw_response_event"]
    assert deltas and streamed.final_output == answered("Bonn")

    structured = agents.Agent(name="geographer", model=model, output_type=City)
    result = await agents.Runner.run(structured, CITY_PROMPT, run_config=config)
    assert result.final_output == MINIMAL_CITY


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
    llm = langchain.ChatOpenAI(model=MODEL, base_url=f"{stack.base_url}/v1", api_key="chorus", max_retries=0,
                               use_responses_api=responses, **reasoning)

    plain = llm.invoke("Say hello")
    assert plain.text == "Hello! You said: Say hello"
    chunks = list(llm.stream("Stream hello"))
    streamed: AIMessage = sum(chunks[1:], chunks[0])  # type: ignore[assignment]
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
        stateless = langchain.ChatOpenAI(model=MODEL, base_url=f"{stack.base_url}/v1", api_key="chorus",
                                         max_retries=0, use_responses_api=True, store=False,
                                         include=["reasoning.encrypted_content"]).bind_tools([tool(get_weather)])
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
    from pydantic_ai.models.openai import (
        OpenAIChatModel,
        OpenAIResponsesModel,
        OpenAIResponsesModelSettings,
    )
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
    plain = litellm.completion(messages=[{"role": "user", "content": "Say hello"}], reasoning_effort="low",
                               allowed_openai_params=["reasoning_effort"], **target)
    assert plain.choices[0].message.content == "Hello! You said: Say hello"
    assert plain.choices[0].message.reasoning_content
    chunks = list(litellm.completion(messages=[{"role": "user", "content": "Stream hello"}], stream=True, **target))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello! You said: Stream hello"

    messages: list[Any] = [{"role": "user", "content": weather_question("Cairo")}]
    streamed = litellm.stream_chunk_builder(list(litellm.completion(messages=messages, tools=[CHAT_WEATHER],
                                                                    stream=True, **target)))
    (call,) = streamed.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "Cairo"}
    first = litellm.completion(messages=messages, tools=[CHAT_WEATHER], **target)
    (call,) = first.choices[0].message.tool_calls
    messages += [first.choices[0].message.model_dump(),
                 {"role": "tool", "tool_call_id": call.id, "content": get_weather("Cairo")}]
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
    assert "".join(getattr(e, "delta", "") for e in events if e.type == "response.output_text.delta") \
        == "Hello! You said: Stream hello"

    first = litellm.responses(input=weather_question("Hanoi"), tools=[RESPONSES_WEATHER], **target)
    (call,) = [item for item in first.output if item.type == "function_call"]
    final = litellm.responses(previous_response_id=first.id, tools=[RESPONSES_WEATHER], **target,
                              input=[{"type": "function_call_output", "call_id": call.call_id,
                                      "output": get_weather("Hanoi")}])
    assert final.output[-1].content[0].text == answered("Hanoi")
    assert reasoning_carried(stack, "Hanoi")


# ------------------------------------------------------------------------------- instructor


@pytest.fixture(scope="module")
def instructor() -> ModuleType:
    """instructor caps jiter below 0.15, which openai >= 3.31 cannot meet, so pip cannot install
    it beside the openai this project uses: it is installed on its own (without its pins) into a
    cache directory, once, and imported from there. Its other requirements are already here."""
    try:
        return importlib.import_module("instructor")
    except ImportError:
        pass
    target = CACHE / f"instructor-{INSTRUCTOR_VERSION}"
    if not (target / "instructor").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                        f"instructor=={INSTRUCTOR_VERSION}", "docstring-parser>=0.16,<1"], check=True, timeout=300)
    sys.path.append(str(target))
    return importlib.import_module("instructor")


@pytest.mark.parametrize(("mode", "expected"), [
    ("JSON", City(name="Tokyo", population=37000000)),  # the schema is in the prompt, the JSON scripted
    ("JSON_SCHEMA", MINIMAL_CITY),
    ("TOOLS", TOOL_CITY),
    ("TOOLS_STRICT", TOOL_CITY),
    ("RESPONSES_TOOLS", TOOL_CITY),
])
def test_instructor(stack: RunningStack, instructor: ModuleType, mode: str, expected: City) -> None:
    client = instructor.from_openai(stack.client(), mode=getattr(instructor.Mode, mode))
    prompt = f"{CITY_PROMPT} {RAW_JSON}" if mode == "JSON" else CITY_PROMPT
    if mode.startswith("RESPONSES"):
        city = client.responses.create(model=MODEL, input=prompt, response_model=City, max_retries=0)
    else:
        city = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                              response_model=City, max_retries=0)
    assert isinstance(city, City) and city.model_dump() == expected.model_dump()


async def test_instructor_partial_stream(stack: RunningStack, instructor: ModuleType) -> None:
    client = instructor.from_openai(stack.async_client(), mode=instructor.Mode.TOOLS)
    partials = [p async for p in client.chat.completions.create_partial(
        model=MODEL, messages=[{"role": "user", "content": CITY_PROMPT}], response_model=City)]
    assert partials and partials[-1].model_dump() == TOOL_CITY.model_dump()
