"""``POST /v1/responses``: the request, typed. Input items and tools are tagged unions, so a
wrong-typed field anywhere is a 400 naming its path, and the rest of the gateway works on
validated objects (field names follow openai.types.responses)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from services.gateway.errors import invalid
from services.gateway.request_base import ApiRequest, Lenient, Strict, unsupported
from services.gateway.responses.inputs import NAME, CompactionTriggerInput, InputItem, Text
from services.gateway.structured import schema_problem

DEFAULT_COMPACT_THRESHOLD = 100_000  # tokens, when context_management names no threshold

# -- tools ---------------------------------------------------------------------------------


class FunctionToolParam(Lenient):
    type: Literal["function"]
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=NAME)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamespaceToolParam(Lenient):
    """A named group of function tools (Codex sends these); the model addresses them as
    ``{name}.{tool}`` and the calls come back as function calls named the same."""

    type: Literal["namespace"]
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]
    description: str | None = None
    tools: list[FunctionToolParam] = Field(max_length=256)


class McpAllowedToolsFilter(Lenient):
    tool_names: list[str] | None = None
    read_only: bool | None = None


class McpApprovalFilter(Lenient):
    always: McpAllowedToolsFilter | None = None
    never: McpAllowedToolsFilter | None = None


class McpToolParam(Lenient):
    type: Literal["mcp"]
    server_label: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]
    server_url: str | None = None
    connector_id: str | None = None
    headers: dict[str, str] | None = None
    authorization: str | None = None
    allowed_tools: list[str] | McpAllowedToolsFilter | None = None
    require_approval: Literal["always", "never"] | McpApprovalFilter | None = None
    server_description: str | None = None

    @model_validator(mode="after")
    def _url(self) -> McpToolParam:
        if self.connector_id and not self.server_url:
            raise ValueError("MCP connectors are not supported; give a server_url")
        if not self.server_url:
            raise ValueError("an mcp tool needs a server_url")
        return self


class BuiltinToolParam(Lenient):
    """gpt-oss's own tools: web search -> its browser, code interpreter -> its python."""

    type: Literal[
        "web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11", "code_interpreter"
    ]

    @property
    def builtin(self) -> Literal["browser", "python"]:
        return "python" if self.type == "code_interpreter" else "browser"


ToolParam = Annotated[
    FunctionToolParam | NamespaceToolParam | McpToolParam | BuiltinToolParam, Field(discriminator="type")
]

# -- options -------------------------------------------------------------------------------


class NamedFunction(Strict):
    type: Literal["function"]
    name: str


class ReasoningParam(Lenient):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None

    @property
    def harmony_effort(self) -> Literal["low", "medium", "high"]:
        """gpt-oss knows three levels."""
        effort = self.effort or "medium"
        return "low" if effort in ("none", "minimal", "low") else "high" if effort in ("high", "xhigh") else "medium"

    @property
    def wants_summary(self) -> bool:
        return (self.summary or self.generate_summary) is not None


class TextFormatText(Strict):
    type: Literal["text"]


class TextFormatJsonSchema(Strict):
    type: Literal["json_schema"]
    name: Annotated[str, Field(min_length=1, max_length=64)]
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextFormatJsonObject(Strict):
    type: Literal["json_object"]


TextFormat = Annotated[TextFormatText | TextFormatJsonSchema | TextFormatJsonObject, Field(discriminator="type")]


class TextParam(Lenient):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ConversationRef(Lenient):
    id: str


class ContextManagement(Strict):
    type: Literal["compaction"]
    compact_threshold: Annotated[int, Field(ge=1000)] | None = None


class ResponsesRequest(ApiRequest):
    harmless: ClassVar[frozenset[str]] = frozenset(
        {
            "metadata",
            "user",
            "safety_identifier",
            "prompt_cache_key",
            "prompt_cache_retention",
            "service_tier",
            "client_metadata",
            "stream_options",
            "parallel_tool_calls",
        }
    )

    model: Annotated[str, Field(min_length=1, max_length=256)]
    input: Text | Annotated[list[InputItem], Field(max_length=100_000)] | None = None
    instructions: Text | None = None
    previous_response_id: str | None = None
    conversation: str | ConversationRef | None = None
    tools: list[ToolParam] | None = Field(default=None, max_length=512)
    tool_choice: Literal["auto", "none", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    reasoning: ReasoningParam | None = None
    text: TextParam | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    max_tool_calls: Annotated[int, Field(ge=0)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    store: bool | None = None
    background: bool | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    include: (
        list[
            Literal[
                "reasoning.encrypted_content",
                "message.output_text.logprobs",
                "web_search_call.action.sources",
                "code_interpreter_call.outputs",
            ]
        ]
        | None
    ) = None
    truncation: Literal["disabled", "auto"] | None = None
    context_management: list[ContextManagement] | None = None
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None = Field(
        default=None, max_length=16
    )
    user: Annotated[str, Field(max_length=512)] | None = None
    safety_identifier: Annotated[str, Field(max_length=512)] | None = None
    prompt_cache_key: Annotated[str, Field(max_length=512)] | None = None
    prompt_cache_retention: str | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    client_metadata: dict[str, Any] | None = None  # Codex sends it
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    seed: int | None = None  # not OpenAI's; honoured by the engines
    prompt: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _supported(self) -> ResponsesRequest:
        if self.previous_response_id and self.conversation:
            raise invalid("previous_response_id and conversation cannot be used together.", "conversation")
        if self.input is None and not (self.previous_response_id or self.conversation):
            raise invalid("Missing required parameter: 'input'.", "input")
        if self.background and self.store is False:
            raise invalid("background responses must be stored (store: true).", "background")
        unsupported(self.top_logprobs or None, "top_logprobs", "logprobs are not returned for gpt-oss output")
        unsupported(self.prompt, "prompt", "stored prompt templates are OpenAI-hosted")
        if self.include and "message.output_text.logprobs" in self.include:
            unsupported(True, "include", "logprobs are not returned for gpt-oss output")
        if isinstance(self.input, list):
            triggers = [i for i, e in enumerate(self.input) if isinstance(e, CompactionTriggerInput)]
            if triggers and triggers != [len(self.input) - 1]:
                raise invalid("A compaction_trigger must be the last input item.", f"input[{triggers[0]}]")
        fmt = self.text.format if self.text else None
        if isinstance(fmt, TextFormatJsonSchema) and (error := schema_problem(fmt.schema_)) is not None:
            raise invalid(f"text.format.schema is not a valid JSON schema: {error}", "text.format.schema")
        return self

    @property
    def conversation_id(self) -> str | None:
        if isinstance(self.conversation, ConversationRef):
            return self.conversation.id
        return self.conversation

    @property
    def compact_now(self) -> bool:
        """The input ends with a ``compaction_trigger``."""
        return isinstance(self.input, list) and bool(self.input) and isinstance(self.input[-1], CompactionTriggerInput)

    @property
    def compact_threshold(self) -> int | None:
        """Compact before a model turn whose prompt would pass this many tokens."""
        for entry in self.context_management or []:
            if entry.type == "compaction":
                return entry.compact_threshold or DEFAULT_COMPACT_THRESHOLD
        return None

    @property
    def effort(self) -> Literal["low", "medium", "high"]:
        return self.reasoning.harmony_effort if self.reasoning else "medium"

    @property
    def stored(self) -> bool:
        return self.store is not False

    def function_tools(self) -> list[FunctionToolParam]:
        return [t for t in self.tools or [] if isinstance(t, FunctionToolParam)]

    def namespace_tools(self) -> list[NamespaceToolParam]:
        return [t for t in self.tools or [] if isinstance(t, NamespaceToolParam)]

    def mcp_tools(self) -> list[McpToolParam]:
        return [t for t in self.tools or [] if isinstance(t, McpToolParam)]

    def builtin_tools(self) -> list[Literal["browser", "python"]]:
        wanted: list[Literal["browser", "python"]] = []
        for tool in self.tools or []:
            if isinstance(tool, BuiltinToolParam) and tool.builtin not in wanted:
                wanted.append(tool.builtin)
        return wanted
