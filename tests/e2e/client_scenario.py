"""What every client compatibility test (test_clients.py, test_clients_frameworks.py) asks the
simulated model, and what it answers.

The simulated model (services/simengine/script.py) calls a declared tool when the user's
message is last, answers "According to TOOL: OUTPUT" after a tool result, and follows a JSON
schema (a grammar or the prompt's "# Response Formats") with a minimal conforming value."""

from __future__ import annotations

from typing import cast

from openai.types.chat import ChatCompletionFunctionToolParam
from openai.types.responses import FunctionToolParam
from pydantic import BaseModel

from tests.e2e.conftest import RunningStack

WEATHER_PARAMETERS: dict[str, object] = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
CHAT_WEATHER: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Current weather for a city", "parameters": WEATHER_PARAMETERS},
}
# without ``strict``, as clients send it (openai-python's type requires the key)
RESPONSES_WEATHER = cast(
    FunctionToolParam,
    {
        "type": "function",
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": WEATHER_PARAMETERS,
    },
)
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
