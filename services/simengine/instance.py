"""A minimal JSON value that conforms to a JSON schema (SIMULATOR support code): what the
simulated model answers when a response format or a grammar asks for the schema's JSON.

Minimal: an object holds its required properties only, an array its minimum number of items,
a string is empty unless it must be longer (or has a known ``format``), a number is 0 or the
nearest bound. ``const``/``enum`` give their first value, ``anyOf``/``oneOf`` their first
alternative that can be built, ``allOf`` its merged parts; local ``$ref``s are followed."""

from __future__ import annotations

import math
from typing import Any

_FORMATS = {
    "date-time": "1970-01-01T00:00:00Z",
    "date": "1970-01-01",
    "time": "00:00:00Z",
    "email": "user@example.com",
    "hostname": "example.com",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
    "uri": "https://example.com",
    "uri-reference": "https://example.com",
    "uuid": "00000000-0000-0000-0000-000000000000",
    "duration": "P1D",
}
_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
_MAX_DEPTH = 32


class NoInstance(ValueError):
    """The schema admits no value this builder can find (``false``, a cycle of required refs)."""


def minimal_instance(schema: Any, root: Any = None) -> Any:
    """``root``: the schema ``schema`` belongs to, for its ``$ref``s (default: itself)."""
    return _build(schema, schema if root is None else root, 0)


def _resolve(root: Any, ref: str) -> Any:
    if not ref.startswith("#"):
        raise NoInstance(f"only local $refs are followed, not {ref!r}")
    node = root
    for part in ref.lstrip("#").split("/"):
        if not part:
            continue
        part = part.replace("~1", "/").replace("~0", "~")
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def _merged(schema: dict[str, Any]) -> dict[str, Any]:
    """``allOf`` folded into one schema (properties and required lists joined)."""
    out = {k: v for k, v in schema.items() if k != "allOf"}
    for part in schema["allOf"]:
        if not isinstance(part, dict):
            continue
        for key, value in part.items():
            if key == "properties":
                out["properties"] = {**out.get("properties", {}), **value}
            elif key == "required":
                out["required"] = [*out.get("required", []), *value]
            else:
                out.setdefault(key, value)
    return out


def _type_of(schema: dict[str, Any]) -> str | None:
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds: list[str | None] = [k for k in kind if k in _TYPES]
        non_null = [k for k in kinds if k != "null"]
        return (non_null or kinds or [None])[0]
    if kind in _TYPES:
        name: str = kind
        return name
    if "properties" in schema or "required" in schema or "additionalProperties" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    if any(k in schema for k in ("minLength", "maxLength", "pattern", "format")):
        return "string"
    if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
        return "number"
    return None


def _build(schema: Any, root: Any, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise NoInstance("the schema nests too deeply (a cycle of required references?)")
    if schema is True or schema == {}:
        return {}
    if schema is False or not isinstance(schema, dict):
        raise NoInstance("no value conforms to the schema false")
    if "$ref" in schema:
        return _build(_resolve(root, schema["$ref"]), root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    if isinstance(schema.get("allOf"), list):
        return _build(_merged(schema), root, depth + 1)
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            for option in schema[key]:
                try:
                    return _build(
                        {**{k: v for k, v in schema.items() if k != key}, **option}
                        if isinstance(option, dict)
                        else option,
                        root,
                        depth + 1,
                    )
                except (NoInstance, KeyError, IndexError, TypeError):
                    continue
            raise NoInstance(f"no alternative of {key} can be built")
    kind = _type_of(schema)
    if kind == "object":
        return _object(schema, root, depth)
    if kind == "array":
        return _array(schema, root, depth)
    if kind == "string":
        return _string(schema)
    if kind in ("integer", "number"):
        return _number(schema, kind == "integer")
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return {}


def _object(schema: dict[str, Any], root: Any, depth: int) -> dict[str, Any]:
    properties = schema.get("properties") or {}
    extra = schema.get("additionalProperties", True)
    out: dict[str, Any] = {}
    for name in dict.fromkeys(schema.get("required") or []):
        sub = properties.get(name, extra if isinstance(extra, dict) else True)
        out[name] = _build(sub, root, depth + 1)
    return out


def _array(schema: dict[str, Any], root: Any, depth: int) -> list[Any]:
    prefix = schema.get("prefixItems") or []
    items = schema.get("items", True)
    if isinstance(items, list):  # draft 4-7 tuple form
        prefix, items = items, schema.get("additionalItems", True)
    count = max(int(schema.get("minItems", 0)), 0)
    out = [_build(prefix[i], root, depth + 1) for i in range(min(count, len(prefix)))]
    while len(out) < count:
        out.append(_build(items, root, depth + 1))
    return out


def _string(schema: dict[str, Any]) -> str:
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt in _FORMATS:
        return _FORMATS[fmt]
    return "x" * max(int(schema.get("minLength", 0)), 0)


def _number(schema: dict[str, Any], integer: bool) -> int | float:
    low, high = schema.get("minimum"), schema.get("maximum")
    xlow, xhigh = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if isinstance(xlow, bool):  # draft 4: a flag on minimum/maximum
        xlow, low = (low if xlow else None), (None if xlow else low)
    if isinstance(xhigh, bool):
        xhigh, high = (high if xhigh else None), (None if xhigh else high)
    value: float = 0
    if low is not None and value < low:
        value = low
    if xlow is not None and value <= xlow:
        value = xlow + 1 if integer else xlow + (abs(xlow) or 1) * 1e-6
    if high is not None and value > high:
        value = high
    if xhigh is not None and value >= xhigh:
        value = xhigh - 1 if integer else xhigh - (abs(xhigh) or 1) * 1e-6
    step = schema.get("multipleOf")
    if isinstance(step, int | float) and step > 0 and value % step:
        value = math.ceil(value / step) * step
    if integer:
        return int(math.ceil(value))
    return int(value) if float(value).is_integer() else value
