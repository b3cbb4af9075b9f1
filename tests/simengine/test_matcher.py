"""The simulator's structural-tag matcher: what each format accepts and refuses (xgrammar
0.2.8's semantics, checked against it when these cases were written), and that a completion
always leads to a place where the grammar may end."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.dispatcher.engines.constraints import final_format, tool_call_format
from services.simengine.matcher import (
    GrammarUnsupported,
    compile_choice,
    compile_format,
    compile_json,
    compile_pattern,
    compile_tag,
)

ANY: dict[str, Any] = {"type": "any_text"}
OBJ: dict[str, Any] = {"type": "json_schema", "json_schema": {"type": "object"}}


def const(value: str) -> dict[str, Any]:
    return {"type": "const_string", "value": value}


def tag(begin: str, content: dict[str, Any], end: str | list[str]) -> dict[str, Any]:
    return {"type": "tag", "begin": begin, "content": content, "end": end}


def ends(fmt: dict[str, Any], text: str) -> bool:
    """The format accepts ``text`` whole (a stop token is allowed after it)."""
    state = compile_format(fmt).start().feed(text)
    return state is not None and state.can_end()


def prefix(fmt: dict[str, Any], text: str) -> bool:
    """``text`` may begin an output of the format."""
    return compile_format(fmt).start().feed(text) is not None


TRIGGERED = {"type": "triggered_tags", "triggers": ["<f"], "tags": [tag("<f1>", OBJ, "</f>"), tag("<f2>", ANY, "</f>")]}
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city", "days"],
    "additionalProperties": False,
}

CASES: list[tuple[str, dict[str, Any], list[str], list[str]]] = [
    # name, format, accepted whole, refused (as a whole output)
    ("const", const("ab"), ["ab"], ["", "a", "abc"]),
    ("empty const", const(""), [""], ["a"]),
    ("any_text", ANY, ["", "anything <|channel|> at all"], []),
    ("any_text excludes", {"type": "any_text", "excludes": ["final", "x"]}, ["", "fina", "analysis"], ["final", "a x"]),
    ("any_text max_chars", {"type": "any_text", "max_chars": 3}, ["abc"], ["abcd"]),
    ("json", OBJ, ['{"a": [1, {"b": null}]}', "{ }", '{\n"a":1}'], ["", " {}", "{} ", "[1]", '{"a":}', "{'a':1}"]),
    ("regex", {"type": "regex", "pattern": "[a-c]+\\d?"}, ["abc", "a1"], ["", "abcd", "a12"]),
    ("sequence", {"type": "sequence", "elements": [const("<"), OBJ, const(">")]}, ["<{}>"], ["<{}", "{}>"]),
    ("or", {"type": "or", "elements": [const("yes"), const("no")]}, ["yes", "no"], ["yesno", "maybe"]),
    # any_text is free to stop anywhere: a sequence after it starts wherever it matches
    ("any then const", {"type": "sequence", "elements": [ANY, const("X")]}, ["X", "abcX", "XXX"], ["abc", "Xa"]),
    # a tag's any_text never contains the tag's end: the content ends at its first occurrence
    ("tag", tag("<a>", ANY, "</a>"), ["<a></a>", "<a>x < /a</a>"], ["<a>x</a>y</a>", "<a>x"]),
    ("tag ends", tag("<a>", ANY, ["</a>", "!"]), ["<a>x</a>", "<a>x!"], ["<a>x!y!"]),
    ("tag excluded content", tag("B", {"type": "any_text", "excludes": ["E"]}, ""), ["B", "Bxyz"], ["BxEy"]),
    # triggered tags: free text; a trigger written must go on as one of its tags
    ("triggered", TRIGGERED, ["", "text", "a<f1>{}</f>b<f2>x</f>c"], ["a<f", "a<f3>", "a<f1>{}"]),
    ("at_least_one", {**TRIGGERED, "at_least_one": True}, ["<f1>{}</f>", "<f1>{}</f>text"], ["", "text<f1>{}</f>"]),
    ("stop_after_first", {**TRIGGERED, "stop_after_first": True}, ["", "a<f1>{}</f>"], ["a<f1>{}</f>b"]),
    ("both", {**TRIGGERED, "at_least_one": True, "stop_after_first": True}, ["<f2>x</f>"], ["", "a<f2>x</f>"]),
    ("triggered excludes", {**TRIGGERED, "excludes": ["zz"]}, ["z<f2>zz</f>z"], ["zz"]),
    (
        "separator",
        {"type": "tags_with_separator", "tags": [tag("<f>", OBJ, "</f>")], "separator": ","},
        ["", "<f>{}</f>", "<f>{}</f>,<f>{}</f>"],
        ["<f>{}</f><f>{}</f>", ",", "<f>{}</f>,"],
    ),
    (
        "optional",
        {"type": "sequence", "elements": [{"type": "optional", "content": const("ab")}, const("c")]},
        ["c", "abc"],
        ["ababc"],
    ),
    ("star", {"type": "star", "content": const("ab")}, ["", "abab"], ["aba"]),
    ("plus", {"type": "plus", "content": const("ab")}, ["ab", "abab"], [""]),
    ("repeat", {"type": "repeat", "min": 2, "max": 3, "content": const("a")}, ["aa", "aaa"], ["a", "aaaa"]),
    (
        "dispatch",
        {"type": "dispatch", "rules": [["<a>", {"type": "sequence", "elements": [OBJ, const("</a>")]}]], "loop": False},
        ["", "x<a>{}</a>"],
        ["x<a>", "x<a>{}</a>y"],
    ),
]


@pytest.mark.parametrize(("name", "fmt", "accepted", "refused"), CASES, ids=[c[0] for c in CASES])
def test_each_format_accepts_and_refuses(
    name: str, fmt: dict[str, Any], accepted: list[str], refused: list[str]
) -> None:
    for text in accepted:
        assert ends(fmt, text), (name, text)
    for text in refused:
        assert not ends(fmt, text), (name, text)


@pytest.mark.parametrize(("name", "fmt", "accepted", "refused"), CASES, ids=[c[0] for c in CASES])
def test_a_completion_leads_to_an_end(name: str, fmt: dict[str, Any], accepted: list[str], refused: list[str]) -> None:
    for text in ["", *accepted, *refused]:
        state = compile_format(fmt).start().feed(text)
        if state is None:
            continue
        completion = state.completion()
        assert completion is not None, (name, text)
        after = state.feed(completion)
        assert after is not None and after.can_end(), (name, text, completion)


def test_refusal_comes_at_the_first_character_that_cannot_be() -> None:
    fmt = tag("<|channel|>", ANY, " to=functions.")
    assert prefix(fmt, "<|chan") and not prefix(fmt, "<|x")
    assert not prefix(OBJ, "H")  # an answer in words where JSON is due
    assert not prefix({"type": "json_schema", "json_schema": SCHEMA}, '{"days"')  # out of the schema's order


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ('{"city": "Oslo", "days": 2}', True),
        ('{"city":"Oslo","days":1}', True),
        ('{"city": "Oslo", "days": 0}', False),  # minimum
        ('{"city": "Oslo", "days": 2.5}', False),  # an integer has no fraction
        ('{"city": "Oslo"}', False),  # required
        ('{"days": 2, "city": "Oslo"}', False),  # xgrammar writes properties in the schema's order
        ('{"city": "Oslo", "days": 2, "x": 1}', False),  # strict: no other properties
        ('{"city": 3, "days": 2}', False),
    ],
)
def test_json_schema_refuses_non_conforming_json(text: str, ok: bool) -> None:
    assert ends({"type": "json_schema", "json_schema": SCHEMA}, text) is ok


def test_json_completions_conform() -> None:
    for schema in [SCHEMA, {"type": "array", "items": {"type": "integer"}, "minItems": 2}, {"enum": ["x", 3]}, True]:
        state = compile_json(schema).start()
        text = state.completion()
        assert text is not None
        json.loads(text)
        assert state.feed(text) is not None
    half = compile_json(SCHEMA).start().feed('{"city": "O')
    assert half is not None and half.completion() == '","days":1}'  # the string closed, days added


@pytest.mark.parametrize(
    ("schema", "text"),
    [
        (SCHEMA, '{"city": "Paris", "days": 2}'),
        (
            {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}, "required": ["b"]},
            '{"a":"x","b":1}',
        ),
        ({"type": "array", "items": {"type": "number"}, "minItems": 2}, "[1.5, -2e3]"),
        (True, '{"a": [1, {"b": "x\\u00e9"}], "c": null}'),
    ],
)
def test_json_completes_from_any_prefix(schema: Any, text: str) -> None:
    """Wherever the model stops writing its JSON, a completion closes it the way the schema allows."""
    for cut in range(len(text)):
        state = compile_json(schema).start().feed(text[:cut])
        assert state is not None, text[:cut]
        completion = state.completion()
        assert completion is not None, text[:cut]
        after = state.feed(completion)
        assert after is not None and after.can_end(), (text[:cut], completion)


def test_chorus_tags_complete_the_way_an_engine_would_let_them() -> None:
    tool = compile_format(tool_call_format("functions", ["get_weather"])).start()
    assert tool.feed("<|channel|>final") is None  # no final answer before a required call
    assert tool.feed("<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final") is None
    thinking = tool.feed("<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>")
    assert thinking is not None and not thinking.can_end()  # a call is due
    assert thinking.completion() == " to=functions.get_weather json<|message|>{}"
    final = (
        compile_format(final_format(SCHEMA)).start().feed("<|channel|>analysis<|message|>x<|end|><|start|>assistant")
    )
    assert final is not None
    assert final.feed("<|channel|>final<|message|>") is not None
    assert final.feed("<|channel|>final<|message|>Hello") is None  # JSON is due


def test_the_final_schema_tag_holds_after_a_typed_final_header() -> None:
    """gpt-oss also writes the final header with a content type
    (``<|channel|>final <|constrain|>json<|message|>``, vLLM PR #28000): the JSON is due there too
    (the tag had only the plain header's trigger until 2026-11-28)."""
    final = compile_format(final_format(SCHEMA)).start()
    typed = final.feed(
        "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final <|constrain|>json<|message|>"
    )
    assert typed is not None
    assert typed.feed("Hello, no JSON here") is None
    answer = typed.feed(typed.completion() or "")
    assert answer is not None and answer.can_end()


def test_legacy_tags_choices_and_patterns() -> None:
    legacy = {"structures": [{"begin": "<f>", "schema": {"type": "object"}, "end": "</f>"}], "triggers": ["<f"]}
    state = compile_tag(legacy).start().feed("hi <f>{}</f> bye")
    assert state is not None and state.can_end()
    choice = compile_choice(["yes", "no"]).start()
    no = choice.feed("no")
    assert no is not None and no.can_end() and choice.feed("nope") is None
    with pytest.raises(GrammarUnsupported):
        compile_pattern("(a)\\1")
    with pytest.raises(GrammarUnsupported):
        compile_format({"type": "grammar", "grammar": "root ::= 'a'"})


PIECES = st.sampled_from(["<|channel|>", "final", "<|message|>", " to=", "functions.", "x", "{}", "<|end|>"])


@settings(max_examples=60, deadline=None)
@given(st.lists(PIECES, max_size=12).map("".join))
def test_any_prefix_the_tool_tag_allows_can_be_completed(text: str) -> None:
    state = compile_format(tool_call_format("functions", ["f"])).start().feed(text)
    if state is not None:
        completion = state.completion()
        assert completion is not None
        after = state.feed(completion)
        assert after is not None and after.can_end()
