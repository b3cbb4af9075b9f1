"""Messages API request -> the internal conversation (Responses-style items), the sampling
parameters and the tools the parser may recover calls to.

- ``system`` and the ``system``-role messages Claude Code puts inside ``messages`` are the
  instructions, in order (without Claude Code's ``x-anthropic-billing-header:`` line, which
  changes with every request and would defeat the engines' prefix cache).
- A user message's ``tool_result`` blocks come first (each must answer an earlier
  ``tool_use``), then its text; an ``is_error`` result reads "Error: ...".
- An assistant message keeps its blocks' order: ``thinking`` / ``redacted_thinking`` are
  reasoning (the text is the server's own sealed copy, its ``signature`` / ``data``: the
  plain ``thinking`` text is not trusted), ``tool_use`` a call, text the answer, or the
  commentary preamble when the message also calls a tool (Harmony drops a turn's reasoning
  only once a final answer ends it: the reasoning before a call is kept for the model)."""

from __future__ import annotations

from collections.abc import Callable
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
from services.gateway.errors import invalid
from services.gateway.messages.request import (
    ContentBlock,
    InputMessage,
    MessagesRequest,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolChoiceAny,
    ToolChoiceNone,
    ToolChoiceTool,
    ToolReferenceBlock,
    ToolResultBlock,
    ToolUseBlock,
    effort_of,
)
from services.gateway.messages.response import RAW, input_json
from services.gateway.structured import schema_problem

# (sealed text, the param it came in) -> the text; a 400 naming the param when it is not ours
Unseal = Callable[[str, str], str]
BILLING_HEADER = "x-anthropic-billing-header:"


def _without_billing_header(text: str) -> str:
    if BILLING_HEADER not in text:
        return text
    return "\n".join(line for line in text.split("\n") if not line.startswith(BILLING_HEADER)).strip("\n")


def _system_texts(content: str | list[TextBlock] | list[ContentBlock], at: str) -> list[str]:
    if isinstance(content, str):
        return [content]
    texts: list[str] = []
    for j, block in enumerate(content):
        if not isinstance(block, TextBlock):
            raise invalid(f"{at}.{j}.type: a system message holds text blocks only", f"{at}.{j}.type")
        texts.append(block.text)
    return texts


def instructions_of(request: MessagesRequest) -> str | None:
    """``system``, then every system-role message of ``messages``, in order (one with
    ``clear_at: "next_user_message"`` only until a user message follows it)."""
    texts = _system_texts(request.system, "system") if request.system is not None else []
    last_user = max((i for i, m in enumerate(request.messages) if m.role == "user"), default=-1)
    for i, m in enumerate(request.messages):
        if m.role != "system" or (m.clear_at == "next_user_message" and i < last_user):
            continue
        texts += _system_texts(m.content, f"messages.{i}.content")
    kept = [t for t in (_without_billing_header(t) for t in texts) if t.strip()]
    return "\n\n".join(kept) or None


def arguments_of(tool_input: dict[str, Any]) -> str:
    """A ``tool_use`` input as the call's JSON arguments (what the model wrote, when it was not
    a JSON object and came back as ``{"_raw": text}``)."""
    raw = tool_input.get(RAW)
    if len(tool_input) == 1 and isinstance(raw, str):
        return raw
    return input_json(tool_input)


def _result_text(block: ToolResultBlock) -> str:
    if isinstance(block.content, str):
        text = block.content
    else:
        parts: list[str] = []
        for part in block.content:
            if isinstance(part, TextBlock):
                parts.append(part.text)
            elif isinstance(part, ToolReferenceBlock):
                parts.append(f"Loaded tool: {part.tool_name}")
        text = "\n".join(parts)
    return f"Error: {text}" if block.is_error else text


def _user(blocks: list[ContentBlock], i: int, calls: set[str]) -> list[ConversationItem]:
    results: list[ConversationItem] = []
    texts: list[str] = []
    for j, block in enumerate(blocks):
        at = f"messages.{i}.content.{j}"
        if isinstance(block, ToolResultBlock):
            if block.tool_use_id not in calls:
                raise invalid(
                    f"{at}.tool_use_id: no tool_use block with id '{block.tool_use_id}' comes before this tool_result",
                    f"{at}.tool_use_id",
                )
            results.append(FunctionCallOutputItem(call_id=block.tool_use_id, output=_result_text(block)))
        elif isinstance(block, TextBlock):
            texts.append(block.text)
        else:
            raise invalid(f"{at}.type: '{block.type}' blocks belong in assistant messages", f"{at}.type")
    if texts:
        results.append(MessageItem(role="user", content="\n\n".join(texts)))
    return results


def _assistant(blocks: list[ContentBlock], i: int, calls: set[str], unseal: Unseal) -> list[ConversationItem]:
    channel = "commentary" if any(isinstance(b, ToolUseBlock) for b in blocks) else "final"
    items: list[ConversationItem] = []
    texts: list[str] = []  # neighbouring text blocks are one message

    def said() -> None:
        if texts:
            items.append(MessageItem(role="assistant", content="\n\n".join(texts), channel=channel))
            texts.clear()

    for j, block in enumerate(blocks):
        at = f"messages.{i}.content.{j}"
        if isinstance(block, TextBlock):
            if block.text:
                texts.append(block.text)
            continue
        said()
        if isinstance(block, ThinkingBlock):
            items.append(ReasoningItem(text=unseal(block.signature, f"{at}.signature")))
        elif isinstance(block, RedactedThinkingBlock):
            items.append(ReasoningItem(text=unseal(block.data, f"{at}.data")))
        elif isinstance(block, ToolUseBlock):
            calls.add(block.id)
            items.append(FunctionCallItem(call_id=block.id, name=block.name, arguments=arguments_of(block.input)))
        else:
            raise invalid(f"{at}.type: '{block.type}' blocks belong in user messages", f"{at}.type")
    said()
    return items


def messages_to_items(messages: list[InputMessage], unseal: Unseal) -> list[ConversationItem]:
    """The conversation (system-role messages are instructions, see ``instructions_of``)."""
    items: list[ConversationItem] = []
    calls: set[str] = set()
    last = max((i for i, m in enumerate(messages) if m.role != "system"), default=None)
    for i, m in enumerate(messages):
        if m.role == "system":
            continue
        blocks: list[ContentBlock] = (
            [TextBlock(type="text", text=m.content)] if isinstance(m.content, str) else list(m.content)
        )
        if m.role == "user":
            items += _user(blocks, i, calls)
        elif i == last:
            raise invalid(
                f"messages.{i}: the conversation ends with an assistant message, and prefilling the answer is "
                "not supported by this model; end it with a user message",
                f"messages.{i}",
            )
        else:
            items += _assistant(blocks, i, calls, unseal)
    if last is None:
        raise invalid("messages: at least one user message is required", "messages")
    return items


def _tool_choice(request: MessagesRequest) -> ToolChoice:
    choice = request.tool_choice
    if isinstance(choice, ToolChoiceTool):
        return NamedToolChoice(name=choice.name)
    if isinstance(choice, ToolChoiceAny):
        return "required"
    if isinstance(choice, ToolChoiceNone):
        return "none"
    return "auto"


def response_format_of(request: MessagesRequest) -> ResponseFormat | None:
    """``output_config.format`` (Anthropic's structured outputs) as the format the answer follows."""
    fmt = request.output_config.format if request.output_config else None
    if fmt is None:
        return None
    error = schema_problem(fmt.schema_)
    if error is not None:
        raise invalid(f"output_config.format.schema: not a valid JSON schema: {error}", "output_config.format.schema")
    return structured.response_format("json_schema", schema=fmt.schema_, strict=True)


def to_encode_request(request: MessagesRequest, *, unseal: Unseal) -> EncodeRequest:
    return EncodeRequest(
        model=request.model,
        items=messages_to_items(request.messages, unseal),
        instructions=instructions_of(request),
        tools=[
            FunctionTool(name=t.name, description=t.description, parameters=t.input_schema)
            for t in request.custom_tools
        ],
        tool_choice=_tool_choice(request),
        reasoning_effort=effort_of(request),
        response_format=response_format_of(request),
    )


def to_sampling(request: MessagesRequest, default_max_tokens: int | None = None) -> SamplingParams:
    """The engine's sampling. ``max_tokens`` is required in this API, so ``default_max_tokens``
    (the budget of requests that set none) never applies; ``top_k`` 0 means none, as -1 does."""
    choice = _tool_choice(request)
    named = choice.name if isinstance(choice, NamedToolChoice) else choice
    offered = [t.name for t in request.custom_tools]
    return SamplingParams(
        max_tokens=request.max_tokens or default_max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k or None,
        stop=list(request.stop_sequences or []),
        constraint=structured.constraint(response_format_of(request), named, offered),
    )


def offered_tools(request: MessagesRequest) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """Names and JSON schemas of the tools the model may call (for the parser's recovery)."""
    if isinstance(request.tool_choice, ToolChoiceNone):
        return [], {}
    tools = request.custom_tools
    return [t.name for t in tools], {t.name: t.input_schema for t in tools}
