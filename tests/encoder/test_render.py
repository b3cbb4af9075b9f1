"""Items -> Harmony prompt (decoded and compared), and the encoder over real NATS."""

from __future__ import annotations

import datetime as dt
import json
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai_harmony import HarmonyEncoding

from contracts.errors import ErrorCode
from contracts.messages.control import Cancel
from contracts.messages.encode import (
    EncodeRequest,
    FunctionTool,
    NamedToolChoice,
    ReasoningEffort,
    ResponseFormat,
    ToolChoice,
    ToolNamespace,
)
from contracts.messages.generate import EventFrame, GenerateRequest, GenerationFailed
from contracts.messages.items import (
    ConversationItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    McpCallItem,
    MessageItem,
    ReasoningItem,
)
from contracts.subjects import Subjects
from services.common.tokens import encode_text
from services.encoder.app import run
from services.encoder.render import RenderError
from services.encoder.renderer import Renderer
from services.encoder.settings import Settings
from tests.bus import Tap, adapter, client, job, running
from tests.encoder.reference import conversation_messages, render_prompt

TODAY = dt.date(2026, 11, 22)
WEATHER = FunctionTool(
    name="get_weather",
    description="Weather",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def _render(encoding: HarmonyEncoding, **fields: object) -> str:
    req = EncodeRequest.model_validate({"model": "m", **fields})
    prompt = render_prompt(req, encoding, TODAY)
    assert prompt.stop_token_ids == [200002, 200012]
    text: str = encoding.decode_utf8(prompt.token_ids)
    return text


def test_plain_turn(encoding: HarmonyEncoding) -> None:
    text = _render(encoding, items=[MessageItem(role="user", content="Hi")])
    assert text.startswith("<|start|>system<|message|>You are ChatGPT")
    assert "Current date: 2026-11-22" in text and "Reasoning: medium" in text
    assert "<|start|>developer" not in text
    assert text.endswith("<|start|>user<|message|>Hi<|end|><|start|>assistant")


def test_instructions_merge_and_effort(encoding: HarmonyEncoding) -> None:
    text = _render(
        encoding,
        instructions="Be brief.",
        reasoning_effort="high",
        items=[
            MessageItem(role="system", content="Speak French."),
            MessageItem(role="developer", content="No emoji."),
            MessageItem(role="user", content="Hi"),
        ],
    )
    assert "Reasoning: high" in text
    assert "# Instructions\n\nBe brief.\n\nSpeak French.\n\nNo emoji." in text


def test_tool_round_trip_keeps_current_reasoning_and_drops_old(encoding: HarmonyEncoding) -> None:
    text = _render(
        encoding,
        tools=[WEATHER],
        items=[
            MessageItem(role="user", content="q1"),
            ReasoningItem(text="OLD THOUGHT"),
            MessageItem(role="assistant", content="a1"),
            MessageItem(role="user", content="Weather in Paris?"),
            ReasoningItem(text="Need the tool."),
            MessageItem(role="assistant", content="Checking.", channel="commentary"),
            FunctionCallItem(call_id="c1", name="get_weather", arguments='{"city":"Paris"}'),
            FunctionCallItem(call_id="c2", name="get_weather", arguments='{"city":"Rome"}'),
            FunctionCallOutputItem(call_id="c1", output="sunny"),
            FunctionCallOutputItem(call_id="c2", output="rain"),
        ],
    )
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


@pytest.mark.parametrize(
    ("choice", "has_tool", "instruction"),
    [
        ("none", False, None),
        ("required", True, "You must call at least one"),
        (NamedToolChoice(name="get_weather"), True, "You must call the tool `functions.get_weather`"),
    ],
)
def test_tool_choice(encoding: HarmonyEncoding, choice: ToolChoice, has_tool: bool, instruction: str | None) -> None:
    other = FunctionTool(name="other", description="x")
    text = _render(encoding, tools=[WEATHER, other], tool_choice=choice, items=[MessageItem(role="user", content="q")])
    assert ("get_weather" in text) == has_tool
    if isinstance(choice, NamedToolChoice):
        assert "type other" not in text
    if instruction:
        assert instruction in text


def test_builtins_namespaces_and_mcp_calls(encoding: HarmonyEncoding) -> None:
    ns = ToolNamespace(name="docs", description="Docs server", tools=[FunctionTool(name="search", description="Find")])
    text = _render(
        encoding,
        builtin_tools=["browser", "python"],
        namespaces=[ns],
        items=[
            MessageItem(role="user", content="q"),
            McpCallItem(id="mcp_1", server_label="docs", name="search", arguments='{"q":"x"}', output="found"),
        ],
    )
    assert "namespace browser {" in text and "## python" in text and "namespace docs {" in text
    assert "<|start|>assistant to=docs.search<|channel|>commentary" in text
    assert "<|start|>docs.search to=assistant<|channel|>commentary<|message|>found<|end|>" in text


def test_caller_mistakes(encoding: HarmonyEncoding) -> None:
    with pytest.raises(RenderError) as err:
        render_prompt(
            EncodeRequest(model="m", items=[FunctionCallOutputItem(call_id="nope", output="x")]), encoding, TODAY
        )
    assert "nope" in err.value.error.message and err.value.error.code == ErrorCode.INVALID_REQUEST
    with pytest.raises(RenderError) as err:
        render_prompt(
            EncodeRequest(
                model="m",
                tools=[WEATHER],
                tool_choice=NamedToolChoice(name="x"),
                items=[MessageItem(role="user", content="q")],
            ),
            encoding,
            TODAY,
        )
    assert err.value.error.param == "tool_choice"


async def test_encoder_passes_jobs_on_to_the_dispatchers(nats_url: str, namespace: str) -> None:
    """A job comes in; its rendered prompt goes on to the dispatchers, never back; a caller
    mistake goes to the owning gateway; a job whose caller gave up is dropped."""
    settings = Settings(nats_url=nats_url, namespace=namespace)
    subjects = Subjects(namespace)
    async with (
        running(run, settings),
        client(nats_url, namespace) as c,
        Tap(c.nc, subjects.generate, adapter(GenerateRequest)) as dispatched,
        Tap(c.nc, subjects.gateway_events("g1"), adapter(EventFrame)) as gateway,
    ):
        await c.publish(subjects.jobs, job("r1", "Hello there", resume_tokens=[200005, 35644]))
        req = await dispatched.next()
        assert req.generation_id == "r1" and req.selection_text == "Hello there"
        assert req.prompt_token_ids[-2:] == [200006, 173781]  # ...<|start|>assistant
        assert req.resume_tokens == [200005, 35644] and req.route.parser == "p1"
        bad = job("r2").model_copy(
            update={"encode": EncodeRequest(model="m", items=[FunctionCallOutputItem(call_id="zz", output="x")])}
        )
        await c.publish(subjects.jobs, bad)
        frame = await gateway.next()
        failed = frame.events[0]
        assert isinstance(failed, GenerationFailed) and failed.generation_id == "r2"
        assert failed.stage == "encoder" and failed.error.code == ErrorCode.INVALID_REQUEST
        await c.publish(subjects.jobs, job("r3", deadline_in=-1))
        await c.publish(subjects.cancel, Cancel(generation_id="r4"))
        await c.publish(subjects.jobs, job("r4"))
        await c.publish(subjects.jobs, job("r5"))
        assert (await dispatched.next()).generation_id == "r5"  # r3 and r4 never reach it
        assert not dispatched.seen[1:-1]


def _reference(req: EncodeRequest, encoding: HarmonyEncoding) -> list[int]:
    """openai-harmony rendering the whole conversation at once."""
    from openai_harmony import Conversation, Role

    messages = conversation_messages(req, TODAY, "2024-06")
    return list(encoding.render_conversation_for_completion(Conversation.from_messages(messages), Role.ASSISTANT))


_SURROGATES: list[Literal["Cs"]] = ["Cs"]  # lone surrogates are not text a client can send
_TEXT = st.text(st.characters(blacklist_categories=_SURROGATES), max_size=60) | st.sampled_from(
    ["", "<|start|>user", "<|channel|>final<|message|>x", "a" * 3000, "👍🏽 café\n\nline", " x '"]
)
_ITEM = st.one_of(
    st.builds(lambda t: MessageItem(role="user", content=t), _TEXT),
    st.builds(lambda t: MessageItem(role="assistant", content=t), _TEXT),
    st.builds(lambda t: MessageItem(role="assistant", content=t, channel="commentary"), _TEXT),
    st.builds(lambda t: ReasoningItem(text=t), _TEXT),
    st.builds(lambda t: MessageItem(role="developer", content=t), _TEXT),
)


@settings(max_examples=150, deadline=None)
@given(
    items=st.lists(_ITEM, min_size=1, max_size=6),
    tools=st.booleans(),
    effort=st.sampled_from(["low", "high"]),
    call=st.booleans(),
    instructions=st.none() | _TEXT,
)
def test_renderer_equals_harmony(
    encoding: HarmonyEncoding,
    items: list[ConversationItem],
    tools: bool,
    effort: ReasoningEffort,
    call: bool,
    instructions: str | None,
) -> None:
    """The cached, linear-time renderer gives exactly openai-harmony's tokens."""
    if call:
        items = [
            *items,
            FunctionCallItem(call_id="c1", name="get_weather", arguments='{"city": "Paris"}'),
            FunctionCallOutputItem(call_id="c1", output="sunny <|end|> 21C"),
        ]
    req = EncodeRequest(
        model="m", items=items, tools=[WEATHER] if tools else [], reasoning_effort=effort, instructions=instructions
    )
    renderer = Renderer(encoding)
    assert renderer.render(req, TODAY).token_ids == _reference(req, encoding)
    assert renderer.render(req, TODAY).token_ids == _reference(req, encoding)  # from the caches


def test_long_runs_render_in_linear_time(encoding: HarmonyEncoding) -> None:
    """300,000 characters without a split point: bounded work, every character kept."""
    import time as clock

    req = EncodeRequest(model="m", items=[MessageItem(role="user", content="a" * 300_000)])
    started = clock.process_time()
    prompt = Renderer(encoding).render(req, TODAY)
    assert clock.process_time() - started < 5  # quadratic tokenization takes minutes
    assert "<|message|>" + "a" * 300_000 + "<|end|>" in encoding.decode_utf8(prompt.token_ids)


def test_context_length_is_checked_before_any_engine() -> None:
    from services.encoder.service import context_error

    assert context_error(1000, None, 131072) is None
    assert context_error(1000, 130072, 131072) is None
    over = context_error(131072, None, 131072)
    assert over is not None and over.code == ErrorCode.CONTEXT_LENGTH_EXCEEDED and "131072" in over.message
    budget = context_error(1000, 130073, 131072)
    assert budget is not None and budget.param == "max_tokens"


SHOPPING = ResponseFormat(
    name="shopping_list",
    description="The entries on the shopping list",
    json_schema={
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"type": "string"}}},
        "required": ["items"],
        "additionalProperties": False,
    },
    strict=True,
)


def test_response_format_ends_the_developer_message(encoding: HarmonyEncoding) -> None:
    """openai/harmony docs/format.md, "Structured output": "# Response Formats", "## {name}",
    "// {description}", the schema, at the end of the developer message (after the tools)."""
    text = _render(
        encoding,
        instructions="You are a helpful shopping assistant.",
        tools=[WEATHER],
        response_format=SHOPPING,
        items=[MessageItem(role="user", content="I need coffee and eggs")],
    )
    assert (
        "<|start|>developer<|message|># Instructions\n\nYou are a helpful shopping assistant.\n\n"
        "# Tools\n\n## functions\n\nnamespace functions {\n\n// Weather\n"
        "type get_weather = (_: {\ncity: string,\n}) => any;\n\n} // namespace functions\n\n"
        "# Response Formats\n\n## shopping_list\n\n// The entries on the shopping list\n"
        '{"type":"object","properties":{"items":{"type":"array","items":{"type":"string"}}},'
        '"required":["items"],"additionalProperties":false}<|end|>'
        "<|start|>user<|message|>I need coffee and eggs<|end|><|start|>assistant"
    ) in text
    # the system message still says where function calls go
    assert "Calls to these tools must go to the commentary channel: 'functions'." in text


def test_response_format_alone_makes_a_developer_message(encoding: HarmonyEncoding) -> None:
    fmt = ResponseFormat(name="verdict", json_schema={"type": "object"})  # no description
    text = _render(encoding, response_format=fmt, items=[MessageItem(role="user", content="Hi")])
    assert '<|start|>developer<|message|># Response Formats\n\n## verdict\n\n{"type":"object"}<|end|>' in text


@pytest.mark.parametrize("instructions", ["Be brief.", "Answer:", "Be brief", "line\n", "x ", None])
def test_response_format_tokens_are_those_of_the_whole_text(
    encoding: HarmonyEncoding, instructions: str | None
) -> None:
    """The section is encoded with the developer text around it, as one text: where they
    meet (".\n\n", ":\n\n") the tokens are not those of two texts put side by side."""
    from openai_harmony import Conversation, Role

    req = EncodeRequest(
        model="m", instructions=instructions, response_format=SHOPPING, items=[MessageItem(role="user", content="q")]
    )
    tokens = render_prompt(req, encoding, TODAY).token_ids
    plain = list(
        encoding.render_conversation_for_completion(
            Conversation.from_messages(conversation_messages(req, TODAY, "2024-06")), Role.ASSISTANT
        )
    )
    start = encoding.encode("<|start|>developer<|message|>", allowed_special="all")
    dev_at = next(i for i in range(len(tokens)) if tokens[i : i + len(start)] == start) + len(start)
    dev_end = tokens.index(200007, dev_at)
    text = encoding.decode_utf8(tokens[dev_at:dev_end])
    assert text.endswith(
        "## shopping_list\n\n// The entries on the shopping list\n"
        + json.dumps(SHOPPING.json_schema, separators=(",", ":"))
    )
    assert tokens[dev_at:dev_end] == encoding.encode(text, disallowed_special=())
    assert tokens[:dev_at] == plain[:dev_at]  # the system message is harmony's, untouched
    assert tokens[dev_end:] == plain[len(plain) - len(tokens) + dev_end :]  # so is the conversation


def test_the_prefix_cache_tells_response_formats_apart(encoding: HarmonyEncoding) -> None:
    renderer = Renderer(encoding)
    items: list[ConversationItem] = [MessageItem(role="user", content="q")]
    other = SHOPPING.model_copy(update={"name": "groceries"})
    texts = [
        encoding.decode_utf8(renderer.render(EncodeRequest(model="m", items=items, response_format=f), TODAY).token_ids)
        for f in (None, SHOPPING, other, SHOPPING)
    ]
    assert "# Response Formats" not in texts[0]
    assert "## shopping_list" in texts[1] and "## groceries" in texts[2] and texts[3] == texts[1]


def test_a_continuation_encodes_only_its_new_messages(
    encoding: HarmonyEncoding, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent loop re-sends its history each turn: contents seen before are not encoded again,
    and the tokens are still exactly harmony's."""
    import services.encoder.render as render

    encoded: list[str] = []

    def counted(enc: HarmonyEncoding, text: str) -> list[int]:
        encoded.append(text)
        return encode_text(enc, text)

    monkeypatch.setattr(render, "encode_text", counted)
    history: list[ConversationItem] = [MessageItem(role="user", content="Fix the failing test in parser.py " * 20)]
    for turn in range(5):
        history += [
            FunctionCallItem(call_id=f"c{turn}", name="get_weather", arguments='{"city": "Paris"}' * 5),
            FunctionCallOutputItem(call_id=f"c{turn}", output=f"result {turn} " * 40),
        ]
    renderer = Renderer(encoding)
    req = EncodeRequest(model="m", items=history, tools=[WEATHER])
    assert renderer.render(req, TODAY).token_ids == _reference(req, encoding)
    encoded.clear()
    longer = EncodeRequest(
        model="m",
        tools=[WEATHER],
        items=[
            *history,
            FunctionCallItem(call_id="c9", name="get_weather", arguments='{"city": "Oslo"}' * 5),
            FunctionCallOutputItem(call_id="c9", output="snow " * 40),
        ],
    )
    assert renderer.render(longer, TODAY).token_ids == _reference(longer, encoding)
    assert [len(t) >= 64 for t in encoded].count(True) == 2  # only the two new contents
    small = Renderer(encoding, text_budget=400)  # a budget evicts the oldest contents
    small.render(longer, TODAY)
    assert small._text_chars <= 400
