"""Chat Completions request -> the internal conversation (Responses-style items).

This is the only place that knows Chat's message shapes; everything behind the gateway
sees ``ConversationItem``s."""

from __future__ import annotations

from typing import Any

from contracts.messages.encode import EncodeRequest, FunctionTool, NamedToolChoice, ResponseFormat, ToolChoice
from contracts.messages.generate import SamplingParams
from contracts.messages.items import (
    ConversationItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    ReasoningItem,
)
from services.gateway import structured
from services.gateway.chat.request import (
    ChatMessage,
    ChatRequest,
    NamedToolChoiceParam,
    ResponseFormatJsonObject,
    ResponseFormatJsonSchema,
)
from services.gateway.errors import invalid
from services.gateway.structured import schema_problem


def _text(message: ChatMessage, index: int) -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for j, part in enumerate(content):
        if part.type in ("text", "input_text", "output_text") and part.text is not None:
            parts.append(part.text)
        else:
            raise invalid(
                f"Content part type '{part.type}' is not supported: gpt-oss reads text only.",
                f"messages[{index}].content[{j}]",
            )
    return "".join(parts)


def messages_to_items(messages: list[ChatMessage]) -> list[ConversationItem]:
    items: list[ConversationItem] = []
    for i, m in enumerate(messages):
        text = _text(m, i)
        if m.role in ("system", "developer", "user"):
            items.append(MessageItem(role=m.role, content=text))
        elif m.role == "assistant":
            reasoning = m.reasoning or m.reasoning_content or m.thinking
            if reasoning:
                items.append(ReasoningItem(text=reasoning))
            if text:
                # text beside tool calls is a commentary preamble; alone it is the final answer
                channel = "commentary" if m.tool_calls else "final"
                items.append(MessageItem(role="assistant", content=text, channel=channel))
            for call in m.tool_calls or []:
                items.append(
                    FunctionCallItem(call_id=call.id, name=call.function.name, arguments=call.function.arguments)
                )
        else:  # tool
            if not m.tool_call_id:
                raise invalid("A tool message needs tool_call_id.", f"messages[{i}].tool_call_id")
            items.append(FunctionCallOutputItem(call_id=m.tool_call_id, output=text))
    return items


def _tool_choice(request: ChatRequest) -> ToolChoice:
    choice = request.tool_choice
    if isinstance(choice, NamedToolChoiceParam):
        return NamedToolChoice(name=choice.function.name)
    return choice or "auto"


def response_format_of(request: ChatRequest) -> ResponseFormat | None:
    fmt = request.response_format
    if isinstance(fmt, ResponseFormatJsonSchema):
        error = schema_problem(fmt.json_schema.schema_)
        if error is not None:
            raise invalid(
                f"response_format.json_schema.schema is not a valid JSON schema: {error}",
                "response_format.json_schema.schema",
            )
        spec = fmt.json_schema
        return structured.response_format(
            "json_schema", name=spec.name, schema=spec.schema_, description=spec.description, strict=spec.strict
        )
    if isinstance(fmt, ResponseFormatJsonObject):
        return structured.response_format("json_object")
    return None


def to_encode_request(request: ChatRequest, fmt: ResponseFormat | None = None) -> EncodeRequest:
    return EncodeRequest(
        model=request.model,
        items=messages_to_items(request.messages),
        tools=[
            FunctionTool(name=t.function.name, description=t.function.description, parameters=t.function.parameters)
            for t in request.tools or []
        ],
        tool_choice=_tool_choice(request),
        reasoning_effort=request.effort,
        response_format=fmt,
    )


def to_sampling(
    request: ChatRequest, default_max_tokens: int | None, fmt: ResponseFormat | None = None
) -> SamplingParams:
    choice = request.tool_choice
    named = choice.function.name if isinstance(choice, NamedToolChoiceParam) else choice
    offered = [t.function.name for t in request.tools or []]
    return SamplingParams(
        max_tokens=request.max_output or default_max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        seed=request.seed,
        stop=request.stop_list,
        constraint=structured.constraint(fmt, named, offered),
    )


def offered_tools(request: ChatRequest) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """Names and JSON schemas of the function tools the model may call (for recovery)."""
    tools = request.tools or []
    if request.tool_choice == "none":
        return [], {}
    return ([t.function.name for t in tools], {t.function.name: t.function.parameters or {} for t in tools})
