"""Conversation items -> Harmony messages -> prompt token ids (openai-harmony).

Pure: ``render_prompt(request, encoding, today)``. Caller mistakes raise ``RenderError``
carrying the ``BusError`` to send back."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable

from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncoding,
    Message,
    ReasoningEffort,
    Role,
    SystemContent,
    ToolDescription,
    ToolNamespaceConfig,
)

from contracts.errors import BusError, ErrorCode
from contracts.messages.encode import EncodedPrompt, EncodeRequest, FunctionTool, NamedToolChoice
from contracts.messages.items import (
    ConversationItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    McpCallItem,
    MessageItem,
    ReasoningItem,
)
from services.common.harmony import ASSISTANT_STOP_TOKENS

_EFFORT = {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM, "high": ReasoningEffort.HIGH}
JSON_CONTENT_TYPE = "<|constrain|>json"
REQUIRED_TOOL_INSTRUCTION = "You must call at least one of the available tools before giving a final answer."


class RenderError(Exception):
    def __init__(self, error: BusError) -> None:
        super().__init__(error.message)
        self.error = error


def _invalid(message: str, param: str) -> RenderError:
    return RenderError(BusError(code=ErrorCode.INVALID_REQUEST, message=message, param=param))


def _tool_descriptions(tools: Iterable[FunctionTool]) -> list[ToolDescription]:
    return [ToolDescription.new(t.name, t.description or "", parameters=t.parameters) for t in tools]


def system_message(req: EncodeRequest, today: dt.date, knowledge_cutoff: str) -> Message:
    content = (
        SystemContent.new()
        .with_reasoning_effort(_EFFORT[req.reasoning_effort])
        .with_knowledge_cutoff(knowledge_cutoff)
        .with_conversation_start_date(req.current_date or today.isoformat())
    )
    if "browser" in req.builtin_tools:
        content = content.with_browser_tool()
    if "python" in req.builtin_tools:
        content = content.with_python_tool()
    return Message.from_role_and_content(Role.SYSTEM, content)


def developer_message(req: EncodeRequest) -> Message | None:
    instructions = [req.instructions] if req.instructions else []
    instructions += [
        item.content for item in req.items
        if isinstance(item, MessageItem) and item.role in ("system", "developer") and item.content
    ]
    tools = list(req.tools)
    namespaces = list(req.namespaces)
    choice = req.tool_choice
    if choice == "none":
        tools, namespaces = [], []
    elif choice == "required" and (tools or namespaces):
        instructions.append(REQUIRED_TOOL_INSTRUCTION)
    elif isinstance(choice, NamedToolChoice):
        tools = [t for t in tools if t.name == choice.name]
        if not tools:
            raise _invalid(f"tool_choice names the function '{choice.name}', which is not among the "
                           "offered tools.", "tool_choice")
        namespaces = []
        instructions.append(f"You must call the tool `functions.{choice.name}` before giving a final answer.")
    if not (instructions or tools or namespaces):
        return None
    content = DeveloperContent.new()
    if instructions:
        content = content.with_instructions("\n\n".join(instructions))
    if tools:
        content = content.with_function_tools(_tool_descriptions(tools))
    for ns in namespaces:
        content = content.with_tools(ToolNamespaceConfig(
            name=ns.name, description=ns.description, tools=_tool_descriptions(ns.tools)))
    return Message.from_role_and_content(Role.DEVELOPER, content)


def _recipient(namespace: str, name: str) -> str:
    if namespace == name or not name:  # e.g. the python built-in
        return namespace
    return f"{namespace}.{name}"


def _call(recipient: str, arguments: str) -> Message:
    return (
        Message.from_role_and_content(Role.ASSISTANT, arguments or "{}")
        .with_channel("commentary")
        .with_recipient(recipient)
        .with_content_type(JSON_CONTENT_TYPE)
    )


def _tool_output(recipient: str, output: str) -> Message:
    return (
        Message.from_author_and_content(Author.new(Role.TOOL, recipient), output)
        .with_recipient("assistant")
        .with_channel("commentary")
    )


def _kept(items: list[ConversationItem]) -> list[ConversationItem]:
    """Harmony drops chain-of-thought from turns that ended in a final answer: reasoning before
    the last assistant final-channel message is dropped; the current turn's is kept."""
    last_final = -1
    for i, item in enumerate(items):
        if isinstance(item, MessageItem) and item.role == "assistant" and item.channel in (None, "final"):
            last_final = i
    return [item for i, item in enumerate(items) if not (isinstance(item, ReasoningItem) and i < last_final)]


def conversation_messages(req: EncodeRequest, today: dt.date, knowledge_cutoff: str) -> list[Message]:
    messages = [system_message(req, today, knowledge_cutoff)]
    developer = developer_message(req)
    if developer is not None:
        messages.append(developer)
    recipients: dict[str, str] = {}  # call_id -> recipient, for tool outputs
    for item in _kept(list(req.items)):
        if isinstance(item, MessageItem):
            if item.role == "user":
                messages.append(Message.from_role_and_content(Role.USER, item.content))
            elif item.role == "assistant":
                messages.append(Message.from_role_and_content(Role.ASSISTANT, item.content)
                                .with_channel(item.channel or "final"))
            # system / developer items went into the developer message
        elif isinstance(item, ReasoningItem):
            if item.text:
                messages.append(Message.from_role_and_content(Role.ASSISTANT, item.text).with_channel("analysis"))
        elif isinstance(item, FunctionCallItem):
            recipient = _recipient(item.namespace, item.name)
            recipients[item.call_id] = recipient
            messages.append(_call(recipient, item.arguments))
        elif isinstance(item, FunctionCallOutputItem):
            author = recipients.get(item.call_id)
            if author is None:
                raise _invalid(f"No tool call found for function call output with call_id "
                               f"'{item.call_id}'.", "input")
            messages.append(_tool_output(author, item.output))
        elif isinstance(item, McpCallItem):
            recipient = _recipient(item.server_label, item.name)
            messages.append(_call(recipient, item.arguments))
            result = item.output if item.error is None else f"Error: {item.error}"
            if result is not None:
                messages.append(_tool_output(recipient, result))
        # mcp_list_tools and approval items are bookkeeping, not prompt text
    return messages


def selection_text(items: Iterable[ConversationItem]) -> str:
    last = ""
    for item in items:
        if isinstance(item, MessageItem) and item.role == "user":
            last = item.content
    return last


def render_prompt(
    req: EncodeRequest, encoding: HarmonyEncoding, today: dt.date, knowledge_cutoff: str = "2024-06"
) -> EncodedPrompt:
    t0 = time.perf_counter()
    messages = conversation_messages(req, today, knowledge_cutoff)
    try:
        token_ids = encoding.render_conversation_for_completion(
            Conversation.from_messages(messages), Role.ASSISTANT
        )
    except Exception as exc:  # openai-harmony rejects a conversation it cannot render
        raise _invalid(f"The conversation cannot be rendered as Harmony: {exc}", "input") from exc
    return EncodedPrompt(
        token_ids=list(token_ids),
        stop_token_ids=list(ASSISTANT_STOP_TOKENS),
        selection_text=selection_text(req.items),
        render_ms=(time.perf_counter() - t0) * 1000,
    )
