"""``POST /v1/chat/completions``: the request, typed with our own models (OpenAI's are
TypedDicts). Every field OpenAI accepts is declared: harmless ones are accepted, ones Chorus
cannot honour are a 400 naming them (see services/gateway/request_base.py)."""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from services.gateway.errors import invalid
from services.gateway.request_base import ApiRequest, Lenient, Strict, unsupported

Text = Annotated[str, Field(max_length=4_000_000)]


class ContentPart(Lenient):
    type: str
    text: Text | None = None


class FunctionCallSpec(Lenient):
    name: Annotated[str, Field(min_length=1, max_length=256)]
    arguments: Text = ""

    @field_validator("arguments", mode="before")
    @classmethod
    def _args_as_text(cls, v: Any) -> Any:
        # some agents send arguments as an object; the wire format is JSON text
        return v if isinstance(v, str) or v is None else json.dumps(v)


class ToolCall(Lenient):
    id: Annotated[str, Field(min_length=1, max_length=256)]
    type: Literal["function"] = "function"
    function: FunctionCallSpec


class ChatMessage(Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=128)
    tool_call_id: str | None = None
    # reasoning on assistant history: vLLM says `reasoning`, SGLang/DeepSeek
    # `reasoning_content`, some agents `thinking`
    reasoning: Text | None = None
    reasoning_content: Text | None = None
    thinking: Text | None = None


class FunctionDef(Lenient):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(Lenient):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Lenient):
    name: str


class NamedToolChoiceParam(Lenient):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(Lenient):
    include_usage: bool = False


class JsonSchemaSpec(Strict):
    name: Annotated[str, Field(min_length=1, max_length=64)]
    schema_: dict[str, Any] = Field(default_factory=lambda: {"type": "object"}, alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponseFormatText(Strict):
    type: Literal["text"]


class ResponseFormatJsonObject(Strict):
    type: Literal["json_object"]


class ResponseFormatJsonSchema(Strict):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[
    ResponseFormatText | ResponseFormatJsonObject | ResponseFormatJsonSchema, Field(discriminator="type")
]


class ChatRequest(ApiRequest):
    harmless: ClassVar[frozenset[str]] = frozenset(
        {
            "metadata",
            "user",
            "store",
            "service_tier",
            "prompt_cache_key",
            "prompt_cache_retention",
            "safety_identifier",
            "parallel_tool_calls",
            "stream_options",
            "verbosity",
            "moderation",
        }
    )

    model: Annotated[str, Field(min_length=1, max_length=256)]
    messages: list[ChatMessage] = Field(min_length=1, max_length=100_000)
    tools: list[ChatTool] | None = Field(default=None, max_length=512)
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoiceParam | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    stop: (
        Annotated[str, Field(max_length=256)]
        | Annotated[list[Annotated[str, Field(max_length=256)]], Field(max_length=16)]
        | None
    ) = None
    seed: int | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    response_format: ResponseFormat | None = None
    user: Annotated[str, Field(max_length=512)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    logit_bias: dict[str, float] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None  # passed to the engine
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None = Field(
        default=None, max_length=16
    )
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: Annotated[str, Field(max_length=512)] | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: Annotated[str, Field(max_length=512)] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    moderation: Any = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: Any = None

    @model_validator(mode="after")
    def _supported(self) -> ChatRequest:
        if self.n not in (None, 1):
            raise invalid(
                "n > 1 is not supported: Chorus returns one choice per request; send n=1 or several requests.", "n"
            )
        unsupported(
            self.logprobs or self.top_logprobs or None,
            "logprobs",
            "gpt-oss Harmony output interleaves channel control tokens; remove logprobs/top_logprobs",
        )
        unsupported(self.logit_bias or None, "logit_bias", "token biases are not passed to the engines")
        if self.modalities and self.modalities != ["text"]:
            unsupported(True, "modalities", "gpt-oss produces text only")
        unsupported(self.audio, "audio", "gpt-oss produces text only")
        unsupported(self.prediction, "prediction", "predicted outputs are not supported")
        unsupported(
            self.web_search_options,
            "web_search_options",
            "use the Responses API's web_search tool with a browser configured",
        )
        unsupported(
            self.functions or self.function_call,
            "functions",
            "the deprecated functions API is not supported; send tools",
        )
        if self.tool_choice not in (None, "auto", "none") and not self.tools:
            raise invalid("tool_choice requires tools.", "tool_choice")
        if (
            isinstance(self.tool_choice, NamedToolChoiceParam)
            and self.tools
            and not any(t.function.name == self.tool_choice.function.name for t in self.tools)
        ):
            raise invalid(
                f"tool_choice names the function '{self.tool_choice.function.name}', which is not in tools.",
                "tool_choice",
            )
        return self

    @property
    def max_output(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def stop_list(self) -> list[str]:
        """The stop strings for the engine: an empty one can match nothing (vLLM refuses it)."""
        if self.stop is None:
            return []
        return [s for s in ([self.stop] if isinstance(self.stop, str) else self.stop) if s]

    @property
    def effort(self) -> Literal["low", "medium", "high"]:
        effort = self.reasoning_effort or "medium"
        return "low" if effort in ("none", "minimal", "low") else "high" if effort in ("high", "xhigh") else "medium"
