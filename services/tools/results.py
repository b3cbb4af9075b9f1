"""Pure conversions between MCP results and Chorus contracts: arguments in, listings and tool
results out, failures described in words a model (and a person) can act on."""

from __future__ import annotations

import json
from typing import Any

from mcp import types

from contracts.messages.items import McpToolInfo
from contracts.messages.tools import ToolResult


class InvalidArguments(ValueError):
    """The model's arguments are not a JSON object; the tool is not called."""


def parse_arguments(text: str) -> dict[str, Any]:
    """Arguments as the model wrote them -> a JSON object. Empty text means no arguments."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArguments(f"arguments are not valid JSON ({exc.msg} at position {exc.pos})") from exc
    if not isinstance(value, dict):
        raise InvalidArguments(f"arguments must be a JSON object, not {type(value).__name__}")
    return value


def tool_info(tool: types.Tool) -> McpToolInfo:
    annotations = (
        tool.annotations.model_dump(mode="json", by_alias=True, exclude_none=True) if (tool.annotations) else None
    )
    return McpToolInfo(
        name=tool.name,
        description=tool.description,
        input_schema=dict(tool.input_schema),
        annotations=annotations or None,
    )


def _block_text(block: types.ContentBlock) -> str:
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, types.TextResourceContents):
            return resource.text
        return f"[resource {resource.uri} ({resource.mime_type or 'binary'})]"
    if isinstance(block, types.ResourceLink):
        return f"[resource link {block.uri}]"
    if isinstance(block, types.ImageContent):
        return f"[image ({block.mime_type})]"
    if isinstance(block, types.AudioContent):
        return f"[audio ({block.mime_type})]"
    return f"[{getattr(block, 'type', 'unknown')} content]"


def result_text(result: types.CallToolResult) -> str:
    """The content blocks' text, joined; the structured content as JSON when there is no
    content (servers are asked to mirror structured content as text, not all do)."""
    if result.content:
        return "\n".join(_block_text(block) for block in result.content)
    if result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return ""


def truncate(text: str, max_bytes: int) -> tuple[str, bool]:
    """At most ``max_bytes`` of UTF-8 (cut on a character boundary) plus a marker saying how
    many bytes were dropped."""
    data = text.encode()
    if len(data) <= max_bytes:
        return text, False
    kept = data[:max_bytes].decode(errors="ignore")
    dropped = len(data) - len(kept.encode())
    return f"{kept}\n[... truncated {dropped} bytes]", True


def to_tool_result(result: types.CallToolResult, name: str, max_bytes: int) -> ToolResult:
    text = result_text(result)
    if result.is_error:
        text, cut = truncate(text or f"tool {name!r} failed without a message", max_bytes)
        return ToolResult(error=text, truncated=cut)
    text, cut = truncate(text, max_bytes)
    return ToolResult(output=text, truncated=cut)


def failure_result(message: str, max_bytes: int) -> ToolResult:
    text, cut = truncate(message, max_bytes)
    return ToolResult(error=text, truncated=cut)


def leaf_exception(exc: BaseException) -> BaseException:
    """The first real exception inside (nested) exception groups, e.g. a connect error that
    anyio task groups wrapped."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def describe(exc: BaseException) -> str:
    leaf = leaf_exception(exc)
    text = str(leaf).strip()
    return f"{type(leaf).__name__}: {text}" if text else type(leaf).__name__
