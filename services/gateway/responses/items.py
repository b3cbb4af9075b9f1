"""Responses API items <-> the internal conversation items (contracts.messages.items).

``input_items`` turns validated request items into conversation items (one representation of
a conversation behind the edge); ``output_item`` shows a conversation item the way the
Responses API does, as openai-python's own types (``input_item`` for input listings)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any, Literal

from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseFunctionToolCallOutputItem,
    ResponseFunctionWebSearch,
    ResponseInputMessageItem,
    ResponseInputText,
    ResponseItem,
    ResponseOutputItem,
    ResponseOutputMessage,
    ResponseOutputRefusal,
    ResponseOutputText,
    ResponseReasoningItem,
)
from openai.types.responses.mcp_tool_call_error import McpToolExecutionError
from openai.types.responses.response_compaction_item import ResponseCompactionItem
from openai.types.responses.response_function_web_search import ActionFind, ActionOpenPage, ActionSearch
from openai.types.responses.response_output_item import McpApprovalRequest, McpCall, McpListTools, McpListToolsTool
from openai.types.responses.response_reasoning_item import Content as ReasoningText
from openai.types.responses.response_reasoning_item import Summary

from contracts.messages.items import (
    CompactionItem,
    ConversationItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    McpApprovalRequestItem,
    McpApprovalResponseItem,
    McpCallItem,
    McpListToolsItem,
    McpToolInfo,
    MessageItem,
    ReasoningItem,
)
from services.gateway.errors import invalid
from services.gateway.responses.inputs import (
    CompactionInput,
    CompactionTriggerInput,
    EchoedToolCallInput,
    FunctionCallInput,
    FunctionCallOutputInput,
    InputItem,
    ItemReferenceInput,
    McpApprovalRequestInput,
    McpApprovalResponseInput,
    McpCallInput,
    McpListToolsInput,
    MessageInput,
    ReasoningInput,
    text_of,
)

Status = Literal["in_progress", "completed", "incomplete"]
Unseal = Callable[[str, str], str]  # (sealed blob, param) -> plaintext; 400 on a bad blob
PHASES = {"commentary": "commentary", "final_answer": "final"}
CHANNEL_PHASE: dict[str | None, Literal["commentary", "final_answer"]] = {
    "commentary": "commentary",
    "final": "final_answer",
    None: "final_answer",
}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def input_items(
    raw: str | list[InputItem] | None, references: dict[str, ConversationItem], unseal: Unseal | None = None
) -> list[ConversationItem]:
    """Request ``input`` -> conversation items, each with an id (input items are listed by id)."""
    if raw is None:
        return []
    if isinstance(raw, str):
        return [MessageItem(role="user", content=raw, id=new_id("msg"))]
    items: list[ConversationItem] = []
    for i, entry in enumerate(raw):
        item = _input_item(entry, f"input[{i}]", references, unseal)
        if item is not None:
            items.append(item)
    return items


def _input_item(
    entry: InputItem, param: str, references: dict[str, ConversationItem], unseal: Unseal | None
) -> ConversationItem | None:
    if isinstance(entry, MessageInput):
        channel = PHASES.get(entry.phase or "") if entry.role == "assistant" else None
        return MessageItem(
            role=entry.role,
            content=text_of(entry.content, f"{param}.content"),
            id=entry.id or new_id("msg"),
            channel=channel,
        )
    if isinstance(entry, FunctionCallInput):
        name, namespace = entry.name, entry.namespace or "functions"
        return FunctionCallItem(
            call_id=entry.call_id,
            name=name,
            arguments=entry.arguments or "{}",
            namespace=namespace,
            id=entry.id or new_id("fc"),
        )
    if isinstance(entry, FunctionCallOutputInput):
        return FunctionCallOutputItem(
            call_id=entry.call_id, output=text_of(entry.output, f"{param}.output"), id=entry.id or new_id("fco")
        )
    if isinstance(entry, ReasoningInput):
        text = "".join(p.text for p in entry.content or []) or "".join(p.text for p in entry.summary)
        if entry.encrypted_content and unseal is not None:
            text = unseal(entry.encrypted_content, f"{param}.encrypted_content")
        return ReasoningItem(text=text, id=entry.id or new_id("rs"))
    if isinstance(entry, ItemReferenceInput):
        ref = references.get(entry.id)
        if ref is None:
            raise invalid(f"Item '{entry.id}' was not found.", f"{param}.id")
        return ref
    if isinstance(entry, McpApprovalResponseInput):
        return McpApprovalResponseItem(
            approval_request_id=entry.approval_request_id,
            approve=entry.approve,
            reason=entry.reason,
            id=entry.id or new_id("mcpr"),
        )
    if isinstance(entry, McpCallInput):
        return McpCallItem(
            id=entry.id,
            server_label=entry.server_label,
            name=entry.name,
            arguments=entry.arguments,
            output=entry.output,
            error=entry.error,
            approval_request_id=entry.approval_request_id,
        )
    if isinstance(entry, McpListToolsInput):
        return McpListToolsItem(
            id=entry.id,
            server_label=entry.server_label,
            error=entry.error,
            tools=[
                McpToolInfo(
                    name=t.name, description=t.description, input_schema=t.input_schema, annotations=t.annotations
                )
                for t in entry.tools
            ],
        )
    if isinstance(entry, McpApprovalRequestInput):
        return McpApprovalRequestItem(
            id=entry.id, server_label=entry.server_label, name=entry.name, arguments=entry.arguments
        )
    if isinstance(entry, CompactionInput):
        text = unseal(entry.encrypted_content, f"{param}.encrypted_content") if unseal else ""
        return CompactionItem(summary=text, id=entry.id or new_id("cmp"), sealed=entry.encrypted_content)
    if isinstance(entry, CompactionTriggerInput):
        return None  # not an item: the run compacts the conversation
    if isinstance(entry, EchoedToolCallInput):
        return None  # a built-in call echoed back: its result is already in the history
    raise invalid("Unsupported input item.", param)  # pragma: no cover - the union is exhaustive


# -- output ---------------------------------------------------------------------------------


def mcp_error(error: str | None) -> McpToolExecutionError | None:
    """A failed MCP call's error, as the Responses API types it."""
    if error is None:
        return None
    return McpToolExecutionError(type="mcp_tool_execution_error", content=[{"type": "text", "text": error}])


def _web_search_action(item: FunctionCallItem) -> ActionSearch | ActionOpenPage | ActionFind:
    try:
        args = json.loads(item.arguments or "{}")
    except ValueError:
        args = {}
    if not isinstance(args, dict):
        args = {}
    if item.name == "open":
        return ActionOpenPage(type="open_page", url=str(args.get("id", args.get("url", ""))))
    if item.name == "find":
        return ActionFind(type="find_in_page", pattern=str(args.get("pattern", "")), url=str(args.get("url", "")))
    return ActionSearch(type="search", query=str(args.get("query", "")))


def output_item(
    item: ConversationItem,
    *,
    streaming_start: bool = False,
    seal: Callable[[str], str] | None = None,
    summary: bool = False,
) -> ResponseOutputItem:
    """An item as the Responses API shows it in ``output`` (with ``streaming_start``, as
    ``response.output_item.added`` announces it: empty, in progress). ``seal`` adds a
    reasoning item's ``encrypted_content``; ``summary`` fills its summary (gpt-oss has no
    summarizer: the summary is the reasoning text)."""
    status: Status = "in_progress" if streaming_start else getattr(item, "status", "completed")
    if isinstance(item, ReasoningItem):
        text = "" if streaming_start else item.text
        shown = ResponseReasoningItem(
            type="reasoning",
            id=item.id or "",
            status=status,
            summary=[Summary(type="summary_text", text=text)] if summary and text else [],
            content=[] if streaming_start else [ReasoningText(type="reasoning_text", text=item.text)],
        )
        if seal is None or streaming_start:
            return shown  # no encrypted_content at all (the field is a string when present)
        return shown.model_copy(update={"encrypted_content": seal(item.text)})
    if isinstance(item, MessageItem):
        content: list[ResponseOutputText | ResponseOutputRefusal] = (
            []
            if streaming_start
            else [ResponseOutputText(type="output_text", text=item.content, annotations=[], logprobs=[])]
        )
        return ResponseOutputMessage(
            type="message",
            id=item.id or "",
            role="assistant",
            status=status,
            content=content,
            phase=CHANNEL_PHASE.get(item.channel, "final_answer"),
        )
    if isinstance(item, FunctionCallItem):
        if item.namespace == "browser":
            return ResponseFunctionWebSearch(
                type="web_search_call",
                id=item.id or "",
                action=_web_search_action(item),
                status="in_progress" if streaming_start else "completed",
            )
        namespace = None if item.namespace == "functions" else item.namespace
        return ResponseFunctionToolCall(
            type="function_call",
            id=item.id,
            call_id=item.call_id,
            name=item.name,
            arguments="" if streaming_start else item.arguments,
            status=status,
            namespace=namespace,
        )
    if isinstance(item, FunctionCallOutputItem):
        return ResponseFunctionToolCallOutputItem(
            type="function_call_output", id=item.id or "", call_id=item.call_id, output=item.output, status="completed"
        )
    if isinstance(item, McpCallItem):
        return McpCall(
            type="mcp_call",
            id=item.id,
            server_label=item.server_label,
            name=item.name,
            arguments="" if streaming_start else item.arguments,
            output=item.output,
            error=mcp_error(item.error),
            approval_request_id=item.approval_request_id,
            status="in_progress" if streaming_start else ("failed" if item.error else "completed"),
        )
    if isinstance(item, McpListToolsItem):
        return McpListTools(
            type="mcp_list_tools",
            id=item.id,
            server_label=item.server_label,
            error=item.error,
            tools=[]
            if streaming_start
            else [
                McpListToolsTool(
                    name=t.name, description=t.description, input_schema=t.input_schema, annotations=t.annotations
                )
                for t in item.tools
            ],
        )
    if isinstance(item, McpApprovalRequestItem):
        return McpApprovalRequest(
            type="mcp_approval_request",
            id=item.id,
            server_label=item.server_label,
            name=item.name,
            arguments=item.arguments,
        )
    if isinstance(item, CompactionItem):
        return ResponseCompactionItem(type="compaction", id=item.id or "", encrypted_content=item.sealed or "")
    raise TypeError(f"{type(item).__name__} is not an output item")


def input_item(item: ConversationItem) -> ResponseItem:
    """An item as ``GET /v1/responses/{id}/input_items`` and conversation listings show it."""
    if isinstance(item, MessageItem) and item.role != "assistant":
        return ResponseInputMessageItem(
            type="message",
            id=item.id or "",
            role=item.role,
            status="completed",
            content=[ResponseInputText(type="input_text", text=item.content)],
        )
    if isinstance(item, McpApprovalResponseItem):
        from openai.types.responses.response_item import McpApprovalResponse

        return McpApprovalResponse(
            type="mcp_approval_response",
            id=item.id or "",
            approve=item.approve,
            approval_request_id=item.approval_request_id,
            reason=item.reason,
        )
    shown: Any = output_item(item)
    return shown  # type: ignore[no-any-return]
