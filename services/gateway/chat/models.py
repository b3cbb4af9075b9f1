"""Chat Completions request, validated with our own models (OpenAI's are TypedDicts)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ContentPart(_Lenient):
    type: str
    text: str | None = None


class FunctionCallSpec(_Lenient):
    name: str
    arguments: str = ""

    @field_validator("arguments", mode="before")
    @classmethod
    def _args_as_text(cls, v: Any) -> Any:
        # some agents send arguments as an object; the wire format is JSON text
        import json

        return v if isinstance(v, str) or v is None else json.dumps(v)


class ToolCall(_Lenient):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallSpec


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    # reasoning on assistant history: vLLM says `reasoning`, SGLang/DeepSeek
    # `reasoning_content`, some agents `thinking`
    reasoning: str | None = None
    reasoning_content: str | None = None
    thinking: str | None = None


class FunctionDef(_Lenient):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(_Lenient):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Lenient):
    name: str


class NamedToolChoiceParam(_Lenient):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(_Lenient):
    include_usage: bool = False


class ResponseFormat(_Lenient):
    type: str


class ChatRequest(_Strict):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ChatTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoiceParam | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    user: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None

    @model_validator(mode="after")
    def _supported(self) -> ChatRequest:
        from services.gateway.errors import invalid

        if self.n not in (None, 1):
            raise invalid("n > 1 is not supported: Chorus returns one choice per request; send n=1 "
                          "or several requests.", "n")
        if self.logprobs or self.top_logprobs:
            raise invalid("logprobs are not supported for gpt-oss Harmony output (the tokens include "
                          "channel control tokens); remove logprobs/top_logprobs.", "logprobs")
        if self.response_format is not None and self.response_format.type != "text":
            raise invalid("response_format other than 'text' is not supported yet; describe the format "
                          "in the prompt instead.", "response_format")
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                raise invalid(f"{name} is not supported by Chorus yet.", name)
        if self.tool_choice not in (None, "auto", "none") and not self.tools:
            raise invalid("tool_choice requires tools.", "tool_choice")
        if isinstance(self.tool_choice, NamedToolChoiceParam) and self.tools and not any(
            t.function.name == self.tool_choice.function.name for t in self.tools
        ):
            raise invalid(f"tool_choice names the function '{self.tool_choice.function.name}', which is "
                          "not in tools.", "tool_choice")
        return self

    @property
    def max_output(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)
