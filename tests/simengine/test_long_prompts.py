"""A prompt with 300,000 characters of one word (found by tests/e2e/test_hostile.py): the
script quotes a bounded part of it back and encodes what it says in linear time, so writing the
answer costs about the same as for a short prompt. Encoding a quote of the whole word (BPE is
quadratic in a word) held the engine's event loop for minutes: health checks failed, every
request got 503; so did a tool whose enum value was 100,000 characters of one word."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st
from openai_harmony import ToolDescription

from services.common.harmony import harmony_encoding
from services.common.tokens import encode_text
from services.dispatcher.engines.constraints import tool_call_format
from services.simengine.constrained import Constrained, generate
from services.simengine.matcher import compile_format
from services.simengine.script import QUOTE_CHARS, encode_harmony, plan
from tests.simengine.prompts import tool_round, user_prompt

ENC = harmony_encoding()
WORD = "a" * 300_000
PLACEHOLDER = "zqxjv"


def test_a_huge_user_message_is_quoted_in_part() -> None:
    script = plan(spliced(user_prompt(PLACEHOLDER)), ENC)
    text = ENC.decode(script.output_ids)
    assert "a" * QUOTE_CHARS + "..." in text and "a" * (QUOTE_CHARS + 1) not in text
    assert len(script.output_ids) < 2 * QUOTE_CHARS  # two quotes at most, whatever the prompt


def test_a_huge_tool_output_is_quoted_in_part() -> None:
    script = plan(spliced(tool_round("Weather?", '{"city": "Paris"}', PLACEHOLDER)), ENC)
    assert len(script.output_ids) < 2 * QUOTE_CHARS


def test_a_short_message_is_quoted_whole() -> None:
    assert "You said: hello there" in ENC.decode(plan(user_prompt("hello there"), ENC).output_ids)


def spliced(prompt: list[int]) -> list[int]:
    """``prompt`` with its placeholder replaced by ``WORD``, encoded in linear time (harmony's
    renderer would take minutes on it)."""
    mark = ENC.encode(PLACEHOLDER, disallowed_special=())
    at = max(i for i in range(len(prompt)) if prompt[i : i + len(mark)] == mark)
    return [*prompt[:at], *encode_text(ENC, WORD), *prompt[at + len(mark) :]]


def test_a_huge_enum_value_in_a_required_call_is_cut() -> None:
    tool = ToolDescription.new(
        "get_weather",
        "Weather",
        parameters={
            "type": "object",
            "properties": {"city": {"type": "string", "enum": [PLACEHOLDER]}},
            "required": ["city"],
        },
    )
    started = time.process_time()
    script = plan(spliced(user_prompt("Weather?", tools=[tool])), ENC)
    grammar = Constrained(compile_format(tool_call_format("functions", ["get_weather"])))
    output = generate(script.output_ids, script.calls, ENC, grammar)  # through a required call's grammar
    assert time.process_time() - started < 5
    assert len(output) < 2 * QUOTE_CHARS


SPECIAL = st.sampled_from(
    [
        "<|start|>",
        "<|end|>",
        "<|message|>",
        "<|channel|>",
        "<|call|>",
        "<|return|>",
        "<|constrain|>",
        "<|endoftext|>",
        "<|reserved_200013|>",
        "<|nope|>",
        "<|",
        "|>",
    ]
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=30) | SPECIAL | st.sampled_from(["a" * 200, "word " * 100]), max_size=6).map("".join))
def test_harmony_text_encodes_as_the_tokenizer_does(text: str) -> None:
    """Exactly (while no run without a split point nears 2,048 characters: see services.common.tokens)."""
    assert encode_harmony(ENC, text) == ENC.encode(text, allowed_special="all")
