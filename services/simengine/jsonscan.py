"""An incremental JSON reader guided by a JSON schema, one character at a time (SIMULATOR support
code for the structural-tag ``json_schema`` format and the engines' JSON grammars).

It follows xgrammar's JSON grammar as vLLM and SGLang compile it (``any_whitespace`` and
``strict_mode`` on): no whitespace before or after the value, any whitespace between its
tokens; an object writes its declared properties in the schema's order (optional ones may be
skipped) and, in strict mode, no others unless ``additionalProperties`` allows them, after the
declared ones; an integer has no fraction or exponent. The schema steers each value's first
character (``type``, ``enum``, ``const``), the object keys, ``required`` before ``}``, and
``minItems``/``maxItems``; every finished value is checked against its schema with
``jsonschema`` (what the reader does not steer, say ``minimum``, is refused only then, where
xgrammar refuses earlier). ``anyOf``-like schemas are not steered, only checked."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

import jsonschema

_WS = " \t\n\r"
_NUMBER_PREFIX = re.compile(r"-?((0|[1-9]\d*)(\.|\.\d+([eE][+-]?\d*)?|[eE][+-]?\d*)?)?")
_NUMBER = re.compile(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?")
LITERALS = {"t": "true", "f": "false", "n": "null"}
_DIGITS = "-0123456789"
_STARTS = {
    "object": "{",
    "array": "[",
    "string": '"',
    "number": _DIGITS,
    "integer": _DIGITS,
    "boolean": "tf",
    "null": "n",
}
_UNSTEERED = ("anyOf", "oneOf", "allOf", "not", "if", "$ref", "patternProperties", "dependentSchemas")


@dataclass(frozen=True, eq=False)
class Frame:
    kind: str  # "o" | "a"
    schema: Any  # the container's schema (resolved), None when not steered
    start: int  # index of its opening bracket in the text
    seen: tuple[str, ...] = ()  # object: keys written
    key: str | None = None  # object: the key whose value comes next
    count: int = 0  # array: items written


@dataclass(frozen=True, eq=False)
class Scan:
    """Where the reader is. ``mode``: V a value is due, S in a string, N in a number, L in a
    literal, A after a value in a container, K after ``{`` (a key or ``}``), K2 after ``,`` in an
    object (a key), C a colon is due, D the value is complete."""

    schema: JsonSchema
    text: str = ""
    mode: str = "V"
    stack: tuple[Frame, ...] = ()
    tok: str = ""  # the scalar (or key) being read, as written
    esc: str = ""  # inside a string: "" | "\\" | "u" + hex digits so far
    key: bool = False  # the string being read is an object key
    current: Any = None  # the schema of the value being read or due (resolved), None: any


class JsonSchema:
    """A schema and what reading against it needs (its validator, ``$ref`` resolution)."""

    def __init__(self, schema: Any) -> None:
        self.root = schema
        self.validator = jsonschema.validators.validator_for(schema if isinstance(schema, dict) else {})(schema)

    def resolve(self, schema: Any, depth: int = 0) -> Any:
        while isinstance(schema, dict) and "$ref" in schema and depth < 32:
            ref = schema["$ref"]
            if not isinstance(ref, str) or not ref.startswith("#"):
                return schema
            node: Any = self.root
            for part in filter(None, ref[1:].split("/")):
                part = part.replace("~1", "/").replace("~0", "~")
                node = node[int(part)] if isinstance(node, list) else node.get(part)
            extra = {k: v for k, v in schema.items() if k != "$ref"}
            schema = {**node, **extra} if extra and isinstance(node, dict) else node
            depth += 1
        return schema

    def valid(self, value: Any, schema: Any) -> bool:
        if schema is None:
            return True
        return bool(self.validator.evolve(schema=schema).is_valid(value))

    def start(self) -> Scan:
        return Scan(self, current=self.resolve(self.root))


def steered(schema: Any) -> bool:
    return isinstance(schema, dict) and not any(k in schema for k in _UNSTEERED)


def _starts(schema: Any) -> str | None:
    """The characters a value of ``schema`` may begin with (None: any value)."""
    if schema is False:
        return ""
    if not steered(schema):
        return None
    if "const" in schema:
        return json.dumps(schema["const"])[:1]
    if isinstance(schema.get("enum"), list):
        return "".join(json.dumps(v)[:1] for v in schema["enum"])
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if isinstance(kind, str) else []
    return "".join(_STARTS.get(k, "") for k in kinds) if kinds else None


def property_schema(schema: Any, key: str) -> Any:
    if not isinstance(schema, dict):
        return True
    props = schema.get("properties") or {}
    if key in props:
        return props[key]
    extra = schema.get("additionalProperties", True)
    return extra if isinstance(extra, dict) else True


def item_schema(schema: Any, index: int) -> Any:
    if not isinstance(schema, dict):
        return True
    prefix = schema.get("prefixItems") or []
    items = schema.get("items", True)
    if isinstance(items, list):
        prefix, items = items, schema.get("additionalItems", True)
    return prefix[index] if index < len(prefix) else items


def next_keys(schema: Any, seen: tuple[str, ...]) -> list[str] | None:
    """The keys an object may write next, in the schema's order; ``""`` stands for any key the
    schema does not declare (None: any key at all)."""
    if not steered(schema) or "properties" not in schema:
        return None
    declared = list(schema.get("properties") or {})
    required = [k for k in schema.get("required") or [] if k in declared]
    extra = schema.get("additionalProperties") not in (None, False)
    if any(k not in declared for k in seen):  # an undeclared key was written: only those follow
        return [""] if extra else []
    last = max((declared.index(k) for k in seen), default=-1)
    out = []
    for name in declared[last + 1 :]:
        out.append(name)
        if name in required:  # a required key cannot be skipped
            return out
    return [*out, ""] if extra else out


def _key_allowed(schema: Any, seen: tuple[str, ...], key: str, *, prefix: bool) -> bool:
    allowed = next_keys(schema, seen)
    if allowed is None:
        return True
    declared = schema.get("properties") or {}
    if "" in allowed and (prefix or key not in declared):
        return True
    return any(k.startswith(key) if prefix else k == key for k in allowed if k)


def required_done(schema: Any, seen: tuple[str, ...]) -> bool:
    if not isinstance(schema, dict):
        return True
    return all(k in seen for k in schema.get("required") or [])


def feed(scan: Scan, ch: str) -> Scan | None:
    """The reader after one more character, None if it cannot be there."""
    mode = scan.mode
    if mode == "S":
        return _string(scan, ch)
    if mode == "N":
        tok = scan.tok + ch
        if _NUMBER_PREFIX.fullmatch(tok) and not (_is_integer(scan.current) and ch in ".eE"):
            return replace(scan, text=scan.text + ch, tok=tok)
        if not scan.stack or not _NUMBER.fullmatch(scan.tok):
            return None
        done = _scalar_done(scan, json.loads(scan.tok))
        return None if done is None else feed(done, ch)
    if mode == "L":
        tok = scan.tok + ch
        word = LITERALS[tok[0]]
        if not word.startswith(tok):
            return None
        moved = replace(scan, text=scan.text + ch, tok=tok)
        return _scalar_done(moved, json.loads(tok)) if tok == word else moved
    if mode == "D":
        return None
    if ch in _WS:
        return replace(scan, text=scan.text + ch) if scan.text else None
    if mode == "V":
        return _value(scan, ch)
    frame = scan.stack[-1]
    if mode == "C":
        return (
            replace(
                scan,
                text=scan.text + ch,
                mode="V",
                current=scan.schema.resolve(property_schema(frame.schema, frame.key or "")),
            )
            if ch == ":"
            else None
        )
    if mode in ("K", "K2"):
        if ch == '"':
            return replace(scan, text=scan.text + ch, mode="S", tok=ch, key=True)
        return _close(scan, ch) if mode == "K" and ch == "}" else None
    # mode A: after a value in a container
    if ch == ",":
        if frame.kind == "o":
            allowed = next_keys(frame.schema, frame.seen)
            return replace(scan, text=scan.text + ch, mode="K2") if allowed is None or allowed else None
        high = frame.schema.get("maxItems") if isinstance(frame.schema, dict) else None
        if isinstance(high, int) and frame.count >= high:
            return None
        item = scan.schema.resolve(item_schema(frame.schema, frame.count))
        return replace(scan, text=scan.text + ch, mode="V", current=item)
    return _close(scan, ch)


def _is_integer(schema: Any) -> bool:
    return steered(schema) and schema.get("type") == "integer"


def _value(scan: Scan, ch: str) -> Scan | None:
    starts = _starts(scan.current)
    if ch == "]" and scan.stack and scan.stack[-1].kind == "a" and opened(scan):
        return _close(scan, ch)
    if starts is not None and ch not in starts:
        return None
    text = scan.text + ch
    if ch in "{[":
        frame = Frame("o" if ch == "{" else "a", scan.current if steered(scan.current) else None, len(scan.text))
        mode = "K" if ch == "{" else "V"
        item = scan.schema.resolve(item_schema(frame.schema, 0)) if ch == "[" else None
        return replace(scan, text=text, mode=mode, stack=(*scan.stack, frame), current=item)
    if ch == '"':
        return replace(scan, text=text, mode="S", tok=ch, key=False)
    if ch in _DIGITS:
        return replace(scan, text=text, mode="N", tok=ch)
    if ch in LITERALS:
        return replace(scan, text=text, mode="L", tok=ch)
    return None


def _string(scan: Scan, ch: str) -> Scan | None:
    text, tok, esc = scan.text + ch, scan.tok + ch, scan.esc
    if esc == "\\":
        if ch not in '"\\/bfnrtu':
            return None
        return replace(scan, text=text, tok=tok, esc="u" if ch == "u" else "")
    if esc:
        if ch not in "0123456789abcdefABCDEF":
            return None
        return replace(scan, text=text, tok=tok, esc="" if len(esc) == 4 else esc + ch)
    if ch == "\\":
        return replace(scan, text=text, tok=tok, esc="\\")
    if ord(ch) < 0x20:
        return None
    if ch != '"':
        if scan.key:
            frame = scan.stack[-1]
            return (
                replace(scan, text=text, tok=tok)
                if _key_allowed(frame.schema, frame.seen, tok[1:], prefix=True)
                else None
            )
        high = scan.current.get("maxLength") if steered(scan.current) else None
        if isinstance(high, int) and "\\" not in tok and len(tok) - 1 > high:
            return None
        return replace(scan, text=text, tok=tok)
    value = json.loads(tok)
    if scan.key:
        frame = scan.stack[-1]
        if value in frame.seen or not _key_allowed(frame.schema, frame.seen, value, prefix=False):
            return None
        stack = (*scan.stack[:-1], replace(frame, key=value))
        return replace(scan, text=text, tok="", mode="C", stack=stack, key=False)
    return _scalar_done(replace(scan, text=text, tok=tok), value)


def _scalar_done(scan: Scan, value: Any) -> Scan | None:
    if not scan.schema.valid(value, scan.current):
        return None
    return _after_value(replace(scan, tok=""))


def _after_value(scan: Scan) -> Scan | None:
    if not scan.stack:
        return replace(scan, mode="D", current=None)
    frame = scan.stack[-1]
    if frame.kind == "o":
        frame = replace(frame, seen=(*frame.seen, frame.key or ""), key=None)
    else:
        frame = replace(frame, count=frame.count + 1)
    return replace(scan, mode="A", stack=(*scan.stack[:-1], frame), current=None)


def _close(scan: Scan, ch: str) -> Scan | None:
    frame = scan.stack[-1]
    if ch != ("}" if frame.kind == "o" else "]"):
        return None
    if frame.kind == "o" and not required_done(frame.schema, frame.seen):
        return None
    low = frame.schema.get("minItems") if isinstance(frame.schema, dict) and frame.kind == "a" else None
    if isinstance(low, int) and frame.count < low:
        return None
    text = scan.text + ch
    value = json.loads(text[frame.start :])
    outer = scan.stack[:-1]
    schema = frame.schema if outer else scan.schema.root
    if not scan.schema.valid(value, schema):
        return None
    return _after_value(replace(scan, text=text, stack=outer))


def done(scan: Scan) -> bool:
    """The value is complete (a number may still grow)."""
    if scan.mode == "D":
        return True
    if scan.mode != "N" or scan.stack or not _NUMBER.fullmatch(scan.tok):
        return False
    return scan.schema.valid(json.loads(scan.tok), scan.schema.root)


def opened(scan: Scan) -> bool:
    """Nothing written yet in the innermost container."""
    return scan.text.rstrip(_WS).endswith(("{", "["))
