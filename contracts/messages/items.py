"""The one internal representation of a conversation: Responses-style items.

Chat Completions messages are converted to these at the gateway edge; the encoder renders
them into Harmony; the parser produces them from Harmony; Redis stores them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from contracts.messages.base import Contract

ItemStatus = Literal["in_progress", "completed", "incomplete"]


class MessageItem(Contract):
    """A message. For assistant output ``channel`` records the Harmony channel it came
    from (``final``, or ``commentary`` for a preamble before a tool call)."""

    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: str
    id: str | None = None
    status: ItemStatus = "completed"
    channel: str | None = None


class ReasoningItem(Contract):
    """Analysis-channel text (the model's chain of thought)."""

    type: Literal["reasoning"] = "reasoning"
    text: str
    id: str | None = None
    status: ItemStatus = "completed"


class FunctionCallItem(Contract):
    """A tool call: a commentary message to ``{namespace}.{name}``.

    ``namespace`` is ``functions`` for API-level function tools; an MCP server's label for
    MCP tools; ``browser`` / ``python`` for gpt-oss built-ins (then ``name`` is the action,
    or ``python`` itself)."""

    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    namespace: str = "functions"
    id: str | None = None
    status: ItemStatus = "completed"


class FunctionCallOutputItem(Contract):
    """The result of a tool call, fed back to the model as a Harmony tool message."""

    type: Literal["function_call_output"] = "function_call_output"
    call_id: str
    output: str
    id: str | None = None
    status: ItemStatus = "completed"


class McpToolInfo(Contract):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=dict)
    annotations: dict[str, Any] | None = None


class McpListToolsItem(Contract):
    type: Literal["mcp_list_tools"] = "mcp_list_tools"
    id: str
    server_label: str
    tools: list[McpToolInfo]
    error: str | None = None


class McpCallItem(Contract):
    type: Literal["mcp_call"] = "mcp_call"
    id: str
    server_label: str
    name: str
    arguments: str
    output: str | None = None
    error: str | None = None
    approval_request_id: str | None = None
    status: ItemStatus = "completed"


class McpApprovalRequestItem(Contract):
    type: Literal["mcp_approval_request"] = "mcp_approval_request"
    id: str
    server_label: str
    name: str
    arguments: str


class McpApprovalResponseItem(Contract):
    type: Literal["mcp_approval_response"] = "mcp_approval_response"
    approval_request_id: str
    approve: bool
    id: str | None = None
    reason: str | None = None


class CompactionItem(Contract):
    """An earlier stretch of the conversation, condensed by the model (``/v1/responses/compact``).
    ``summary`` is what the model reads; ``sealed`` the opaque blob the client holds."""

    type: Literal["compaction"] = "compaction"
    summary: str
    id: str | None = None
    sealed: str | None = None


ConversationItem = Annotated[
    MessageItem
    | ReasoningItem
    | FunctionCallItem
    | FunctionCallOutputItem
    | McpListToolsItem
    | McpCallItem
    | McpApprovalRequestItem
    | McpApprovalResponseItem
    | CompactionItem,
    Field(discriminator="type"),
]

# What the parser produces from one generation.
OutputItem = Annotated[MessageItem | ReasoningItem | FunctionCallItem, Field(discriminator="type")]
