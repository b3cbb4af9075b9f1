"""Mutations of valid API requests, for the hostile-input fuzz suite (test_hostile.py): every
level of a body gets wrong types, dropped and unknown fields, extreme values, odd strings, and
the wire gets non-JSON bodies and wrong content types."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterator
from typing import Any

from hypothesis import strategies as st

Path = tuple[str | int, ...]
JSON_CT = {"content-type": "application/json"}


def paths(value: Any, prefix: Path = ()) -> list[Path]:
    """Every node below the root."""
    out: list[Path] = []
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        out.append((*prefix, key))
        out += paths(child, (*prefix, key))
    return out


def at(value: Any, path: Path) -> Any:
    for key in path:
        value = value[key]
    return value


def edit(value: Any, path: Path, change: Callable[[Any, str | int], None]) -> Any:
    """A copy of ``value`` (copied along ``path`` only) whose parent of ``path`` is changed."""
    if len(path) == 1:
        parent = dict(value) if isinstance(value, dict) else list(value)
        change(parent, path[0])
        return parent

    def descend(parent: Any, key: str | int) -> None:
        parent[key] = edit(parent[key], path[1:], change)

    return edit(value, path[:1], descend)


def replaced(value: Any, path: Path, new: Any) -> Any:
    def change(parent: Any, key: str | int) -> None:
        parent[key] = new

    return edit(value, path, change)


def removed(value: Any, path: Path) -> Any:
    def change(parent: Any, key: str | int) -> None:
        del parent[key]

    return edit(value, path, change)


def nested(depth: int, leaf: Any = "x") -> Any:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"type": value}
    return value


def retyped(value: Any) -> list[Any]:
    """The same value as other JSON types."""
    if isinstance(value, bool):
        return ["true" if value else "false", int(value), [value], None]
    if isinstance(value, int | float):
        return [str(value), [value], {"value": value}, not value, float(value) + 0.5]
    if isinstance(value, str):
        return [len(value), [value], {"text": value}, {value: value} if value else {"": 1}, value == "", None]
    if isinstance(value, list):
        return [{str(i): v for i, v in enumerate(value)}, json.dumps(value), value[0] if value else 0, len(value)]
    if isinstance(value, dict):
        return [list(value.values()), list(value), json.dumps(value), bool(value), [value]]
    return [{}, [], "", 0, False]


ODD_STRINGS = [
    "",
    " ",
    "\ud800",
    "a\udfffb",
    "\udc00\ud800",
    "\x00",
    "nul\x00byte",
    "\x1b[31m",
    "<|start|>",
    "<|endoftext|>",
    "<|constrain|>json",
    "<|channel|>final<|message|>",
    "auto ",
    "AUTO",
    "Function",
    "function\x00",
    "user\n",
    "json_schema ",
    "\u202e",
    "\ufeff",
    "\U0001f99c" * 40,
    "%s%n%x",
    "{{x}}",
    "${jndi:x}",
    "../../etc/passwd",
    "null",
    "true",
    "1e999",
    "NaN",
    "-0",
    "0x10",
    "resp_",
    "msg_",
    "conv_",
    "call_1",
    "#/$defs/x",
    "x" * 300,
    "é" * 600,
]
KEYS = [
    "type",
    "role",
    "content",
    "text",
    "name",
    "arguments",
    "call_id",
    "output",
    "id",
    "tools",
    "schema",
    "format",
    "function",
    "parameters",
    "input",
    "model",
    "items",
    "summary",
    "server_label",
    "$ref",
]
NUMBERS = [
    0,
    -1,
    1,
    2**31 - 1,
    2**31,
    2**53 + 1,
    2**63 - 1,
    2**63,
    -(2**63),
    2**64,
    10**20,
    10**30,
    4096,
    131072,
    1e308,
    -1e308,
    5e-324,
    -0.0,
    0.5,
    -0.5,
    1.5,
    2.0000001,
    1e-7,
]
HUGE = ["a" * 100_000, "a" * 300_000, "hostile " * 40_000, "\u00e9" * 200_000, "x" * 4_100_000]
CODEPOINTS = [
    (0x20, 0x7E),
    (0x00, 0x1F),
    (0x7F, 0x2FF),
    (0x300, 0x36F),
    (0x590, 0x6FF),
    (0x2000, 0x206F),
    (0xD800, 0xDFFF),
    (0xE000, 0xFFFF),
    (0x1F300, 0x1FAFF),
    (0x10000, 0x10FFFF),
]
ENUM_VARIANTS: list[Callable[[str], str]] = [
    str.upper,
    str.title,
    lambda s: s + "_x",
    lambda s: " " + s,
    lambda s: s.replace("_", "-"),
    lambda s: s[:-1],
    lambda s: s + "\x00",
]
CONTENT_TYPES = [
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "",
    "application/json; charset=utf-16",
    "APPLICATION/JSON",
    "application/vnd.x+json",
    "application/json, text/plain",
    "application/jsonx",
    "json",
    "*/*",
]
BAD_LITERALS = [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"0x10", b"01", b"+1", b".5", b"1_0", b"tru", b"None"]
PREFIXES = [b"\xef\xbb\xbf", b"\xff\xfe", b"\x00", b" " * 100_000, b"//c\n", b"\x1f\x8b"]
NOT_OBJECTS = [b"[]", b"null", b'"str"', b"1", b"{}", b"true", b"[[[[[[[[[[]]]]]]]]]]"]

# Hypothesis draws a seed and a few values per batch (its edge cases: odd floats, unicode, nesting);
# a seeded generator spends them, fast enough for tens of thousands of requests
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(ODD_STRINGS),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
BATCHES = st.tuples(st.integers(0, 2**64 - 1), st.lists(VALUES, min_size=3, max_size=3))


class Mutator:
    """Hostile variants of valid requests, one batch's worth: every level of the body (a type
    swapped, a field dropped or unknown, an enum value off by a letter, extreme numbers, nesting
    past the limit, surrogates and NULs, containers where strings belong, huge strings), then
    the wire (not JSON, wrong content type, empty, truncated, chunked)."""

    def __init__(self, seed: int, drawn: list[Any]) -> None:
        self.rnd = random.Random(seed)
        self.drawn = drawn

    def request(self, corpus: list[Any]) -> tuple[bytes | Iterator[bytes], dict[str, str]]:
        body = self.rnd.choice(corpus)
        for _ in range(self.rnd.choice((1, 1, 2, 2, 3))):
            body = self.mutate(body)
        return self.wire(body)

    # values --------------------------------------------------------------------------------
    def text(self) -> str:
        low, high = self.rnd.choice(CODEPOINTS)
        return "".join(chr(self.rnd.randint(low, high)) for _ in range(self.rnd.randint(0, 12)))

    def scalar(self) -> Any:
        kind = self.rnd.randrange(7)
        if kind == 0:
            return self.rnd.choice([None, True, False])
        if kind == 1:
            return self.rnd.choice(NUMBERS)
        if kind == 2:
            return self.rnd.choice([-1, 1]) * self.rnd.randrange(2 ** self.rnd.randrange(1, 70))
        if kind == 3:
            return self.text()
        if kind == 4:
            return self.rnd.choice(KEYS)
        return self.rnd.choice(ODD_STRINGS)

    def value(self) -> Any:
        kind = self.rnd.randrange(10)
        if kind < 5:
            return self.scalar()
        if kind < 7:
            return self.rnd.choice(self.drawn)
        if kind < 8:
            return [self.scalar() for _ in range(self.rnd.randrange(4))]
        return {
            self.rnd.choice(KEYS) if self.rnd.random() < 0.7 else self.text(): self.value()
            for _ in range(self.rnd.randrange(4))
        }

    # the body ------------------------------------------------------------------------------
    def mutate(self, body: Any) -> Any:
        """``body`` with one hostile change somewhere."""
        where = paths(body)
        if not where:
            return self.value()
        path = self.rnd.choice(where)
        old = at(body, path)
        op = self.rnd.randrange(100)
        if op < 25:
            new = self.value()
        elif op < 42:
            new = self.rnd.choice(retyped(old))
        elif op < 54:
            return removed(body, path)
        elif op < 62:  # a field nobody knows, on any object
            target = self.rnd.choice([p for p in [(), *where] if isinstance(at(body, p), dict)] or [()])
            key = self.rnd.choice(KEYS) if self.rnd.random() < 0.5 else self.text() or "x"
            return replaced(body, (*target, key), self.value()) if target else {**body, key: self.value()}
        elif op < 74 and isinstance(old, str) and old:
            new = self.rnd.choice(ENUM_VARIANTS)(old)
        elif op < 82:
            new = self.rnd.choice(NUMBERS)
        elif op < 88:
            new = nested(self.rnd.randint(62, 130), self.scalar())
        elif op < 92 and isinstance(old, list) and old:
            new = old * self.rnd.choice((2, 17, 200))
        elif op < 93 and self.rnd.random() < 0.4:
            new = self.rnd.choice(HUGE)
        else:
            new = self.rnd.choice(ODD_STRINGS)
        return replaced(body, path, new)

    # the wire ------------------------------------------------------------------------------
    def wire(self, body: Any) -> tuple[bytes | Iterator[bytes], dict[str, str]]:
        """The body as bytes, sometimes not as JSON should travel."""
        raw = json.dumps(body).encode()  # ensure_ascii: a lone surrogate travels as its \\u escape
        op, rnd = self.rnd.randrange(100), self.rnd
        if op < 72:
            return raw, JSON_CT
        if op < 78:
            kind = rnd.choice(CONTENT_TYPES)
            return raw, {"content-type": kind} if kind else {}
        if op < 80:
            return b"", JSON_CT
        if op < 84:
            return raw[: rnd.randrange(max(1, len(raw)))], JSON_CT
        if op < 87:
            cut = rnd.randint(0, len(raw))
            return raw[:cut] + rnd.randbytes(rnd.randint(1, 16)) + raw[cut:], JSON_CT
        if op < 90:
            literal = rnd.choice(BAD_LITERALS)
            return re.sub(rb"(?<=: )-?\d+(\.\d+)?", literal, raw, count=1) if re.search(
                rb": \d", raw
            ) else literal, JSON_CT
        if op < 92:
            return rnd.choice(PREFIXES) + raw, JSON_CT
        if op < 94:
            return rnd.choice([*NOT_OBJECTS, b"[" + raw + b"]", raw + b"x", raw + b"}"]), JSON_CT
        if op < 95:
            return b'{"model": [1], ' + raw[1:] if raw.startswith(b"{") and len(raw) > 2 else raw, JSON_CT
        if op < 97:
            cut = rnd.randint(0, len(raw))
            return raw[:cut] + b"\xed\xa0\x80" + raw[cut:], JSON_CT  # a surrogate encoded as UTF-8
        bounds = [0, *sorted(rnd.randint(0, len(raw)) for _ in range(rnd.randrange(5))), len(raw)]
        return iter([raw[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]), JSON_CT  # chunked
