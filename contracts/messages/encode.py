"""What the encoder renders: a conversation (items), the tools offered and the options that
shape the Harmony system and developer messages. Travels inside ``GenerateJob``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

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


class ResponseFormat(Contract):
    """A structured-output format the answer must follow (rendered in the developer message's
    "# Response Formats" section, as Harmony specifies)."""

    name: str = "response"
    description: str | None = None
    json_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    strict: bool = False


class PromptContinuation(Contract):
    """The request continues a prompt this encoder rendered before and remembered (that
    request's ``remember``; ``key`` is its generation id): its first ``length`` items were that
    prompt's, and ``items`` holds only the ones after them. An encoder that no longer has it, or
    for which the new items change what the remembered part renders to, answers
    ``continuation_unknown``: the gateway then sends the whole conversation."""

    key: str
    length: int = Field(ge=0)


class EncodeRequest(Contract):
    model: str
    items: list[ConversationItem]
    instructions: str | None = None
    tools: list[FunctionTool] = Field(default_factory=list)
    namespaces: list[ToolNamespace] = Field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    reasoning_effort: ReasoningEffort = "medium"
    builtin_tools: list[BuiltinTool] = Field(default_factory=list)
    response_format: ResponseFormat | None = None
    # YYYY-MM-DD; the encoder's clock when absent. The gateway pins it, so an attempt resumed
    # on another encoder renders the identical prompt.
    current_date: str | None = None
    # "auto": a conversation longer than the context loses its oldest messages (Responses'
    # truncation); "disabled": it is refused (context_length_exceeded)
    truncation: Literal["disabled", "auto"] = "disabled"
    # keep the rendered prompt (in the encoder that rendered it) for a later request to
    # continue: a WebSocket chain's next turn, a response's next model turn
    remember: bool = False
    continues: PromptContinuation | None = None


class CountRequest(Contract):
    """gateway -> any encoder: how many prompt tokens ``encode`` renders to (the Messages API's
    ``count_tokens``); answered with a ``TokenCount`` or a ``BusError``."""

    kind: Literal["count"] = "count"
    encode: EncodeRequest


class TokenCount(Contract):
    kind: Literal["token_count"] = "token_count"
    tokens: int
