"""Responses API JSON <-> the internal conversation items (contracts.messages.items)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from contracts.messages.items import (
    ConversationItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    McpApprovalRequestItem,
    McpApprovalResponseItem,
    McpCallItem,
    McpListToolsItem,
    MessageItem,
    ReasoningItem,
)
from services.gateway.errors import invalid

TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text(content: Any, param: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid("content must be a string or a list of content parts.", param)
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif kind == "refusal":
            out.append(part.get("refusal", ""))
        else:
            raise invalid(f"Content part type '{kind}' is not supported: gpt-oss reads text only.",
                          f"{param}[{j}]")
    return "".join(out)


def input_items(raw: str | list[dict[str, Any]] | None, references: dict[str, ConversationItem]) -> list[ConversationItem]:
    """Request ``input`` -> items, each with an id (input items are listed by id)."""
    if raw is None:
        return []
    if isinstance(raw, str):
        return [MessageItem(role="user", content=raw, id=new_id("msg"))]
    items: list[ConversationItem] = []
    for i, entry in enumerate(raw):
        param = f"input[{i}]"
        if not isinstance(entry, dict):
            raise invalid("Each input item must be an object.", param)
        kind = entry.get("type", "message" if "role" in entry else None)
        if kind == "message":
            role = entry.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise invalid(f"Invalid role '{role}'.", f"{param}.role")
            items.append(MessageItem(role=role, content=_text(entry.get("content"), f"{param}.content"),
                                     id=entry.get("id") or new_id("msg")))
        elif kind == "function_call":
            try:
                items.append(FunctionCallItem(call_id=entry["call_id"], name=entry["name"],
                                              arguments=entry.get("arguments") or "{}", id=entry.get("id") or new_id("fc")))
            except KeyError as exc:
                raise invalid(f"function_call needs {exc.args[0]}.", f"{param}.{exc.args[0]}") from exc
        elif kind == "function_call_output":
            if "call_id" not in entry:
                raise invalid("function_call_output needs call_id.", f"{param}.call_id")
            output = entry.get("output", "")
            if not isinstance(output, str):
                output = _text(output, f"{param}.output")
            items.append(FunctionCallOutputItem(call_id=entry["call_id"], output=output,
                                                id=entry.get("id") or new_id("fco")))
        elif kind == "reasoning":
            text = _text(entry.get("content"), f"{param}.content") or _text(entry.get("summary"), f"{param}.summary")
            items.append(ReasoningItem(text=text, id=entry.get("id") or new_id("rs")))
        elif kind == "item_reference":
            ref = references.get(entry.get("id", ""))
            if ref is None:
                raise invalid(f"Item '{entry.get('id')}' was not found.", f"{param}.id")
            items.append(ref)
        elif kind == "mcp_approval_response":
            items.append(McpApprovalResponseItem(approval_request_id=entry.get("approval_request_id", ""),
                                                 approve=bool(entry.get("approve")), reason=entry.get("reason"),
                                                 id=entry.get("id") or new_id("mcpr")))
        elif kind in ("mcp_call", "mcp_list_tools", "mcp_approval_request"):
            models: dict[str, Any] = {"mcp_call": McpCallItem, "mcp_list_tools": McpListToolsItem,
                                      "mcp_approval_request": McpApprovalRequestItem}
            model = models[kind]
            items.append(model.model_validate(entry))
        else:
            raise invalid(f"Input item type '{kind}' is not supported by Chorus.", f"{param}.type")
    return items


def _web_search_action(item: FunctionCallItem) -> dict[str, Any]:
    try:
        args = json.loads(item.arguments or "{}")
    except ValueError:
        args = {}
    if not isinstance(args, dict):
        args = {}
    if item.name == "open":
        return {"type": "open_page", "url": str(args.get("id", args.get("url", "")))}
    if item.name == "find":
        return {"type": "find_in_page", "pattern": str(args.get("pattern", "")), "url": str(args.get("url", ""))}
    return {"type": "search", "query": str(args.get("query", ""))}


def output_json(item: ConversationItem, *, streaming_start: bool = False) -> dict[str, Any]:
    """An item as the Responses API shows it in ``output`` (or, with ``streaming_start``, as
    ``response.output_item.added`` announces it: empty text, in progress)."""
    status = "in_progress" if streaming_start else item.status if hasattr(item, "status") else "completed"
    if isinstance(item, ReasoningItem):
        parts: list[dict[str, Any]] = [] if streaming_start else [{"type": "reasoning_text", "text": item.text}]
        return {"type": "reasoning", "id": item.id, "summary": [], "content": parts, "status": status}
    if isinstance(item, MessageItem):
        content: list[dict[str, Any]]
        if item.role == "assistant":
            content = [] if streaming_start else [
                {"type": "output_text", "text": item.content, "annotations": [], "logprobs": []}]
        else:
            content = [{"type": "input_text", "text": item.content}]
        return {"type": "message", "id": item.id, "role": item.role, "status": status, "content": content}
    if isinstance(item, FunctionCallItem):
        if item.namespace == "browser":
            return {"type": "web_search_call", "id": item.id, "status": "completed" if not streaming_start else "in_progress",
                    "action": _web_search_action(item)}
        name = item.name if item.namespace == "functions" else f"{item.namespace}.{item.name}"
        return {"type": "function_call", "id": item.id, "call_id": item.call_id, "name": name,
                "arguments": "" if streaming_start else item.arguments, "status": status}
    if isinstance(item, FunctionCallOutputItem):
        return {"type": "function_call_output", "id": item.id, "call_id": item.call_id, "output": item.output,
                "status": "completed"}
    if isinstance(item, McpCallItem):
        out = item.model_dump(exclude={"status"})
        out["status"] = "in_progress" if streaming_start else ("failed" if item.error else "completed")
        return out
    return item.model_dump()


def is_builtin_reasoning(item: ConversationItem) -> bool:
    """python / container calls are shown as reasoning, as vLLM does."""
    return isinstance(item, FunctionCallItem) and item.namespace in ("python", "container")


def as_reasoning(item: FunctionCallItem) -> ReasoningItem:
    return ReasoningItem(id=item.id, text=item.arguments, status=item.status)
