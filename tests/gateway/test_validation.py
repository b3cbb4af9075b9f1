"""A request body that does not validate is a 400 in OpenAI's own terms: the code
(missing_required_parameter, unknown_parameter, invalid_type, the bounds' own codes such as
decimal_above_max_value or empty_array, invalid_value), the parameter's path, and a message in
OpenAI's wording."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from pydantic import BaseModel

from contracts.errors import ErrorCode
from services.common.errors import ChorusError
from services.gateway import validation
from services.gateway.chat.request import ChatRequest
from services.gateway.responses.request import ResponsesRequest
from services.gateway.validation import MAX_DEPTH, depth, json_type, parse_body, parse_json, validate

HI = [{"role": "user", "content": "hi"}]
CASES: list[tuple[type[BaseModel], dict[str, Any], ErrorCode, str, str]] = [
    (
        ChatRequest,
        {"model": "m"},
        ErrorCode.MISSING_REQUIRED_PARAMETER,
        "messages",
        "Missing required parameter: 'messages'.",
    ),
    (
        ChatRequest,
        {"model": "m", "messages": HI, "foo": 1},
        ErrorCode.UNKNOWN_PARAMETER,
        "foo",
        "Unrecognized request argument supplied: foo",
    ),
    (
        ChatRequest,
        {"model": "m", "messages": HI, "max_tokens": "ten"},
        ErrorCode.INVALID_TYPE,
        "max_tokens",
        "Invalid type for 'max_tokens': expected an integer, but got a string instead.",
    ),
    (
        ChatRequest,
        {"model": "m", "messages": "hi"},
        ErrorCode.INVALID_TYPE,
        "messages",
        "Invalid type for 'messages': expected an array, but got a string instead.",
    ),
    (
        ChatRequest,
        {"model": "m", "messages": HI, "temperature": 9},
        ErrorCode.DECIMAL_ABOVE_MAX_VALUE,
        "temperature",
        "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 9 instead.",
    ),
    (
        ChatRequest,
        {"model": "m", "messages": HI, "top_p": 0},
        ErrorCode.DECIMAL_BELOW_MIN_VALUE,
        "top_p",
        "Invalid 'top_p': decimal below minimum value. Expected a value > 0, but got 0 instead.",
    ),
    (
        ChatRequest,
        {"model": "m", "messages": HI, "frequency_penalty": -2.5},
        ErrorCode.DECIMAL_BELOW_MIN_VALUE,
        "frequency_penalty",
        "Invalid 'frequency_penalty': decimal below minimum value. Expected a value >= -2, but got -2.5 instead.",
    ),
    (
        ChatRequest,
        {"model": "m", "messages": HI, "max_tokens": 0},
        ErrorCode.INTEGER_BELOW_MIN_VALUE,
        "max_tokens",
        "Invalid 'max_tokens': integer below minimum value. Expected a value >= 1, but got 0 instead.",
    ),
    (
        ResponsesRequest,
        {"model": "m", "input": "hi", "top_logprobs": 21},
        ErrorCode.INTEGER_ABOVE_MAX_VALUE,
        "top_logprobs",
        "Invalid 'top_logprobs': integer above maximum value. Expected a value <= 20, but got 21 instead.",
    ),
    (
        ChatRequest,
        {"model": "m", "messages": []},
        ErrorCode.EMPTY_ARRAY,
        "messages",
        "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
    ),
    (
        ChatRequest,
        {
            "model": "m",
            "messages": HI,
            "tools": [{"type": "function", "function": {"name": f"t{i}"}} for i in range(513)],
        },
        ErrorCode.ARRAY_ABOVE_MAX_LENGTH,
        "tools",
        "Invalid 'tools': array too long. Expected an array with maximum length 512, but got an array with length 513"
        " instead.",
    ),
    (
        ChatRequest,
        {"model": "", "messages": HI},
        ErrorCode.STRING_BELOW_MIN_LENGTH,
        "model",
        "Invalid 'model': string too short. Expected a string with minimum length 1, but got an empty string instead.",
    ),
    (
        ChatRequest,
        {"model": "m", "messages": HI, "user": "u" * 513},
        ErrorCode.STRING_ABOVE_MAX_LENGTH,
        "user",
        "Invalid 'user': string too long. Expected a string with maximum length 512, but got a string with length 513"
        " instead.",
    ),
    (
        ChatRequest,
        {"model": "m", "messages": HI, "metadata": {f"k{i}": "v" for i in range(17)}},
        ErrorCode.INVALID_VALUE,
        "metadata",
        "Invalid value for 'metadata': ",
    ),
    (
        ChatRequest,
        {"model": "m", "messages": [{"role": "wizard", "content": "hi"}]},
        ErrorCode.INVALID_VALUE,
        "messages[0].role",
        "Invalid value for 'messages[0].role': ",
    ),
    (
        ResponsesRequest,
        {"input": "hi"},
        ErrorCode.MISSING_REQUIRED_PARAMETER,
        "model",
        "Missing required parameter: 'model'.",
    ),
    (
        ResponsesRequest,
        {"model": "m", "input": "hi", "max_output_tokens": [1]},
        ErrorCode.INVALID_TYPE,
        "max_output_tokens",
        "Invalid type for 'max_output_tokens': expected an integer, but got an array instead.",
    ),
]


@pytest.mark.parametrize(("model", "body", "code", "param", "message"), CASES)
def test_a_body_that_does_not_validate_says_what_and_where_in_openais_terms(
    model: type[BaseModel], body: dict[str, Any], code: ErrorCode, param: str, message: str
) -> None:
    with pytest.raises(ChorusError) as raised:
        validate(body, model)
    error = raised.value.error
    assert (error.code, error.param) == (code, param)
    assert error.message.startswith(message)
    assert raised.value.status_code == 400
    assert error.openai_body()["error"]["type"] == "invalid_request_error"


def test_json_types_are_named_as_openai_names_them() -> None:
    named = [json_type(v) for v in (None, True, 3, 1.5, "s", [1], {"a": 1})]
    assert named == ["null", "a boolean", "an integer", "a number", "a string", "an array", "an object"]


def test_what_is_not_a_json_object_is_the_generic_invalid_request() -> None:
    for raw in (b"", b"[1]", b"{"):
        with pytest.raises(ChorusError) as raised:
            parse_body(raw, ChatRequest)
        assert raised.value.error.code == ErrorCode.INVALID_REQUEST


def nested(levels: int) -> Any:
    value: Any = []
    for i in range(levels - 1):
        value = [value] if i % 2 else {"k": value}
    return value


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, 0),
        ("s", 0),
        ([], 1),
        ({}, 1),
        ({"a": 1, "b": "x"}, 1),
        ([1, [2, [3]], {"a": {"b": []}}], 4),
        ({"a": [[[]]], "b": {"c": [{}]}}, 4),
        (nested(MAX_DEPTH), MAX_DEPTH),
        (nested(MAX_DEPTH + 1), MAX_DEPTH + 1),
        (nested(10_000), MAX_DEPTH + 1),  # counted no further than the limit, without recursion
    ],
)
def test_depth_counts_the_deepest_nesting(value: Any, expected: int) -> None:
    assert depth(value) == expected


def test_a_body_nesting_past_the_limit_is_refused_and_one_at_it_is_not() -> None:
    at_limit = orjson.dumps({"model": "m", "metadata": nested(MAX_DEPTH - 1)})
    assert depth(parse_json(at_limit)) == MAX_DEPTH
    with pytest.raises(ChorusError) as raised:
        parse_json(orjson.dumps({"model": "m", "metadata": nested(MAX_DEPTH)}))
    assert raised.value.error.message == f"The request body nests JSON deeper than {MAX_DEPTH} levels."
    brackets_in_text = orjson.dumps({"content": "[" * 1000})  # many brackets, all in a string
    assert parse_json(brackets_in_text) == {"content": "[" * 1000}


def test_a_body_with_fewer_brackets_than_the_limit_is_not_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    walked: list[Any] = []

    def counted(value: Any) -> int:
        walked.append(value)
        return 1

    monkeypatch.setattr(validation, "depth", counted)
    parse_json(orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
    assert walked == []  # every chat request of a few messages: no walk at all
    parse_json(orjson.dumps({"model": "m", "input": [{"role": "user", "content": "hi"}] * MAX_DEPTH}))
    assert len(walked) == 1
