"""gateway -> encoder: a conversation to render into Harmony prompt token ids."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from contracts.errors import BusError
from contracts.messages.base import Contract
from contracts.messages.items import ConversationItem

ReasoningEffort = Literal["low", "medium", "high"]
BuiltinTool = Literal["browser", "python"]


class FunctionTool(Contract):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolNamespace(Contract):
    """A named group of tools the model addresses as ``{name}.{tool}`` (e.g. one MCP server)."""

    name: str
    description: str | None = None
    tools: list[FunctionTool]


class NamedToolChoice(Contract):
    type: Literal["function"] = "function"
    name: str


ToolChoice = Literal["auto", "none", "required"] | NamedToolChoice


class EncodeRequest(Contract):
    kind: Literal["encode"] = "encode"
    request_id: str
    model: str
    items: list[ConversationItem]
    instructions: str | None = None
    tools: list[FunctionTool] = Field(default_factory=list)
    namespaces: list[ToolNamespace] = Field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    reasoning_effort: ReasoningEffort = "medium"
    builtin_tools: list[BuiltinTool] = Field(default_factory=list)
    current_date: str | None = None  # YYYY-MM-DD; the encoder's clock when absent


class EncodedPrompt(Contract):
    kind: Literal["encoded"] = "encoded"
    token_ids: list[int]
    stop_token_ids: list[int]
    selection_text: str  # last user message text, for worker selection
    render_ms: float = 0.0


EncodeReply = Annotated[EncodedPrompt | BusError, Field(discriminator="kind")]
