"""Items -> Harmony prompt (decoded and compared), and the encoder over real NATS."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from pydantic import TypeAdapter

from contracts.errors import ErrorCode
from contracts.messages.encode import (
    EncodeReply,
    EncodeRequest,
    FunctionTool,
    NamedToolChoice,
    ToolNamespace,
)
from contracts.messages.items import (
    FunctionCallItem,
    FunctionCallOutputItem,
    McpCallItem,
    MessageItem,
    ReasoningItem,
)
from contracts.subjects import Subjects
from services.common import bus
from services.encoder.app import run
from services.encoder.render import RenderError, render_prompt
from services.encoder.settings import Settings

TODAY = dt.date(2026, 11, 22)
WEATHER = FunctionTool(name="get_weather", description="Weather", parameters={
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})


def _render(encoding, **kw) -> str:  # type: ignore[no-untyped-def]
    req = EncodeRequest(request_id="r", model="m", **kw)
    prompt = render_prompt(req, encoding, TODAY)
    assert prompt.stop_token_ids == [200002, 200012]
    return encoding.decode_utf8(prompt.token_ids)


def test_plain_turn(encoding) -> None:  # type: ignore[no-untyped-def]
    text = _render(encoding, items=[MessageItem(role="user", content="Hi")])
    assert text.startswith("<|start|>system<|message|>You are ChatGPT")
    assert "Current date: 2026-11-22" in text and "Reasoning: medium" in text
    assert "<|start|>developer" not in text
    assert text.endswith("<|start|>user<|message|>Hi<|end|><|start|>assistant")


def test_instructions_merge_and_effort(encoding) -> None:  # type: ignore[no-untyped-def]
    text = _render(encoding, instructions="Be brief.", reasoning_effort="high", items=[
        MessageItem(role="system", content="Speak French."), MessageItem(role="developer", content="No emoji."),
        MessageItem(role="user", content="Hi")])
    assert "Reasoning: high" in text
    assert "# Instructions\n\nBe brief.\n\nSpeak French.\n\nNo emoji." in text


def test_tool_round_trip_keeps_current_reasoning_and_drops_old(encoding) -> None:  # type: ignore[no-untyped-def]
    text = _render(encoding, tools=[WEATHER], items=[
        MessageItem(role="user", content="q1"), ReasoningItem(text="OLD THOUGHT"),
        MessageItem(role="assistant", content="a1"),
        MessageItem(role="user", content="Weather in Paris?"), ReasoningItem(text="Need the tool."),
        MessageItem(role="assistant", content="Checking.", channel="commentary"),
        FunctionCallItem(call_id="c1", name="get_weather", arguments='{"city":"Paris"}'),
        FunctionCallItem(call_id="c2", name="get_weather", arguments='{"city":"Rome"}'),
        FunctionCallOutputItem(call_id="c1", output="sunny"),
        FunctionCallOutputItem(call_id="c2", output="rain"),
    ])
    assert "OLD THOUGHT" not in text
    assert "type get_weather = (_: {\ncity: string,\n}) => any;" in text
    assert (
        "<|start|>user<|message|>Weather in Paris?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>Need the tool.<|end|>"
        "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"
        '<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city":"Paris"}<|call|>'
        '<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city":"Rome"}<|call|>'
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>sunny<|end|>"
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>rain<|end|>"
        "<|start|>assistant"
    ) in text


@pytest.mark.parametrize(("choice", "has_tool", "instruction"), [
    ("none", False, None), ("required", True, "You must call at least one"),
    (NamedToolChoice(name="get_weather"), True, "You must call the tool `functions.get_weather`"),
])
def test_tool_choice(encoding, choice, has_tool, instruction) -> None:  # type: ignore[no-untyped-def]
    other = FunctionTool(name="other", description="x")
    text = _render(encoding, tools=[WEATHER, other], tool_choice=choice, items=[MessageItem(role="user", content="q")])
    assert ("get_weather" in text) == has_tool
    if isinstance(choice, NamedToolChoice):
        assert "type other" not in text
    if instruction:
        assert instruction in text


def test_builtins_namespaces_and_mcp_calls(encoding) -> None:  # type: ignore[no-untyped-def]
    ns = ToolNamespace(name="docs", description="Docs server", tools=[FunctionTool(name="search", description="Find")])
    text = _render(encoding, builtin_tools=["browser", "python"], namespaces=[ns], items=[
        MessageItem(role="user", content="q"),
        McpCallItem(id="mcp_1", server_label="docs", name="search", arguments='{"q":"x"}', output="found"),
    ])
    assert "namespace browser {" in text and "## python" in text and "namespace docs {" in text
    assert "<|start|>assistant to=docs.search<|channel|>commentary" in text
    assert "<|start|>docs.search to=assistant<|channel|>commentary<|message|>found<|end|>" in text


def test_caller_mistakes(encoding) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(RenderError) as err:
        render_prompt(EncodeRequest(request_id="r", model="m", items=[
            FunctionCallOutputItem(call_id="nope", output="x")]), encoding, TODAY)
    assert "nope" in err.value.error.message and err.value.error.code == ErrorCode.INVALID_REQUEST
    with pytest.raises(RenderError) as err:
        render_prompt(EncodeRequest(request_id="r", model="m", tools=[WEATHER], tool_choice=NamedToolChoice(name="x"),
                                    items=[MessageItem(role="user", content="q")]), encoding, TODAY)
    assert err.value.error.param == "tool_choice"


async def test_encoder_over_nats(nats_url: str, namespace: str) -> None:
    settings = Settings(nats_url=nats_url, namespace=namespace)
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(run(settings, stop, ready=ready))
    await asyncio.wait_for(ready.wait(), 10)
    nc = await bus.connect(nats_url, "test")
    try:
        reply_type = TypeAdapter(EncodeReply)
        subjects = Subjects(namespace)
        req = EncodeRequest(request_id="r1", model="m", items=[MessageItem(role="user", content="Hello there")])
        prompt = await bus.request(nc, subjects.encode, req, reply_type, request_id="r1",
                                   timeout=2, service="encoder")
        assert prompt.selection_text == "Hello there"
        assert prompt.token_ids[-2:] == [200006, 173781]  # ...<|start|>assistant
        bad = EncodeRequest(request_id="r2", model="m", items=[FunctionCallOutputItem(call_id="zz", output="x")])
        with pytest.raises(bus.BusFailure) as err:
            await bus.request(nc, subjects.encode, bad, reply_type, request_id="r2", timeout=2, service="encoder")
        assert err.value.error.code == ErrorCode.INVALID_REQUEST
    finally:
        await nc.close()
        stop.set()
        await asyncio.wait_for(task, 10)
