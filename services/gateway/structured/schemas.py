"""A client's JSON schema (``response_format`` / ``text.format``), checked before anything is
generated: what a validator would trip over only when it checks the model's answer (a 500
after the work is done, or a validator recursing forever) is the caller's mistake, a 400.

- ``$schema``, when given, is a string (a validator looks it up by name);
- the schema is valid under its draft's meta-schema (``structured.schema_error``);
- its references resolve, and no chain of them comes back to where it started without reading
  into the value.

Supported, as the engines' grammar compilers support them: ``$ref`` to ``#`` or a JSON pointer
``#/...`` inside the same schema. Not supported: references to other documents or anchors,
``$dynamicRef`` / ``$recursiveRef``, and a nested ``$id`` (which would re-base the references
under it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeGuard
from urllib.parse import unquote

from services.gateway.structured.outputs import schema_error

Path = tuple[str | int, ...]

# values, not schemas: a "$ref" inside them is data
DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
# objects whose keys are names (a property called "enum" is a schema like any other)
NAME_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"})
# keywords whose subschemas apply to the same value as their schema (no input is read)
IN_PLACE_LISTS = ("allOf", "anyOf", "oneOf")
IN_PLACE_ONE = ("not", "if", "then", "else")
IN_PLACE_MAPS = ("dependentSchemas",)


class SchemaRefError(ValueError):
    pass


def schema_problem(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` cannot be used to check an answer (None when it can)."""
    if "$schema" in schema and not isinstance(schema["$schema"], str):
        return "'$schema' must be a string naming a JSON schema draft"
    return schema_error(schema) or reference_error(schema) or contradiction(schema)


BOUNDS = (
    ("minimum", "maximum"),
    ("minLength", "maxLength"),
    ("minItems", "maxItems"),
    ("minProperties", "maxProperties"),
)


def contradiction(schema: Any) -> str | None:
    """A part every answer must satisfy (the schema itself, its required properties, its
    ``allOf``) that no value can: the engines' grammars could produce no answer, and the check
    of the answer would fail after the work is done. References are not followed."""
    stack: list[tuple[Any, str]] = [(schema, "the schema")]
    while stack:
        node, where = stack.pop()
        if node is False:
            return f"{where} accepts no value"
        if not isinstance(node, dict):
            continue
        if node.get("enum") == []:
            return f"{where} has an empty enum: no value can match it"
        if node.get("not") in ({}, True):
            return f"{where} forbids every value ('not': {{}})"
        for low, high in BOUNDS:
            lo, hi = node.get(low), node.get(high)
            if _number(lo) and _number(hi) and lo > hi:
                return f"{where} has {low} {lo} above {high} {hi}"
        given = node.get("properties")
        props: dict[str, Any] = given if isinstance(given, dict) else {}
        required = (
            [r for r in node.get("required") or [] if isinstance(r, str)]
            if isinstance(node.get("required"), list)
            else []
        )
        closed = node.get("additionalProperties") is False and not node.get("patternProperties")
        if closed and (missing := [r for r in required if r not in props]):
            return f"{where} requires the property {missing[0]!r} but allows only {sorted(props)}"
        stack.extend((props[r], f"the property {r!r}") for r in required if r in props)
        if isinstance(node.get("allOf"), list):
            stack.extend((sub, where) for sub in node["allOf"])
    return None


def _number(value: Any) -> TypeGuard[float]:
    """A JSON number (not a boolean, which Python counts as an int)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def reference_error(schema: Any) -> str | None:
    """Why the references of ``schema`` cannot be followed (None when they can)."""
    try:
        _check(schema)
    except SchemaRefError as exc:
        return str(exc)
    return None


def _nodes(schema: Any) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every object at a schema position, with its path (iteratively: depth is bounded by
    the request's JSON nesting, but a stack is cheaper than recursion)."""
    stack: list[tuple[Path, Any, bool]] = [((), schema, False)]
    while stack:
        path, node, names = stack.pop()
        if isinstance(node, dict) and names:
            stack.extend(((*path, k), v, False) for k, v in node.items())
        elif isinstance(node, dict):
            yield path, node
            stack.extend(((*path, k), v, k in NAME_MAPS) for k, v in node.items() if k not in DATA_KEYWORDS)
        elif isinstance(node, list):
            stack.extend(((*path, i), v, False) for i, v in enumerate(node))


def _target(root: Any, ref: str) -> Path:
    if ref != "#" and not ref.startswith("#/"):
        raise SchemaRefError(
            f"the reference {ref!r} does not point inside the schema; only '#' and '#/...' references are supported"
        )
    node, names = root, False
    path: list[str | int] = []
    for raw in ref[2:].split("/") if ref != "#" else []:
        part = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node and (names or part not in DATA_KEYWORDS):
            node, names = node[part], not names and part in NAME_MAPS
            path.append(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node, names = node[int(part)], False
            path.append(int(part))
        else:
            raise SchemaRefError(f"the reference {ref!r} points to nothing in the schema")
    if not isinstance(node, dict | bool):
        raise SchemaRefError(f"the reference {ref!r} does not point to a schema")
    return tuple(path)


def _check(schema: Any) -> None:
    edges: dict[Path, list[Path]] = {}  # schema -> the schemas it applies to the same value
    for path, node in _nodes(schema):
        for keyword in ("$dynamicRef", "$recursiveRef"):
            if isinstance(node.get(keyword), str):
                raise SchemaRefError(f"'{keyword}' is not supported; use '$ref' to '#/$defs/...'")
        if path and isinstance(node.get("$id"), str):
            raise SchemaRefError("'$id' inside a schema is not supported (it re-bases references)")
        out = edges.setdefault(path, [])
        ref = node.get("$ref")
        if isinstance(ref, str):
            out.append(_target(schema, ref))
        for keyword in IN_PLACE_LISTS:
            if isinstance(node.get(keyword), list):
                out += [(*path, keyword, i) for i in range(len(node[keyword]))]
        out += [(*path, keyword) for keyword in IN_PLACE_ONE if keyword in node]
        for keyword in IN_PLACE_MAPS:
            if isinstance(node.get(keyword), dict):
                out += [(*path, keyword, name) for name in node[keyword]]
    _no_loop(edges)


def _no_loop(edges: dict[Path, list[Path]]) -> None:
    """A cycle of in-place applications (``{"$ref": "#"}``, ``{"anyOf": [{"$ref": "#"}]}``)
    never reaches a value: depth-first search, iteratively."""
    done: set[Path] = set()
    for start in edges:
        if start in done:
            continue
        on_path = {start}
        stack = [(start, iter(edges.get(start, ())))]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                on_path.discard(node)
                done.add(node)
            elif child in on_path:
                where = "#" + "".join(f"/{p}" for p in child)
                raise SchemaRefError(f"the references at {where} loop back to it without reading any part of the value")
            elif child not in done:
                on_path.add(child)
                stack.append((child, iter(edges.get(child, ()))))
