"""Schemas no answer can satisfy are the caller's mistake (a 400 before any work), not the
model's failure after it."""

from __future__ import annotations

from typing import Any

import pytest

from services.gateway.structured.schemas import schema_problem

OBJ = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}


@pytest.mark.parametrize(
    "schema",
    [
        {"enum": []},
        {"not": {}},
        {"type": "integer", "minimum": 5, "maximum": 1},
        {"type": "string", "minLength": 3, "maxLength": 2},
        {"type": "object", "properties": {}, "required": ["x"], "additionalProperties": False},
        {**OBJ, "properties": {"a": {"enum": []}}},
        {**OBJ, "properties": {"a": False}},
        {"allOf": [{"type": "array", "minItems": 2, "maxItems": 1}]},
    ],
)
def test_unsatisfiable_where_every_answer_must_hold(schema: dict[str, Any]) -> None:
    assert schema_problem(schema) is not None


@pytest.mark.parametrize(
    "schema",
    [
        OBJ,
        {"type": "object", "properties": {"a": {"enum": []}}},  # optional: the answer can leave it out
        {"anyOf": [{"enum": []}, {"type": "string"}]},  # one branch is enough
        {"type": "integer", "minimum": 1, "maximum": 1},
        {"type": "object", "properties": {"a": {}}, "required": ["a"], "additionalProperties": False},
    ],
)
def test_satisfiable_schemas_pass(schema: dict[str, Any]) -> None:
    assert schema_problem(schema) is None
