"""Completing a partly written JSON value the shortest way the schema allows (SIMULATOR
support code for ``matcher``): close what is open, adding the required keys and items still
missing, each a minimal value of its schema (``instance.minimal_instance``) with its keys in
the schema's order, as xgrammar's JSON grammar writes them."""

from __future__ import annotations

import json
from typing import Any

from services.simengine.instance import NoInstance, minimal_instance
from services.simengine.jsonscan import (
    LITERALS,
    JsonSchema,
    Scan,
    done,
    feed,
    item_schema,
    next_keys,
    opened,
    property_schema,
    required_done,
    steered,
)


def minimal_text(schema: JsonSchema, sub: Any) -> str | None:
    """A minimal JSON value of ``sub`` as text, its object keys in the schema's order."""
    try:
        return json.dumps(_ordered(schema, minimal_instance(sub, schema.root), sub), ensure_ascii=False)
    except (NoInstance, KeyError, IndexError, TypeError, ValueError, RecursionError):
        return None


def _ordered(schema: JsonSchema, value: Any, sub: Any) -> Any:
    sub = schema.resolve(sub)
    if isinstance(value, dict):
        order = list((sub.get("properties") or {}) if isinstance(sub, dict) else {})
        keys = sorted(value, key=lambda k: order.index(k) if k in order else len(order))
        return {k: _ordered(schema, value[k], property_schema(sub, k)) for k in keys}
    if isinstance(value, list):
        return [_ordered(schema, v, item_schema(sub, i)) for i, v in enumerate(value)]
    return value


def completion(scan: Scan) -> str | None:
    """A short text that completes the value from here (checked by reading it)."""
    out = ""
    if scan.mode == "S":
        if scan.esc:
            out += "n" if scan.esc == "\\" else "0" * (5 - len(scan.esc))
        if scan.key:
            frame = scan.stack[-1]
            written = scan.tok[1:] + out
            name = next((k for k in next_keys(frame.schema, frame.seen) or [] if k.startswith(written)), written)
            value = minimal_text(scan.schema, property_schema(frame.schema, name)) or "null"
            out += name[len(written) :] + '":' + value
        else:
            low = scan.current.get("minLength", 0) if steered(scan.current) else 0
            out += "x" * max(0, int(low) - (len(scan.tok) - 1)) + '"'
    elif scan.mode == "N":
        out += "0" if scan.tok[-1] in "-.eE+" else ""
    elif scan.mode == "L":
        out += LITERALS[scan.tok[0]][len(scan.tok) :]
    elif scan.mode == "V" and not (scan.stack and scan.stack[-1].kind == "a" and opened(scan)):
        out += minimal_text(scan.schema, scan.current if scan.current is not None else True) or ""
    elif scan.mode == "C":
        frame = scan.stack[-1]
        out += ":" + (minimal_text(scan.schema, property_schema(frame.schema, frame.key or "")) or "null")
    elif scan.mode == "K2":
        frame = scan.stack[-1]
        name = (next_keys(frame.schema, frame.seen) or ["key"])[0] or "key"
        out += json.dumps(name) + ":" + (minimal_text(scan.schema, property_schema(frame.schema, name)) or "null")
    moved = _feed_all(scan, out)
    while moved is not None and moved.stack:
        tail = _closing(moved)
        out, moved = out + tail, _feed_all(moved, tail)
    return out if moved is not None and done(moved) else None


def _closing(scan: Scan) -> str:
    """What closes the innermost container minimally: its missing required keys or items (a
    number just written counts: it ends at the next character)."""
    frame = scan.stack[-1]
    out = ""
    first = opened(scan)
    pending = scan.mode == "N"
    if frame.kind == "o":
        seen = (*frame.seen, frame.key) if pending and frame.key is not None else frame.seen
        while not required_done(frame.schema, seen) and (allowed := next_keys(frame.schema, seen)):
            name = allowed[-1]
            value = minimal_text(scan.schema, property_schema(frame.schema, name)) or "null"
            out += ("" if first else ",") + json.dumps(name) + ":" + value
            seen, first = (*seen, name), False
        return out + "}"
    low = frame.schema.get("minItems", 0) if isinstance(frame.schema, dict) else 0
    for i in range(frame.count + pending, int(low)):
        out += ("" if first else ",") + (minimal_text(scan.schema, item_schema(frame.schema, i)) or "null")
        first = False
    return out + "]"


def _feed_all(scan: Scan, text: str) -> Scan | None:
    current: Scan | None = scan
    for ch in text:
        current = feed(current, ch) if current is not None else None
    return current
