"""Malformed model output never breaks a request: the simulated engine emits raw Harmony text
taken from real reports, and Chat and Responses (streamed and not) return 200 with the
recovered result and no control-token text."""

from __future__ import annotations

import json
from typing import cast

import openai
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam
from openai.types.responses import FunctionToolParam

from tests.e2e.conftest import MODEL, RunningStack

TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
# without ``strict``, as clients send it (openai-python's type requires the key)
RESP_TOOL = cast(
    FunctionToolParam, {"type": "function", "name": "get_weather", "parameters": TOOL["function"]["parameters"]}
)

# (name, raw harmony the model wrote, tools offered, expected content substring or None,
#  expected reasoning substring or None, expected tool call (name, city) or None)
Case = tuple[str, str, bool, str | None, str | None, tuple[str, str] | None]
CASES: list[Case] = [
    (
        "text before any header (refusal)",
        "I can't help with that.<|end|>",
        False,
        "I can't help with that.",
        None,
        None,
    ),
    (
        "junk words between channel and message",
        "<|channel|>analysis junk words<|message|>Thinking it over.<|end|><|start|>assistant<|channel|>final<|message|>Here you go.<|return|>",
        False,
        "Here you go.",
        "Thinking it over.",
        None,
    ),
    (
        "final-only answer",
        "<|channel|>final<|message|>Just the answer.<|return|>",
        False,
        "Just the answer.",
        None,
        None,
    ),
    (
        "missing <|constrain|>",
        '<|channel|>commentary to=functions.get_weather<|message|>{"city": "Rome"}<|call|>',
        True,
        None,
        None,
        ("get_weather", "Rome"),
    ),
    (
        "recipient before the channel",
        '<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city": "Oslo"}<|call|>',
        True,
        None,
        None,
        ("get_weather", "Oslo"),
    ),
    (
        "tool call on the analysis channel",
        '<|channel|>analysis to=functions.get_weather <|constrain|>json<|message|>{"city": "Lima"}<|call|>',
        True,
        None,
        None,
        ("get_weather", "Lima"),
    ),
    (
        "bare recipient without functions.",
        '<|channel|>commentary to=get_weather <|constrain|>json<|message|>{"city": "Kyiv"}<|call|>',
        True,
        None,
        None,
        ("get_weather", "Kyiv"),
    ),
    (
        "tool call JSON written in the final channel",
        '<|channel|>final<|message|>{"name": "get_weather", "arguments": {"city": "Cairo"}}<|return|>',
        True,
        None,
        None,
        ("get_weather", "Cairo"),
    ),
    (
        "doubly nested tool call in a json block",
        '<|channel|>final<|message|>```json\n{"tool": "get_weather", "arguments": {"tool": "get_weather", "arguments": {"city": "Quito"}}}\n```<|return|>',
        True,
        None,
        None,
        ("get_weather", "Quito"),
    ),
    (
        "JSON in the final channel without tools stays text",
        '<|channel|>final<|message|>{"name": "get_weather"}<|return|>',
        False,
        '{"name": "get_weather"}',
        None,
        None,
    ),
    (
        "<|endoftext|> as a boundary",
        "<|channel|>analysis<|message|>Hmm.<|endoftext|><|start|>assistant<|channel|>final<|message|>Done.<|return|>",
        False,
        "Done.",
        "Hmm.",
        None,
    ),
]


def _prompt(raw: str) -> str:
    return f"[[sim:raw={raw}]]"


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_recovers(stack: RunningStack, case: Case, stream: bool) -> None:
    _, raw, with_tools, content, reasoning, call = case
    client = stack.client()
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": _prompt(raw)}]
    tools = [TOOL] if with_tools else openai.omit
    calls: list[tuple[str | None, str]]
    if stream:
        chunks = list(client.chat.completions.create(model=MODEL, messages=messages, tools=tools, stream=True))
        got_content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        got_reasoning = "".join(
            (c.choices[0].delta.model_extra or {}).get("reasoning") or "" for c in chunks if c.choices
        )
        deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        assert all(d.function for d in deltas)
        calls = [(d.function.name, "") for d in deltas if d.id and d.function]
        args = "".join(d.function.arguments or "" for d in deltas if d.function)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason][-1]
    else:
        resp = client.chat.completions.create(model=MODEL, messages=messages, tools=tools)
        msg = resp.choices[0].message
        got_content = msg.content or ""
        got_reasoning = (msg.model_extra or {}).get("reasoning") or ""
        tool_calls = msg.tool_calls or []
        assert all(tc.type == "function" for tc in tool_calls)
        calls = [(tc.function.name, "") for tc in tool_calls if tc.type == "function"]
        args = "".join(tc.function.arguments for tc in tool_calls if tc.type == "function")
        finish = resp.choices[0].finish_reason
    for text in (got_content, got_reasoning, args):
        assert "<|" not in text
    if content is not None:
        assert content in got_content
    if reasoning is not None:
        assert reasoning in got_reasoning
    if call is not None:
        assert [c[0] for c in calls] == [call[0]]
        assert json.loads(args)["city"] == call[1]
        assert finish == "tool_calls"
    else:
        assert not calls and finish == "stop"


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_responses_recovers(stack: RunningStack, case: Case, stream: bool) -> None:
    _, raw, with_tools, content, reasoning, call = case
    client = stack.client()
    tools = [RESP_TOOL] if with_tools else openai.omit
    if stream:
        events = list(client.responses.create(model=MODEL, input=_prompt(raw), tools=tools, stream=True))
        completed = events[-1]
        assert completed.type == "response.completed"
        resp = completed.response
    else:
        resp = client.responses.create(model=MODEL, input=_prompt(raw), tools=tools)
    assert resp.status == "completed"
    dumped = json.dumps(resp.model_dump()["output"])
    assert "<|" not in dumped
    if content is not None:
        assert content in resp.output_text
    if reasoning is not None:
        texts = [c.text for i in resp.output if i.type == "reasoning" for c in (i.content or [])]
        assert any(reasoning in t for t in texts)
    calls = [i for i in resp.output if i.type == "function_call"]
    if call is not None:
        assert [c.name for c in calls] == [call[0]]
        assert json.loads(calls[0].arguments)["city"] == call[1]
    else:
        assert not calls


def test_cut_inside_tool_arguments_is_marked(stack: RunningStack) -> None:
    client = stack.client()
    raw = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Some very long city name that goes on"}<|call|>'
    resp = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": _prompt(raw)}], tools=[TOOL], max_tokens=16
    )
    assert resp.choices[0].finish_reason == "length"
    r = client.responses.create(model=MODEL, input=_prompt(raw), tools=[RESP_TOOL], max_output_tokens=16)
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
