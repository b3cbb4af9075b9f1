"""Compatibility: the Python clients people point at an OpenAI-compatible server, each driven end
to end against `chorus up` (real services over NATS + Redis, the simulated engine).

For each client, on Chat Completions and on Responses where it speaks both: a plain answer, a
streamed one, a tool-calling loop (the client runs the tool and sends its result back),
structured output, and the model's reasoning where the client shows it. docs/clients.md is
written from these tests. Here: OpenAI's own SDKs (openai, openai-agents) and instructor, which
wraps the openai client; LangChain, pydantic-ai and LiteLLM are in test_clients_frameworks.py;
what every test asks and what the simulated model answers, in client_scenario.py.

Clients are imported inside fixtures: several take seconds to import, and the default test run
collects this module. openai-agents exports traces to OpenAI unless tracing is off: it is kept on
loopback."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from openai.types.shared import Reasoning

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

INSTRUCTOR_VERSION = "1.17.0"
CACHE = Path(os.environ.get("CHORUS_TEST_CACHE", Path.home() / ".cache" / "chorus-tests"))


# ---------------------------------------------------------------------------------- openai


def test_openai_chat(stack: RunningStack) -> None:
    client = stack.client()
    plain = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello"}])
    assert plain.choices[0].message.content == "Hello! You said: Say hello"
    assert (plain.choices[0].message.model_extra or {})["reasoning_content"]

    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Stream hello"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    thought = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks if c.choices
    )
    assert text == "Hello! You said: Stream hello" and thought
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0

    messages: list[Any] = [{"role": "user", "content": weather_question("Paris")}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[CHAT_WEATHER])
    (call,) = first.choices[0].message.tool_calls or []
    assert first.choices[0].finish_reason == "tool_calls" and call.type == "function"
    messages += [
        first.choices[0].message,  # the SDK's own message object, as the cookbook does
        {"role": "tool", "tool_call_id": call.id, "content": get_weather(**json.loads(call.function.arguments))},
    ]
    final = client.chat.completions.create(model=MODEL, messages=messages, tools=[CHAT_WEATHER])
    assert final.choices[0].message.content == answered("Paris")
    assert reasoning_carried(stack, "Paris")

    parsed = client.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": CITY_PROMPT}], response_format=City
    )
    assert parsed.choices[0].message.parsed == MINIMAL_CITY
    with client.chat.completions.stream(
        model=MODEL, messages=[{"role": "user", "content": CITY_PROMPT}], response_format=City
    ) as stream:
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
    final = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        tools=[RESPONSES_WEATHER],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": output}],
    )
    assert final.output_text == answered("Lima")
    assert reasoning_carried(stack, "Lima")

    # stateless: the output sent back, the reasoning encrypted
    history: list[Any] = [{"role": "user", "content": weather_question("Oslo")}]
    first = client.responses.create(
        model=MODEL, input=history, tools=[RESPONSES_WEATHER], store=False, include=["reasoning.encrypted_content"]
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    history += [item.model_dump(exclude_none=True) for item in first.output]
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": get_weather("Oslo")})
    final = client.responses.create(
        model=MODEL, input=history, tools=[RESPONSES_WEATHER], store=False, include=["reasoning.encrypted_content"]
    )
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
    chat = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello"}], stream=True
    )
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

    parsed = await client.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": CITY_PROMPT}], response_format=City
    )
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
        model = agents.OpenAIChatCompletionsModel(
            model=MODEL, openai_client=stack.async_client(), should_replay_reasoning_content=lambda _: True
        )
    else:
        model = agents.OpenAIResponsesModel(model=MODEL, openai_client=stack.async_client())
    config = agents.RunConfig(tracing_disabled=True)  # traces would go to OpenAI
    settings = agents.ModelSettings(reasoning=Reasoning(effort="low", summary="auto"))
    calls: list[str] = []

    as_tool: Callable[[Callable[[str], str]], object] = agents.function_tool(name_override="get_weather")

    @as_tool
    def weather(city: str) -> str:
        """Current weather for a city."""
        calls.append(city)
        return get_weather(city)

    agent = agents.Agent(
        name="forecaster", instructions="Answer briefly.", model=model, tools=[weather], model_settings=settings
    )
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
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--target",
                str(target),
                f"instructor=={INSTRUCTOR_VERSION}",
                "docstring-parser>=0.16,<1",
            ],
            check=True,
            timeout=300,
        )
    sys.path.append(str(target))
    return importlib.import_module("instructor")


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("JSON", City(name="Tokyo", population=37000000)),  # the schema is in the prompt, the JSON scripted
        ("JSON_SCHEMA", MINIMAL_CITY),
        ("TOOLS", TOOL_CITY),
        ("TOOLS_STRICT", TOOL_CITY),
        ("RESPONSES_TOOLS", TOOL_CITY),
    ],
)
def test_instructor(stack: RunningStack, instructor: ModuleType, mode: str, expected: City) -> None:
    client = instructor.from_openai(stack.client(), mode=getattr(instructor.Mode, mode))
    prompt = f"{CITY_PROMPT} {RAW_JSON}" if mode == "JSON" else CITY_PROMPT
    if mode.startswith("RESPONSES"):
        city = client.responses.create(model=MODEL, input=prompt, response_model=City, max_retries=0)
    else:
        city = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], response_model=City, max_retries=0
        )
    assert isinstance(city, City) and city.model_dump() == expected.model_dump()


async def test_instructor_partial_stream(stack: RunningStack, instructor: ModuleType) -> None:
    client = instructor.from_openai(stack.async_client(), mode=instructor.Mode.TOOLS)
    partials = [
        p
        async for p in client.chat.completions.create_partial(
            model=MODEL, messages=[{"role": "user", "content": CITY_PROMPT}], response_model=City
        )
    ]
    assert partials and partials[-1].model_dump() == TOOL_CITY.model_dump()
