"""Request bodies -> our own pydantic models (the openai types are TypedDicts), so anything a
client gets wrong is a 400 that names the field, never a 500.

JSON is read with orjson (invalid UTF-8 and lone surrogates are refused) and nested at most
``MAX_DEPTH`` deep (deeper structures are the caller's mistake, not a RecursionError later)."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from contracts.errors import ErrorCode
from services.gateway.errors import invalid

M = TypeVar("M", bound=BaseModel)
MAX_DEPTH = 64


def depth(value: Any) -> int:
    """How deep containers nest in ``value``, counted up to ``MAX_DEPTH + 1`` (level by level,
    only containers kept: deep input cannot exhaust the stack, and an agent's long history is
    walked at a third of the cost of visiting every value)."""
    if not isinstance(value, (dict, list)):
        return 0
    deepest, level = 1, [value]
    while deepest <= MAX_DEPTH:
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, (dict, list))  # (a tuple: faster than a union type here)
        ]
        if not level:
            break
        deepest += 1
    return deepest


def parse_json(raw: bytes) -> Any:
    if not raw.strip():
        raise invalid("The request body is empty; send a JSON object.")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid(f"The request body is not valid JSON (UTF-8, no lone surrogates): {exc}") from None
    # nesting past the limit needs that many brackets: most bodies are not walked at all
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and depth(data) > MAX_DEPTH:
        raise invalid(f"The request body nests JSON deeper than {MAX_DEPTH} levels.")
    return data


def param_of(loc: tuple[int | str, ...], data: Any) -> str:
    """A validation error's location as a request path (``input[2].call_id``), without the
    union branch labels pydantic adds: a name that is not a key of the data there is one."""
    out = ""
    node = data
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(part, int):
            out += f"[{part}]"
            node = node[part] if isinstance(node, list) and -len(node) <= part < len(node) else None
        elif isinstance(node, dict) and part in node:
            out += ("." if out else "") + part
            node = node[part]
        elif not isinstance(node, dict) or not last or "[" in part:
            continue  # a union branch or a type label (a missing key is the last part)
        else:
            out += ("." if out else "") + part
            node = None
    return out


# what a pydantic error of a wrong JSON type expected, in the words of OpenAI's messages
EXPECTED = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "a boolean",
    "bool_parsing": "a boolean",
    "list_type": "an array",
    "tuple_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "dataclass_type": "an object",
}


def json_type(value: Any) -> str:
    """What a JSON value is, as OpenAI's messages name it."""
    if value is None:
        return "null"
    for kind, name in ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string")):
        if isinstance(value, kind):
            return name
    return "an array" if isinstance(value, list) else "an object"


# pydantic's errors of a number past a bound: the bound's key, OpenAI's comparison, and the
# side as OpenAI's code and message name it
BOUNDS = {
    "greater_than_equal": ("ge", ">=", "below_min", "below minimum"),
    "greater_than": ("gt", ">", "below_min", "below minimum"),
    "less_than_equal": ("le", "<=", "above_max", "above maximum"),
    "less_than": ("lt", "<", "above_max", "above maximum"),
}


def _number(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def out_of_bounds(kind: str, param: str, ctx: dict[str, Any], given: Any) -> tuple[ErrorCode, str] | None:
    """A number, array or string past a bound, in OpenAI's codes and words. A number field's
    kind is told by its bound: a float bound is a decimal field (the request models write
    ``ge=0.0`` for those), an int bound an integer one."""
    if kind in BOUNDS:
        key, op, side, words = BOUNDS[kind]
        bound = ctx.get(key)
        number = "decimal" if isinstance(bound, float) else "integer"
        return ErrorCode(f"{number}_{side}_value"), (
            f"Invalid '{param}': {number} {words} value. "
            f"Expected a value {op} {_number(bound)}, but got {_number(given)} instead."
        )
    if kind in ("too_short", "too_long") and ctx.get("field_type") == "List":
        actual = ctx.get("actual_length")
        if kind == "too_long":
            return ErrorCode.ARRAY_ABOVE_MAX_LENGTH, (
                f"Invalid '{param}': array too long. Expected an array with maximum length "
                f"{ctx.get('max_length')}, but got an array with length {actual} instead."
            )
        if actual == 0:
            return ErrorCode.EMPTY_ARRAY, (
                f"Invalid '{param}': empty array. Expected an array with minimum length "
                f"{ctx.get('min_length')}, but got an empty array instead."
            )
        return ErrorCode.ARRAY_BELOW_MIN_LENGTH, (
            f"Invalid '{param}': array too short. Expected an array with minimum length "
            f"{ctx.get('min_length')}, but got an array with length {actual} instead."
        )
    if kind == "string_too_long":
        return ErrorCode.STRING_ABOVE_MAX_LENGTH, (
            f"Invalid '{param}': string too long. Expected a string with maximum length "
            f"{ctx.get('max_length')}, but got a string with length {len(str(given))} instead."
        )
    if kind == "string_too_short":
        got = "an empty string" if given == "" else f"a string with length {len(str(given))}"
        return ErrorCode.STRING_BELOW_MIN_LENGTH, (
            f"Invalid '{param}': string too short. Expected a string with minimum length "
            f"{ctx.get('min_length')}, but got {got} instead."
        )
    return None


def problem(kind: str, param: str, msg: str, given: Any, ctx: dict[str, Any] | None = None) -> tuple[ErrorCode, str]:
    """A validation error as OpenAI reports it: its code and message."""
    if kind == "extra_forbidden":
        return ErrorCode.UNKNOWN_PARAMETER, f"Unrecognized request argument supplied: {param}"
    if kind == "missing":
        return ErrorCode.MISSING_REQUIRED_PARAMETER, f"Missing required parameter: '{param}'."
    if (expected := EXPECTED.get(kind)) is not None:
        return (
            ErrorCode.INVALID_TYPE,
            f"Invalid type for '{param}': expected {expected}, but got {json_type(given)} instead.",
        )
    if (bounded := out_of_bounds(kind, param, ctx or {}, given)) is not None:
        return bounded
    return ErrorCode.INVALID_VALUE, f"Invalid value for '{param}': {msg}"


def validate(data: Any, model: type[M], *, ignore_unknown: bool = False) -> M:
    if not isinstance(data, dict):
        raise invalid("The request body must be a JSON object.")
    if ignore_unknown:
        data = {k: v for k, v in data.items() if k in model.model_fields}
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        # pydantic reports every union branch; the deepest error is the most specific one
        first = max(errors, key=lambda e: len(e.get("loc", ())))
        param = param_of(tuple(first.get("loc", ())), data)
        code, message = problem(
            str(first.get("type", "")), param, str(first.get("msg", "invalid")), first.get("input"), first.get("ctx")
        )
        raise invalid(message, param or None, code) from None


def parse_body(raw: bytes, model: type[M], *, ignore_unknown: bool = False) -> M:
    return validate(parse_json(raw), model, ignore_unknown=ignore_unknown)
