"""Pure conversions: arguments, listings, tool results, truncation, cache keys and TTLs."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp import types

from contracts.messages.items import McpToolInfo
from contracts.messages.tools import ToolResult
from services.tools.cache import TtlCache, server_key
from services.tools.results import (
    InvalidArguments,
    describe,
    parse_arguments,
    result_text,
    to_tool_result,
    tool_info,
    truncate,
)


@pytest.mark.parametrize(
    ("text", "expected"), [("", {}), ("  \n", {}), ("{}", {}), ('{"a": 1, "b": [2]}', {"a": 1, "b": [2]})]
)
def test_parse_arguments(text: str, expected: dict[str, object]) -> None:
    assert parse_arguments(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not valid JSON"),
        ("[]", "not list"),
        ("1", "not int"),
        ("null", "not NoneType"),
        ("'a'", "not valid JSON"),
    ],
)
def test_parse_arguments_rejects(text: str, message: str) -> None:
    with pytest.raises(InvalidArguments, match=message):
        parse_arguments(text)


def test_tool_info() -> None:
    tool = types.Tool(
        name="add",
        description="Add.",
        input_schema={"type": "object", "properties": {"a": {"type": "integer"}}},
        annotations=types.ToolAnnotations(read_only_hint=True, destructive_hint=False),
    )
    assert tool_info(tool) == McpToolInfo(
        name="add",
        description="Add.",
        input_schema={"type": "object", "properties": {"a": {"type": "integer"}}},
        annotations={"readOnlyHint": True, "destructiveHint": False},
    )
    bare = tool_info(types.Tool(name="x", input_schema={"type": "object"}))
    assert bare.description is None and bare.annotations is None


def _result(content: list[types.ContentBlock], structured: object = None, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=content, structured_content=structured, is_error=error)


def test_result_text_joins_blocks() -> None:
    result = _result(
        [
            types.TextContent(type="text", text="one"),
            types.TextContent(type="text", text="two"),
            types.ImageContent(type="image", data="aGk=", mime_type="image/png"),
            types.EmbeddedResource(type="resource", resource=types.TextResourceContents(uri="file:///a", text="inner")),
            types.ResourceLink(type="resource_link", name="doc", uri="https://x/doc"),
        ]
    )
    assert result_text(result) == "one\ntwo\n[image (image/png)]\ninner\n[resource link https://x/doc]"


def test_structured_content_when_there_is_no_text() -> None:
    result = _result([], structured={"temp": 21, "city": "Zürich"})
    assert json.loads(result_text(result)) == {"temp": 21, "city": "Zürich"}
    assert result_text(_result([])) == ""


def test_to_tool_result() -> None:
    ok = _result([types.TextContent(type="text", text="3")], structured={"result": 3})
    assert to_tool_result(ok, "add", 100) == ToolResult(output="3")
    failed = _result([types.TextContent(type="text", text="kaboom")], error=True)
    assert to_tool_result(failed, "boom", 100) == ToolResult(error="kaboom")
    silent = _result([], error=True)
    assert to_tool_result(silent, "boom", 100).error == "tool 'boom' failed without a message"


def test_truncate() -> None:
    assert truncate("short", 10) == ("short", False)
    assert truncate("x" * 10, 10) == ("x" * 10, False)
    assert truncate("x" * 15, 10) == ("x" * 10 + "\n[... truncated 5 bytes]", True)
    # a multi-byte character is never split: "é" is 2 bytes
    text, cut = truncate("é" * 6, 5)
    assert cut and text == "éé\n[... truncated 8 bytes]"


@given(st.text(), st.integers(min_value=0, max_value=64))
def test_truncate_keeps_a_prefix_within_the_cap(text: str, cap: int) -> None:
    out, cut = truncate(text, cap)
    if not cut:
        assert out == text
        return
    kept, marker = out.rsplit("\n[... truncated ", 1)
    assert text.startswith(kept)
    assert len(kept.encode()) <= cap
    assert int(marker.removesuffix(" bytes]")) == len(text.encode()) - len(kept.encode())


def test_describe_unwraps_exception_groups() -> None:
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [ConnectionError("refused")])])
    assert describe(nested) == "ConnectionError: refused"
    assert describe(TimeoutError()) == "TimeoutError"


def test_server_key_separates_callers() -> None:
    url = "http://127.0.0.1/mcp"
    assert server_key(url, {"Authorization": "a", "X": "1"}) == server_key(url, {"x": "1", "authorization": "a"})
    assert server_key(url, {"Authorization": "a"}) != server_key(url, {"Authorization": "b"})
    assert server_key(url, {}) != server_key(url, {"Authorization": "a"})
    assert server_key(url, {}) != server_key("http://127.0.0.1/other", {})
    # no value in the clear, and no ambiguity from joining
    key = server_key(url, {"a": "b=c"})
    assert "b=c" not in str(key) and key != server_key(url, {"a=b": "c"})


def test_ttl_cache() -> None:
    now = [0.0]
    cache: TtlCache[str] = TtlCache(ttl_s=10, max_entries=2, clock=lambda: now[0])
    a, b, c = (server_key(u, {}) for u in ("http://a", "http://b", "http://c"))
    cache.put(a, "A")
    assert cache.get(a) == "A"
    now[0] = 9.9
    assert cache.get(a) == "A"
    now[0] = 10.0
    assert cache.get(a) is None and len(cache) == 0
    cache.put(a, "A")
    cache.put(b, "B")
    cache.put(c, "C")  # the oldest goes
    assert (cache.get(a), cache.get(b), cache.get(c)) == (None, "B", "C")


def test_ttl_cache_disabled() -> None:
    cache: TtlCache[str] = TtlCache(ttl_s=0, max_entries=10)
    cache.put(server_key("http://a", {}), "A")
    assert cache.get(server_key("http://a", {})) is None
