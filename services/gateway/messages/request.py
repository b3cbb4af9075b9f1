"""``POST /v1/messages``: the request, typed with our own models (Anthropic's are TypedDicts).

Every field Anthropic's Messages API accepts is declared. Fields that do not change the output
(``metadata``, ``service_tier``, ``cache_control``, ``context_management`` ...) are accepted
and logged at debug; what Chorus cannot honour is a 400 naming the field. Nested objects ignore
fields they do not know (Claude Code adds some in every release: ``defer_loading``,
``cache_control.scope``); an unknown top-level field is a 400 worded as Anthropic words it
("Extra inputs are not permitted") unless the operator sets ``CHORUS_IGNORE_UNKNOWN_FIELDS``.

Content blocks: ``text``, ``thinking``, ``redacted_thinking``, ``tool_use`` and ``tool_result``
(whose content may hold ``text`` and Claude Code's ``tool_reference`` blocks). Images and
documents are refused (gpt-oss reads text only), and so are the blocks of Anthropic's server
tools and any tool that is not a client tool: Chorus does not run them, and a model told of a
web search it cannot make would invent its results (Claude Code's WebSearch tool then reports
the 400 to the model and the session goes on).

Errors are ``CallerError``s naming the field in Anthropic's dotted form
(``messages.3.content.0.tool_use_id``), with Anthropic's wording: ``max_tokens: Field required``."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Discriminator, Field, Tag, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from services.gateway.errors import invalid
from services.gateway.request_base import ApiRequest, Lenient
from services.gateway.validation import param_of, parse_json, problem

Text = Annotated[str, Field(max_length=4_000_000)]
Sealed = Annotated[str, Field(max_length=40_000_000)]  # a sealed reasoning text (signature, data)
Id = Annotated[str, Field(min_length=1, max_length=256)]
ToolName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")]

# blocks that carry what gpt-oss cannot read
MEDIA_BLOCKS = frozenset({"image", "document", "search_result", "container_upload"})
# blocks of tools Anthropic runs on its servers (and MCP connector calls)
SERVER_BLOCKS = frozenset(
    {
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
    }
)
BLOCKS = "text, thinking, redacted_thinking, tool_use and tool_result"


def _refusal(kind: str) -> PydanticCustomError:
    if kind in MEDIA_BLOCKS:
        return PydanticCustomError(
            "text_only", "'{kind}' blocks are not supported: this model takes text only", {"kind": kind}
        )
    if kind in SERVER_BLOCKS:
        return PydanticCustomError(
            "server_tool_block",
            "'{kind}' blocks belong to Anthropic's server tools, which Chorus does not run",
            {"kind": kind},
        )
    return PydanticCustomError(
        "unknown_block",
        "unknown content block type '{kind}': Chorus accepts {blocks}",
        {"kind": kind, "blocks": BLOCKS},
    )


def _tagged(known: frozenset[str]) -> Callable[[Any], str]:
    """A discriminator: a known block's type names its model, anything else is refused."""

    def tag(value: Any) -> str:
        kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        # tags are no field's name: an error's location skips them (``validation.param_of``)
        return f"{kind} block" if isinstance(kind, str) and kind in known else "refused block"

    return tag


class RefusedBlock(Lenient):
    """A block Chorus cannot take: its ``type`` says why (a 400 naming ``...type``)."""

    type: str

    @field_validator("type")
    @classmethod
    def _refuse(cls, kind: str) -> str:
        raise _refusal(kind)


class TextBlock(Lenient):
    type: Literal["text"]
    text: Text
    cache_control: dict[str, Any] | None = None
    citations: list[Any] | None = None


class ThinkingBlock(Lenient):
    """Reasoning Chorus produced: ``signature`` is its text, sealed (the only text trusted)."""

    type: Literal["thinking"]
    thinking: Text = ""
    signature: Sealed


class RedactedThinkingBlock(Lenient):
    type: Literal["redacted_thinking"]
    data: Sealed


class ToolUseBlock(Lenient):
    type: Literal["tool_use"]
    id: Id
    name: Annotated[str, Field(min_length=1, max_length=256)]
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolReferenceBlock(Lenient):
    """Claude Code's ToolSearch result: a deferred tool it has loaded (every tool is offered
    to gpt-oss from the start, so this is told to the model as text)."""

    type: Literal["tool_reference"]
    tool_name: Annotated[str, Field(min_length=1, max_length=256)]


ResultPart = Annotated[
    Annotated[TextBlock, Tag("text block")]
    | Annotated[ToolReferenceBlock, Tag("tool_reference block")]
    | Annotated[RefusedBlock, Tag("refused block")],
    Discriminator(_tagged(frozenset({"text", "tool_reference"}))),
]


class ToolResultBlock(Lenient):
    type: Literal["tool_result"]
    tool_use_id: Id
    content: Text | list[ResultPart] = ""
    is_error: bool = False
    cache_control: dict[str, Any] | None = None


ContentBlock = Annotated[
    Annotated[TextBlock, Tag("text block")]
    | Annotated[ThinkingBlock, Tag("thinking block")]
    | Annotated[RedactedThinkingBlock, Tag("redacted_thinking block")]
    | Annotated[ToolUseBlock, Tag("tool_use block")]
    | Annotated[ToolResultBlock, Tag("tool_result block")]
    | Annotated[RefusedBlock, Tag("refused block")],
    Discriminator(_tagged(frozenset({"text", "thinking", "redacted_thinking", "tool_use", "tool_result"}))),
]


class InputMessage(Lenient):
    """A turn. ``system`` (Claude Code sends one inside ``messages``) joins the instructions."""

    role: Literal["user", "assistant", "system"]
    content: Text | Annotated[list[ContentBlock], Field(max_length=100_000)]
    clear_at: Literal["next_user_message", "never"] | None = None  # system: shown until the next user turn


class CustomTool(Lenient):
    """A client tool (``type`` absent or ``custom``). ``defer_loading`` is accepted: every tool
    is offered to the model from the start (Claude Code sends each deferred tool's full schema)."""

    type: Literal["custom"] | None = None
    name: ToolName
    description: Text | None = None
    input_schema: dict[str, Any]
    cache_control: dict[str, Any] | None = None
    defer_loading: bool | None = None
    strict: bool | None = None


class ServerTool(Lenient):
    """A tool Anthropic defines and runs (``web_search_20250305``, ``bash_20250124`` ...)."""

    type: str

    @field_validator("type")
    @classmethod
    def _refuse(cls, kind: str) -> str:
        raise PydanticCustomError(
            "server_tool",
            "tool type '{kind}' is not supported: Chorus serves client tools only (a name, a description and "
            "an input_schema), not Anthropic's server tools",
            {"kind": kind},
        )


def _tool_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "custom tool" if kind in (None, "custom") else "server tool"


Tool = Annotated[
    Annotated[CustomTool, Tag("custom tool")] | Annotated[ServerTool, Tag("server tool")], Discriminator(_tool_kind)
]


class ToolChoiceAuto(Lenient):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None  # gpt-oss makes one call per turn anyway


class ToolChoiceAny(Lenient):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(Lenient):
    type: Literal["tool"]
    name: Annotated[str, Field(min_length=1, max_length=256)]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(Lenient):
    type: Literal["none"]


ToolChoice = Annotated[ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")]
Display = Annotated[str, Field(max_length=64)]  # "summarized", "omitted", "updates": all but omitted show the text


class ThinkingEnabled(Lenient):
    type: Literal["enabled"]
    budget_tokens: Annotated[int, Field(ge=1024)]
    display: Display | None = None


class ThinkingDisabled(Lenient):
    type: Literal["disabled"]


class ThinkingAdaptive(Lenient):
    type: Literal["adaptive", "between_tools"]
    display: Display | None = None


Thinking = Annotated[ThinkingEnabled | ThinkingDisabled | ThinkingAdaptive, Field(discriminator="type")]


class JsonOutputFormat(Lenient):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(Lenient):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: JsonOutputFormat | None = None


class Metadata(Lenient):
    user_id: Annotated[str, Field(max_length=512)] | None = None


class MessagesRequest(ApiRequest):
    harmless: ClassVar[frozenset[str]] = frozenset(
        {
            "metadata",
            "service_tier",
            "container",
            "context_management",
            "cache_control",
            "inference_geo",
            "speed",
            "diagnostics",
        }
    )

    model: Annotated[str, Field(min_length=1, max_length=256)]
    max_tokens: Annotated[int, Field(ge=1)]
    messages: list[InputMessage] = Field(min_length=1, max_length=100_000)
    system: Text | list[TextBlock] | None = None
    tools: list[Tool] | None = Field(default=None, max_length=512)
    tool_choice: ToolChoice | None = None
    stop_sequences: list[Annotated[str, Field(min_length=1, max_length=256)]] | None = Field(
        default=None, max_length=64
    )
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    metadata: Metadata | None = None
    stream: bool = False
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    context_management: dict[str, Any] | None = None  # server-side history edits: the encoder drops old reasoning
    service_tier: str | None = None
    container: str | dict[str, Any] | None = None
    mcp_servers: list[dict[str, Any]] | None = None
    cache_control: dict[str, Any] | None = None
    inference_geo: str | None = None
    speed: str | None = None
    diagnostics: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _supported(self) -> MessagesRequest:
        if self.mcp_servers:
            raise invalid(
                "mcp_servers: the MCP connector is not supported by Chorus; offer the MCP server's tools as tools",
                "mcp_servers",
            )
        if isinstance(self.thinking, ThinkingEnabled) and self.thinking.budget_tokens >= self.max_tokens:
            raise invalid("max_tokens: must be greater than thinking.budget_tokens", "max_tokens")
        choice = self.tool_choice
        if isinstance(choice, (ToolChoiceAny, ToolChoiceTool)) and not self.tools:
            raise invalid(f"tool_choice: '{choice.type}' requires tools", "tool_choice")
        if isinstance(choice, ToolChoiceTool) and not any(t.name == choice.name for t in self.custom_tools):
            raise invalid(f"tool_choice.name: tool '{choice.name}' is not in tools", "tool_choice.name")
        return self

    @property
    def custom_tools(self) -> list[CustomTool]:
        return [t for t in self.tools or [] if isinstance(t, CustomTool)]


def effort_of(request: MessagesRequest) -> Literal["low", "medium", "high"]:
    """Harmony's reasoning effort: ``output_config.effort`` when given (beyond high is high),
    else from ``thinking``: disabled is low, a budget under 4096 low, under 16384 medium,
    more high; adaptive (and no thinking at all) medium."""
    effort = request.output_config.effort if request.output_config else None
    if effort == "low" or effort == "medium":
        return effort
    if effort is not None:  # high, xhigh, max
        return "high"
    thinking = request.thinking
    if isinstance(thinking, ThinkingDisabled):
        return "low"
    if isinstance(thinking, ThinkingEnabled):
        budget = thinking.budget_tokens
        return "low" if budget < 4096 else "medium" if budget < 16384 else "high"
    return "medium"


def thinking_kept(request: MessagesRequest) -> bool:
    """Whether the answer carries thinking blocks: not when thinking is off (absent or
    disabled), as Anthropic's answers then have none (clients read ``content[0].text``)."""
    return isinstance(request.thinking, (ThinkingEnabled, ThinkingAdaptive))


def thinking_shown(request: MessagesRequest) -> bool:
    """Whether thinking blocks carry their text: not with ``display: "omitted"`` (the block
    then has an empty ``thinking`` and its signature, which brings the reasoning back)."""
    thinking = request.thinking
    return isinstance(thinking, (ThinkingEnabled, ThinkingAdaptive)) and thinking.display != "omitted"


# -- errors in Anthropic's words ---------------------------------------------------------------
_CLASS_NAMED = frozenset({"model_type", "model_attributes_type", "dataclass_type"})


def dotted(param: str) -> str:
    """``messages[3].content[0]`` as Anthropic names it: ``messages.3.content.0``."""
    return re.sub(r"\[(\d+)\]", r".\1", param)


def _message(kind: str, msg: str) -> str:
    if kind in _CLASS_NAMED:
        return "Input should be a valid dictionary"
    return msg.removeprefix("Value error, ")


def validate_request(data: Any, *, ignore_unknown: bool = False) -> MessagesRequest:
    if not isinstance(data, dict):
        raise invalid("The request body must be a JSON object.")
    if ignore_unknown:
        data = {k: v for k, v in data.items() if k in MessagesRequest.model_fields}
    try:
        return MessagesRequest.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        # every union branch reports; the deepest error is the most specific one
        first = max(errors, key=lambda e: len(e.get("loc", ())))
        kind = str(first.get("type", ""))
        param = dotted(param_of(tuple(first.get("loc", ())), data))
        code, _ = problem(kind, param, "", first.get("input"), first.get("ctx"))
        message = _message(kind, str(first.get("msg", "invalid")))
        raise invalid(f"{param}: {message}" if param else message, param or None, code) from None


def parse_request(raw: bytes, *, ignore_unknown: bool = False) -> MessagesRequest:
    """A request body (JSON) as a ``MessagesRequest``; anything wrong is a 400 naming it."""
    return validate_request(parse_json(raw), ignore_unknown=ignore_unknown)
