"""Conversation items -> Harmony messages -> prompt token ids (openai-harmony).

Pure functions of the request; ``renderer.Renderer`` assembles them into token ids (with its
caches). Caller mistakes raise ``RenderError`` carrying the ``BusError`` to send back."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

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
from contracts.messages.encode import EncodeRequest, FunctionTool, NamedToolChoice, ResponseFormat
from contracts.messages.items import (
    CompactionItem,
    ConversationItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    McpCallItem,
    MessageItem,
    ReasoningItem,
)
from services.common.harmony import MESSAGE
from services.common.tokens import MAX_PIECE, encode_text, pieces

_EFFORT = {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM, "high": ReasoningEffort.HIGH}
JSON_CONTENT_TYPE = "<|constrain|>json"
REQUIRED_TOOL_INSTRUCTION = "You must call at least one of the available tools before giving a final answer."


@dataclass(frozen=True, slots=True)
class EncodedPrompt:
    token_ids: list[int]
    stop_token_ids: list[int]
    selection_text: str  # the last user message's text, for worker selection
    render_ms: float = 0.0
    prefix_len: int = 0  # the system and developer messages' tokens, at the start


@dataclass(frozen=True, slots=True)
class Frame:
    """A conversation message without its content: what its rendered header and terminator
    depend on (the renderer caches them by it, and encodes the content in between)."""

    role: Role
    channel: str | None = None
    recipient: str | None = None
    tool: str | None = None  # the author's name: the tool whose output this is
    content_type: str | None = None

    def message(self, content: str = "") -> Message:
        author = Author.new(self.role, self.tool) if self.tool is not None else Author(role=self.role)
        message = Message.from_author_and_content(author, content)
        if self.channel is not None:
            message = message.with_channel(self.channel)
        if self.recipient is not None:
            message = message.with_recipient(self.recipient)
        if self.content_type is not None:
            message = message.with_content_type(self.content_type)
        return message


USER = Frame(Role.USER)


class RenderError(Exception):
    def __init__(self, error: BusError) -> None:
        super().__init__(error.message)
        self.error = error

    def __reduce__(self) -> tuple[type[RenderError], tuple[BusError]]:
        # raised in a render process, it travels back pickled: rebuilt from its error (by
        # default from its message, which broke the pool: every later render failed)
        return RenderError, (self.error,)


def invalid(message: str, param: str) -> RenderError:
    return RenderError(BusError(code=ErrorCode.INVALID_REQUEST, message=message, param=param))


def too_long(limit: int) -> RenderError:
    """A prompt found longer than the context before all of it was encoded (the wording
    follows the encoder's check of a whole prompt)."""
    return RenderError(
        BusError(
            code=ErrorCode.CONTEXT_LENGTH_EXCEEDED,
            param="messages",
            message=(
                f"This model's maximum context length is {limit} tokens. However, your prompt has more "
                f"than {limit} tokens. Please reduce the length of the input."
            ),
        )
    )


class PastLimit(Exception):
    """More tokens than the room left (``Renderer.render`` says how long the context is)."""


def encode_within(encoding: HarmonyEncoding, text: str, room: int | None) -> list[int]:
    """``encode_text``, giving up (``PastLimit``) once the text alone takes ``room`` tokens:
    16 MB of one word is refused after encoding about a context's worth of it, not all of it."""
    if room is None or len(text) <= MAX_PIECE:
        return encode_text(encoding, text)
    out: list[int] = []
    for piece in pieces(text):
        out += encoding.encode(piece, disallowed_special=())
        if len(out) >= room:
            raise PastLimit
    return out


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
        item.content
        for item in req.items
        if isinstance(item, MessageItem) and item.role in ("system", "developer") and item.content
    ]
    instructions += [  # compacted history: what the model knows of the conversation before it
        f"Summary of the conversation so far:\n\n{item.summary}"
        for item in req.items
        if isinstance(item, CompactionItem) and item.summary
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
            raise invalid(
                f"tool_choice names the function '{choice.name}', which is not among the offered tools.", "tool_choice"
            )
        namespaces = []
        instructions.append(f"You must call the tool `functions.{choice.name}` before giving a final answer.")
    if not (instructions or tools or namespaces or req.response_format):
        return None
    content = DeveloperContent.new()
    if instructions:
        content = content.with_instructions("\n\n".join(instructions))
    if tools:
        content = content.with_function_tools(_tool_descriptions(tools))
    for ns in namespaces:
        content = content.with_tools(
            ToolNamespaceConfig(name=ns.name, description=ns.description, tools=_tool_descriptions(ns.tools))
        )
    return Message.from_role_and_content(Role.DEVELOPER, content)


def response_formats_section(fmt: ResponseFormat) -> str:
    """The "# Response Formats" section that ends the developer message (openai/harmony
    docs/format.md, "Structured output"): the format's name, its description as ``//`` lines,
    the JSON schema."""
    lines = ["# Response Formats", "", f"## {fmt.name}", ""]
    if fmt.description:
        lines += [f"// {line}".rstrip() for line in fmt.description.splitlines()]
    lines.append(json.dumps(fmt.json_schema, ensure_ascii=False, separators=(",", ":")))
    return "\n".join(lines)


def with_response_formats(
    tokens: list[int], encoding: HarmonyEncoding, fmt: ResponseFormat, limit: int | None = None
) -> list[int]:
    """The rendered system and developer messages with the response formats section at the end
    of the developer message (the last message). openai-harmony 0.0.8 cannot render it
    (DeveloperContent has instructions and tools only), so the section joins the developer
    text as harmony joins its own sections ("\\n\\n") and the whole text is encoded again: the
    tokens where they meet are those of one text, as a renderer with the section would give."""
    section = response_formats_section(fmt)
    return _rewrite_last(tokens, encoding, lambda text: f"{text}\n\n{section}" if text else section, limit)


def _rewrite_last(
    tokens: list[int], encoding: HarmonyEncoding, rewrite: Callable[[str], str], limit: int | None = None
) -> list[int]:
    """The last message's text rewritten and encoded again (in linear time)."""
    start = len(tokens) - 1 - tokens[::-1].index(MESSAGE)
    text = rewrite(encoding.decode_utf8(tokens[start + 1 : -1]))
    return [*tokens[: start + 1], *encode_within(encoding, text, limit), tokens[-1]]


class _Defused:
    """The text of the system and developer messages with each line longer than ``MAX_PIECE``
    replaced by a short placeholder. openai-harmony encodes what it renders in one go, in time
    quadratic in the longest word (a 300,000-character word in the instructions or a tool's
    description takes minutes); it writes every line of that text verbatim, so the placeholders
    are put back in the rendered text, which is encoded in linear time instead."""

    def __init__(self) -> None:
        self.lines: dict[str, str] = {}
        self._nonce = uuid.uuid4().hex[:12]

    def text(self, text: str) -> str:
        if len(text) <= MAX_PIECE:
            return text
        return "\n".join(self._line(line) for line in text.split("\n"))

    def _line(self, line: str) -> str:
        if len(line) <= MAX_PIECE:
            return line
        key = f"chorus{self._nonce}x{len(self.lines)}"
        self.lines[key] = line
        return key

    def value(self, value: Any) -> Any:
        """A JSON schema's keys and strings (property names, descriptions, enum values)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.value(v) for v in value]
        if isinstance(value, dict):
            return {self.text(k): self.value(v) for k, v in value.items()}
        return value

    def tool(self, tool: FunctionTool) -> FunctionTool:
        return tool.model_copy(
            update={
                "description": tool.description and self.text(tool.description),
                "parameters": self.value(tool.parameters),
            }
        )

    def request(self, req: EncodeRequest) -> EncodeRequest:
        items = [
            item.model_copy(update={"content": self.text(item.content)})
            if isinstance(item, MessageItem) and item.role in ("system", "developer")
            else item.model_copy(update={"summary": self.text(item.summary)})
            if isinstance(item, CompactionItem)
            else item
            for item in req.items
        ]
        return req.model_copy(
            update={
                "instructions": req.instructions and self.text(req.instructions),
                "items": items,
                "tools": [self.tool(t) for t in req.tools] if req.tool_choice != "none" else req.tools,
                "namespaces": [
                    ns.model_copy(
                        update={
                            "description": ns.description and self.text(ns.description),
                            "tools": [self.tool(t) for t in ns.tools],
                        }
                    )
                    for ns in req.namespaces
                ]
                if req.tool_choice != "none"
                else req.namespaces,
            }
        )

    def restore(self, text: str) -> str:
        for key, line in self.lines.items():
            text = text.replace(key, line)
        return text


def _recipient(namespace: str, name: str) -> str:
    if namespace == name or not name:  # e.g. the python built-in
        return namespace
    return f"{namespace}.{name}"


def _call(recipient: str) -> Frame:
    return Frame(Role.ASSISTANT, channel="commentary", recipient=recipient, content_type=JSON_CONTENT_TYPE)


def _tool_output(tool: str) -> Frame:
    return Frame(Role.TOOL, channel="commentary", recipient="assistant", tool=tool)


def is_final(item: ConversationItem) -> bool:
    """An assistant's final answer: what drops the reasoning before it (``kept``)."""
    return isinstance(item, MessageItem) and item.role == "assistant" and item.channel in (None, "final")


def kept(items: list[ConversationItem]) -> list[ConversationItem]:
    """Harmony drops chain-of-thought from turns that ended in a final answer: reasoning before
    the last assistant final-channel message is dropped; the current turn's is kept."""
    last_final = -1
    for i, item in enumerate(items):
        if is_final(item):
            last_final = i
    return [item for i, item in enumerate(items) if not (isinstance(item, ReasoningItem) and i < last_final)]


def prefix_messages(req: EncodeRequest, today: dt.date, knowledge_cutoff: str) -> list[Message]:
    """The system message and the developer message (instructions, tools), if any."""
    messages = [system_message(req, today, knowledge_cutoff)]
    developer = developer_message(req)
    if developer is not None:
        messages.append(developer)
    return messages


def prefix_tokens(
    req: EncodeRequest, encoding: HarmonyEncoding, today: dt.date, knowledge_cutoff: str, limit: int | None = None
) -> list[int]:
    """The system and developer messages as token ids, response formats included, in time
    linear in their text (see ``_Defused``)."""
    defused = _Defused()
    messages = prefix_messages(defused.request(req), today, knowledge_cutoff)
    tokens = list(encoding.render_conversation(Conversation.from_messages(messages)))
    if defused.lines:
        tokens = _rewrite_last(tokens, encoding, defused.restore, limit)
    if req.response_format is not None:
        tokens = with_response_formats(tokens, encoding, req.response_format, limit)
    return tokens


def body_messages(req: EncodeRequest) -> list[tuple[Frame, str]]:
    """The conversation after the developer message: each message's frame, and its content text
    (rendered separately, in linear time)."""
    return messages_of(kept(list(req.items)), {})


def messages_of(items: list[ConversationItem], recipients: dict[str, str]) -> list[tuple[Frame, str]]:
    """``items`` as messages; ``recipients`` maps the calls met so far to the tool each called
    (a tool's output is written by it), and learns the calls among ``items``."""
    messages: list[tuple[Frame, str]] = []
    for item in items:
        if isinstance(item, MessageItem):
            if item.role == "user":
                messages.append((USER, item.content))
            elif item.role == "assistant":
                messages.append((Frame(Role.ASSISTANT, channel=item.channel or "final"), item.content))
            # system / developer items went into the developer message
        elif isinstance(item, ReasoningItem):
            if item.text:
                messages.append((Frame(Role.ASSISTANT, channel="analysis"), item.text))
        elif isinstance(item, FunctionCallItem):
            recipient = recipient_of(item)
            recipients[item.call_id] = recipient
            messages.append((_call(recipient), item.arguments or "{}"))
        elif isinstance(item, FunctionCallOutputItem):
            author = recipients.get(item.call_id)
            if author is None:
                raise invalid(f"No tool call found for function call output with call_id '{item.call_id}'.", "input")
            messages.append((_tool_output(author), item.output))
        elif isinstance(item, McpCallItem):
            recipient = _recipient(item.server_label, item.name)
            messages.append((_call(recipient), item.arguments or "{}"))
            result = item.output if item.error is None else f"Error: {item.error}"
            if result is not None:
                messages.append((_tool_output(recipient), result))
        # mcp_list_tools and approval items are bookkeeping, not prompt text
    return messages


def recipient_of(call: FunctionCallItem) -> str:
    return _recipient(call.namespace, call.name)


def selection_text(items: Iterable[ConversationItem]) -> str:
    last = ""
    for item in items:
        if isinstance(item, MessageItem) and item.role == "user":
            last = item.content
    return last
