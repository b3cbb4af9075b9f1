"""The input items of ``POST /v1/responses``, typed: content parts and every item kind a
client may send back (messages, calls and their outputs, reasoning, MCP items, compaction),
as one tagged union, so a wrong-typed field anywhere is a 400 naming its path (field names
follow openai.types.responses.ResponseInputItemParam)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from services.gateway.errors import invalid
from services.gateway.request_base import Lenient

NAME = r"^[A-Za-z0-9_.\-]+$"
Text = Annotated[str, Field(max_length=4_000_000)]

# -- content parts -------------------------------------------------------------------------


class TextPart(Lenient):
    type: Literal["input_text", "output_text", "text", "summary_text", "reasoning_text"]
    text: Text


class RefusalPart(Lenient):
    type: Literal["refusal"]
    refusal: Text


class MediaPart(Lenient):
    """Images, files and audio: gpt-oss reads text only (a 400 says so where they are used)."""

    type: Literal["input_image", "input_file", "input_audio"]


ContentPart = Annotated[TextPart | RefusalPart | MediaPart, Field(discriminator="type")]
Content = str | list[ContentPart]


def text_of(content: Content | None, param: str) -> str:
    """The text of message content; media parts are the caller's mistake for gpt-oss."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    out: list[str] = []
    for j, part in enumerate(content):
        if isinstance(part, TextPart):
            out.append(part.text)
        elif isinstance(part, RefusalPart):
            out.append(part.refusal)
        else:
            raise invalid(
                f"Content part type '{part.type}' is not supported: gpt-oss reads text only.", f"{param}[{j}].type"
            )
    return "".join(out)


# -- input items ---------------------------------------------------------------------------


class MessageInput(Lenient):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Content
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCallInput(Lenient):
    type: Literal["function_call"]
    call_id: Annotated[str, Field(min_length=1, max_length=256)]
    name: Annotated[str, Field(min_length=1, max_length=256)]
    arguments: Text = "{}"
    namespace: Annotated[str, Field(max_length=64)] | None = None  # rendered in a message header
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutputInput(Lenient):
    type: Literal["function_call_output"]
    call_id: Annotated[str, Field(min_length=1, max_length=256)]
    output: Content
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class SummaryPart(Lenient):
    type: Literal["summary_text"] = "summary_text"
    text: Text


class ReasoningContentPart(Lenient):
    type: Literal["reasoning_text", "text"] = "reasoning_text"
    text: Text


class ReasoningInput(Lenient):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[SummaryPart] = Field(default_factory=list)
    content: list[ReasoningContentPart] | None = None
    encrypted_content: Annotated[str, Field(max_length=4_000_000)] | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class ItemReferenceInput(Lenient):
    type: Literal["item_reference"]
    id: Annotated[str, Field(min_length=1, max_length=256)]


class McpApprovalResponseInput(Lenient):
    type: Literal["mcp_approval_response"]
    approval_request_id: Annotated[str, Field(min_length=1, max_length=256)]
    approve: bool
    reason: str | None = None
    id: str | None = None


class McpToolInput(Lenient):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=dict)
    annotations: dict[str, Any] | None = None


Label = Annotated[str, Field(max_length=64)]  # as an mcp tool's server_label
ToolName = Annotated[str, Field(max_length=256)]


class McpListToolsInput(Lenient):
    type: Literal["mcp_list_tools"]
    id: str
    server_label: Label
    tools: list[McpToolInput] = Field(default_factory=list)
    error: str | None = None


class McpCallInput(Lenient):
    type: Literal["mcp_call"]
    id: str
    server_label: Label  # the label and name are rendered in a message header
    name: ToolName
    arguments: Text = "{}"
    output: Text | None = None
    error: str | None = None
    approval_request_id: str | None = None


class McpApprovalRequestInput(Lenient):
    type: Literal["mcp_approval_request"]
    id: str
    server_label: Label
    name: ToolName
    arguments: Text = "{}"


class CompactionInput(Lenient):
    type: Literal["compaction"]
    encrypted_content: Annotated[str, Field(min_length=1, max_length=8_000_000)]
    id: str | None = None


class CompactionTriggerInput(Lenient):
    """Compact the conversation now (it must be the last input item)."""

    type: Literal["compaction_trigger"]
    id: str | None = None


class EchoedToolCallInput(Lenient):
    """A built-in tool call echoed back from an earlier output (history, not prompt text)."""

    type: Literal["web_search_call", "code_interpreter_call"]
    id: str | None = None


def _item_tag(value: Any) -> str | None:
    if isinstance(value, dict):
        kind = value.get("type", "message" if "role" in value else None)
        return kind if isinstance(kind, str) else None
    return getattr(value, "type", None)


InputItem = Annotated[
    Annotated[MessageInput, Tag("message")]
    | Annotated[FunctionCallInput, Tag("function_call")]
    | Annotated[FunctionCallOutputInput, Tag("function_call_output")]
    | Annotated[ReasoningInput, Tag("reasoning")]
    | Annotated[ItemReferenceInput, Tag("item_reference")]
    | Annotated[McpApprovalResponseInput, Tag("mcp_approval_response")]
    | Annotated[McpListToolsInput, Tag("mcp_list_tools")]
    | Annotated[McpCallInput, Tag("mcp_call")]
    | Annotated[McpApprovalRequestInput, Tag("mcp_approval_request")]
    | Annotated[CompactionInput, Tag("compaction")]
    | Annotated[CompactionTriggerInput, Tag("compaction_trigger")]
    | Annotated[EchoedToolCallInput, Tag("web_search_call")]
    | Annotated[EchoedToolCallInput, Tag("code_interpreter_call")],
    Discriminator(_item_tag, custom_error_type="invalid_item", custom_error_message="not a supported input item type"),
]
