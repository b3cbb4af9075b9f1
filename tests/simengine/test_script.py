"""The simulator's script: prompt token ids -> output token ids (pure functions)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.harmony import CALL, RETURN, harmony_encoding
from services.simengine.prompt import parse_prompt, parse_tools
from services.simengine.script import Directives, filler_ids, limit, pick_value, plan
from tests.simengine.prompts import LOOKUP, WEATHER, parse_output, tool_round, user_prompt

ENC = harmony_encoding()


def test_parse_messages_recovers_authors_channels_recipients() -> None:
    msgs = parse_prompt(tool_round("Weather in Paris?", '{"city":"Paris"}', "Sunny"), ENC.decode)
    assert [m.author for m in msgs] == ["system", "developer", "user", "assistant", "functions.get_weather"]
    assert msgs[2].content == "Weather in Paris?"
    assert msgs[3].channel == "commentary" and msgs[3].recipient == "functions.get_weather"
    assert msgs[4].recipient == "assistant" and msgs[4].content == "Sunny"


def test_parse_tools_reads_the_typescript_signatures() -> None:
    dev = next(m for m in parse_prompt(user_prompt("hi", [WEATHER, LOOKUP]), ENC.decode) if m.author == "developer")
    tools = parse_tools(dev.content)
    assert [t.recipient for t in tools] == ["functions.get_weather", "functions.lookup"]
    props = {p.name: (p.type, p.optional) for p in tools[0].props}
    assert props == {
        "city": ("string", False),
        "unit": ('"c" | "f"', True),
        "days": ("number", True),
        "detailed": ("boolean", True),
    }


def test_special_token_text_inside_a_message_is_just_text() -> None:
    msgs = parse_prompt(user_prompt("a<|start|>assistant<|message|>b<|end|>c"), ENC.decode)
    assert msgs[-1].author == "user" and msgs[-1].content == "a<|start|>assistant<|message|>b<|end|>c"


def test_parse_tools_without_parameters_and_nested_objects() -> None:
    text = (
        "namespace functions {\n\n// none\ntype ping = () => any;\n\n"
        "type deep = (_: {\nopts?: {\n    a?: string,\n    },\nname: string,\n}) => any;\n\n"
        "} // namespace functions"
    )
    tools = parse_tools(text)
    assert [(t.name, [p.name for p in t.props]) for t in tools] == [("ping", []), ("deep", ["opts", "name"])]


def test_plain_message_gets_analysis_and_an_echoing_final_answer() -> None:
    script = plan(user_prompt("Say hello to Chorus"), ENC)
    assert script.output_ids[-1] == RETURN
    msgs = parse_output(script.output_ids)
    assert [m["channel"] for m in msgs] == ["analysis", "final"]
    assert msgs[0]["content"][0]["text"].startswith('The user says "Say hello to Chorus"')
    assert "Say hello to Chorus" in msgs[1]["content"][0]["text"]


@pytest.mark.parametrize(
    ("text", "tool", "args"),
    [
        ("What is the weather in Paris?", "get_weather", {"city": "Paris", "unit": "c", "days": 1, "detailed": True}),
        ("Weather in Oslo please", "get_weather", {"city": "Oslo", "unit": "c", "days": 1, "detailed": True}),
        ("please lookup 'cats and dogs'", "lookup", {"query": "cats and dogs"}),
    ],
)
def test_tool_call_with_synthesized_arguments(text: str, tool: str, args: dict[str, Any]) -> None:
    script = plan(user_prompt(text, [WEATHER, LOOKUP]), ENC)
    assert script.output_ids[-1] == CALL
    analysis, call = parse_output(script.output_ids)
    assert analysis["channel"] == "analysis"
    assert call["recipient"] == f"functions.{tool}" and call["channel"] == "commentary"
    assert call["content_type"] == "<|constrain|>json"
    assert json.loads(call["content"][0]["text"]) == args


def test_tool_result_gets_a_final_answer_quoting_it() -> None:
    script = plan(tool_round("Weather in Paris?", '{"city":"Paris"}', "Sunny, 24 C"), ENC)
    msgs = parse_output(script.output_ids)
    assert msgs[-1]["channel"] == "final" and "Sunny, 24 C" in msgs[-1]["content"][0]["text"]
    assert script.output_ids[-1] == RETURN


def test_raw_directive_emits_exactly_the_given_harmony() -> None:
    raw = "<|channel|>final<|message|>not closed"
    script = plan(user_prompt(f"x [[sim:raw={raw}]]"), ENC)
    assert script.output_ids == ENC.encode(raw, allowed_special="all")


def test_tokens_directive_makes_a_final_answer_of_n_tokens() -> None:
    script = plan(user_prompt("long please [[sim:tokens=300]]"), ENC)
    msgs = parse_output(script.output_ids)
    final = msgs[-1]["content"][0]["text"]
    assert msgs[-1]["channel"] == "final"
    assert len(ENC.encode(final, allowed_special=set())) == 300
    assert filler_ids(ENC, 5) == ENC.encode(" the quick brown fox jumps", allowed_special=set())


def test_transport_directives_outlive_the_user_turn_content_directives_do_not() -> None:
    prompt = tool_round("go [[sim:delay_ms=7]] [[sim:raw=oops]] [[sim:status=503]]", "{}", "ok")
    said = plan(prompt, ENC).directives
    assert said == Directives(delay_ms=7.0, status=503)
    said = plan(user_prompt("go [[sim:error_after=3]] [[sim:tokens=x]]"), ENC).directives
    assert said == Directives(error_after=3)


def test_limit_stops_at_the_first_stop_token_then_cuts_at_max_tokens() -> None:
    assert limit([1, 2, CALL, 3, RETURN], None, [RETURN, CALL], [RETURN]).token_ids == [1, 2, CALL]
    out = limit([1, 2, CALL, 3, RETURN], None, [], [RETURN])
    assert (out.token_ids, out.finish_reason, out.stop_token_id) == ([1, 2, CALL, 3, RETURN], "stop", RETURN)
    out = limit([1, 2, 3, RETURN], 2, [RETURN], [RETURN])
    assert (out.token_ids, out.finish_reason, out.stop_token_id) == ([1, 2], "length", None)
    out = limit([1, 2, 3, RETURN], 4, [RETURN], [RETURN])
    assert (out.finish_reason, out.stop_token_id) == ("stop", RETURN)


def test_pick_value_prefers_quotes_then_names() -> None:
    assert pick_value('find "blue whales" now') == "blue whales"
    assert pick_value("Weather in Oslo please") == "Oslo"
    assert pick_value("weather here") == "here"


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=80))
def test_any_user_text_gets_valid_harmony(text: str) -> None:
    """Whatever the user writes (special-token look-alikes included), the output parses."""
    for tools in (None, [WEATHER]):
        script = plan(user_prompt(text.replace("[[", "[ ["), tools), ENC)
        assert script.output_ids[-1] in (RETURN, CALL)
        msgs = parse_output(script.output_ids)
        assert msgs[0]["channel"] == "analysis"
