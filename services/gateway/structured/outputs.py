"""Structured outputs and forced tool calls, for both APIs: what the encoder renders (Harmony's
"# Response Formats"), what the engine enforces (an ``OutputConstraint``: a grammar on the final
channel, or on the next call), and the check of the final text against the schema."""

from __future__ import annotations

import json
from typing import Any, Literal

import jsonschema

from contracts.messages.encode import ResponseFormat
from contracts.messages.generate import OutputConstraint

ANY_OBJECT: dict[str, Any] = {"type": "object"}


def response_format(
    kind: Literal["json_object", "json_schema"],
    *,
    name: str = "response",
    schema: dict[str, Any] | None = None,
    description: str | None = None,
    strict: bool | None = None,
) -> ResponseFormat:
    return ResponseFormat(
        name=name,
        description=description,
        json_schema=schema or ANY_OBJECT,
        strict=bool(strict) if kind == "json_schema" else False,
    )


def constraint(fmt: ResponseFormat | None, choice: str | None, offered: list[str]) -> OutputConstraint | None:
    """The grammar the engine applies: the final answer's schema, and a required call (to any
    offered function for ``required``, to the named one for a named choice)."""
    tools: list[str] = []
    if choice == "required":
        tools = list(offered)
    elif choice not in (None, "auto", "none"):
        tools = [choice]
    if fmt is None and not tools:
        return None
    return OutputConstraint(final_schema=fmt.json_schema if fmt is not None else None, tools=tools)


def check(text: str, fmt: ResponseFormat) -> str | None:
    """Why the final text does not follow the format (None when it does)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"the answer is not JSON: {exc}"
    except RecursionError:
        return "the answer nests too deeply to be read"
    try:
        jsonschema.validate(value, fmt.json_schema)
    except jsonschema.ValidationError as exc:
        return f"the answer does not match the schema '{fmt.name}': {exc.message}"
    except jsonschema.SchemaError as exc:
        return f"the schema '{fmt.name}' is not a valid JSON schema: {exc.message}"
    except RecursionError:  # a recursive schema, an answer nested hundreds deep
        return f"the answer nests too deeply to be checked against the schema '{fmt.name}'"
    return None


def schema_error(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` is not a JSON schema a validator accepts (None when it is)."""
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        message: str = exc.message
        return message
    return None
