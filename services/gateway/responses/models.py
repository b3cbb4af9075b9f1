"""POST /v1/responses request, validated with our own models: unknown fields and fields Chorus
cannot honour are a 400 naming the field, never silently dropped."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.gateway.errors import invalid

BUILTIN_TYPES = {"web_search": "browser", "web_search_preview": "browser", "code_interpreter": "python"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FunctionToolParam(_Lenient):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class McpAllowedToolsFilter(_Lenient):
    tool_names: list[str] | None = None
    read_only: bool | None = None


class McpApprovalFilter(_Lenient):
    always: McpAllowedToolsFilter | None = None
    never: McpAllowedToolsFilter | None = None


class McpToolParam(_Lenient):
    type: Literal["mcp"]
    server_label: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")
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
            raise invalid("MCP connectors are not supported; give a server_url.", "tools")
        if not self.server_url:
            raise invalid("An mcp tool needs a server_url.", "tools")
        return self


class ReasoningParam(_Lenient):
    effort: Literal["low", "medium", "high"] | None = None
    summary: Literal["auto"] | None = None
    generate_summary: None = None


class TextFormat(_Lenient):
    type: str


class TextParam(_Lenient):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None


class NamedFunction(_Lenient):
    type: Literal["function"]
    name: str


class ConversationRef(_Lenient):
    id: str


class ResponsesRequest(_Strict):
    model: str
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    conversation: str | ConversationRef | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    reasoning: ReasoningParam | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    max_tool_calls: int | None = Field(default=None, ge=0)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    store: bool | None = True
    background: bool | None = False
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    include: list[str] | None = None
    text: TextParam | None = None
    truncation: Literal["disabled"] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: Literal["auto", "default"] | None = None
    top_logprobs: None = None
    seed: int | None = None

    @model_validator(mode="after")
    def _supported(self) -> ResponsesRequest:
        if self.previous_response_id and self.conversation:
            raise invalid("previous_response_id and conversation cannot be used together.", "conversation")
        if self.input is None and not (self.previous_response_id or self.conversation):
            raise invalid("Missing required parameter: 'input'.", "input")
        if self.include:
            raise invalid(f"include value '{self.include[0]}' is not supported by Chorus (reasoning is "
                          "returned as plain reasoning_text content already).", "include")
        if self.text and self.text.format and self.text.format.type != "text":
            raise invalid(f"text.format type '{self.text.format.type}' is not supported yet; only 'text'.",
                          "text.format")
        if self.background and self.store is False:
            raise invalid("background responses must be stored (store: true).", "background")
        return self

    @property
    def conversation_id(self) -> str | None:
        if isinstance(self.conversation, ConversationRef):
            return self.conversation.id
        return self.conversation

    def function_tools(self) -> list[FunctionToolParam]:
        return [t for t in self.parsed_tools() if isinstance(t, FunctionToolParam)]

    def mcp_tools(self) -> list[McpToolParam]:
        return [t for t in self.parsed_tools() if isinstance(t, McpToolParam)]

    def builtin_tools(self) -> list[str]:
        """gpt-oss built-ins asked for: web search -> browser, code interpreter -> python."""
        wanted = []
        for raw in self.tools or []:
            kind = raw.get("type")
            if kind in BUILTIN_TYPES and BUILTIN_TYPES[kind] not in wanted:
                wanted.append(BUILTIN_TYPES[kind])
        return wanted

    def parsed_tools(self) -> list[FunctionToolParam | McpToolParam]:
        out: list[FunctionToolParam | McpToolParam] = []
        for i, raw in enumerate(self.tools or []):
            kind = raw.get("type")
            if kind in BUILTIN_TYPES:
                continue
            if kind == "function":
                out.append(_validate(FunctionToolParam, raw, f"tools[{i}]"))
            elif kind == "mcp":
                out.append(_validate(McpToolParam, raw, f"tools[{i}]"))
            else:
                raise invalid(f"Tool type '{kind}' is not supported by Chorus (function, mcp, "
                              "web_search and code_interpreter are).",
                              f"tools[{i}].type")
        return out


def _validate(model: type[BaseModel], raw: dict[str, Any], param: str) -> Any:
    from pydantic import ValidationError

    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        raise invalid(f"Invalid tool: {where}: {err.get('msg')}", f"{param}.{where}" if where else param) from exc
