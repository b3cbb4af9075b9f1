"""Long text in the system and developer messages (found by tests/e2e/test_hostile.py: a tool
description of 4,100,000 characters of one word held the encoder's event loop, and every
request behind it, for hours). openai-harmony encodes what it renders in time quadratic in a
word; the renderer gives it short placeholders for long lines and encodes the text itself."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai_harmony import Conversation, HarmonyEncoding, Role

from contracts.errors import ErrorCode
from contracts.messages.encode import EncodeRequest, FunctionTool, ToolNamespace
from contracts.messages.items import MessageItem
from services.encoder.render import RenderError
from services.encoder.renderer import Renderer
from services.encoder.service import prompt_chars
from tests.encoder.reference import conversation_messages

TODAY = dt.date(2025, 1, 1)


def _reference(req: EncodeRequest, encoding: HarmonyEncoding) -> list[int]:
    messages = conversation_messages(req, TODAY, "2024-06")
    return list(encoding.render_conversation_for_completion(Conversation.from_messages(messages), Role.ASSISTANT))


def _tool(description: str, prop: str = "city", enum: str = "Paris") -> FunctionTool:
    return FunctionTool(
        name="get_weather",
        description=description,
        parameters={
            "type": "object",
            "properties": {prop: {"type": "string", "description": description, "enum": [enum, "x"]}},
        },
    )


def test_a_huge_word_anywhere_in_the_prefix_renders_in_linear_time(encoding: HarmonyEncoding) -> None:
    """100,000 characters of one word in seven places (openai-harmony alone: seconds for each)."""
    word = "a" * 100_000
    req = EncodeRequest(
        model="m",
        items=[MessageItem(role="developer", content=f"dev {word}"), MessageItem(role="user", content="hi")],
        instructions=f"first line\n{word}\nlast line",
        tools=[_tool(word, prop=word, enum=word)],
        namespaces=[ToolNamespace(name="files", description=word, tools=[_tool(f"x\n{word}")])],
    )
    started = time.process_time()
    prompt = Renderer(encoding).render(req, TODAY)
    assert time.process_time() - started < 10
    text = encoding.decode_utf8(prompt.token_ids)
    assert f"# Instructions\n\nfirst line\n{word}\nlast line" in text
    assert f"dev {word}" in text and f"// {word}\n" in text and f'{word}?: "{word}" | "x"' in text
    assert "chorus" not in text  # every placeholder was put back


def test_the_size_of_tools_sends_a_render_to_the_pool() -> None:
    req = EncodeRequest(model="m", items=[MessageItem(role="user", content="hi")], tools=[_tool("a" * 300_000)])
    assert prompt_chars(req) > 600_000
    grouped = EncodeRequest(
        model="m",
        items=[MessageItem(role="user", content="hi")],
        namespaces=[ToolNamespace(name="files", tools=[_tool("a" * 300_000)])],
    )
    assert prompt_chars(grouped) > 600_000


def test_a_prompt_without_tools_counts_its_text() -> None:
    req = EncodeRequest(model="m", items=[MessageItem(role="user", content="hi")], instructions="abc")
    assert prompt_chars(req) == 5


_LINE = st.lists(
    st.sampled_from(["word", "Wörter", "x1", "🦜", "'s", "//", "  ", "<|end|>", "-"]), min_size=300, max_size=900
).map(" ".join)  # long lines, each with places a tokenizer splits
_TEXT = st.lists(_LINE | st.sampled_from(["", "short", "a" * 500]), min_size=1, max_size=3).map("\n".join)


@settings(max_examples=25, deadline=None)
@given(instructions=_TEXT, description=_TEXT, developer=_TEXT)
def test_long_lines_give_exactly_harmonys_tokens(
    encoding: HarmonyEncoding, instructions: str, description: str, developer: str
) -> None:
    """Exactly, as long as no run without a split point nears ``MAX_PIECE`` characters (such a
    run is cut, as services.common.tokens says, and only its tokens may differ)."""
    req = EncodeRequest(
        model="m",
        instructions=instructions,
        tools=[_tool(description, enum=description[:3000])],
        items=[MessageItem(role="developer", content=developer), MessageItem(role="user", content="hi")],
    )
    assert Renderer(encoding).render(req, TODAY).token_ids == _reference(req, encoding)


def test_a_prompt_past_the_context_is_refused_before_all_of_it_is_encoded(encoding: HarmonyEncoding) -> None:
    """(found: a message of 4,100,000 characters, inside the body limit, took longer to encode
    than the request allows: a 504 where the caller's mistake is a 400)"""
    huge = "x" * 4_100_000  # about 512,000 tokens
    for req in (
        EncodeRequest(model="m", items=[MessageItem(role="user", content=huge)]),
        EncodeRequest(model="m", instructions=huge, items=[MessageItem(role="user", content="hi")]),
    ):
        started = time.process_time()
        with pytest.raises(RenderError) as refused:
            Renderer(encoding).render(req, TODAY, limit=131_072)
        assert time.process_time() - started < 8  # a quarter of the text at most
        assert refused.value.error.code == ErrorCode.CONTEXT_LENGTH_EXCEEDED
    fits = EncodeRequest(model="m", items=[MessageItem(role="user", content="x" * 8_000)])
    whole = Renderer(encoding).render(fits, TODAY).token_ids
    assert Renderer(encoding).render(fits, TODAY, limit=len(whole)).token_ids == whole
    with pytest.raises(RenderError):
        Renderer(encoding).render(fits, TODAY, limit=len(whole) - 100)
