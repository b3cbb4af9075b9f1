"""Rendering Harmony prompts for tests, as the encoder would."""

from __future__ import annotations

from typing import Any

from openai_harmony import Author, Conversation, DeveloperContent, Message, Role, SystemContent, ToolDescription

from services.common.harmony import harmony_encoding

WEATHER = ToolDescription.new(
    "get_weather",
    "Current weather for a city",
    parameters={
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["c", "f"]},
            "days": {"type": "integer"},
            "detailed": {"type": "boolean"},
        },
        "required": ["city"],
    },
)
LOOKUP = ToolDescription.new(
    "lookup", "Look something up", parameters={"type": "object", "properties": {"query": {"type": "string"}}}
)


def render(*messages: Message, tools: list[ToolDescription] | None = None) -> list[int]:
    head = [Message.from_role_and_content(Role.SYSTEM, SystemContent.new())]
    if tools:
        dev = DeveloperContent.new().with_instructions("Be helpful.").with_function_tools(tools)
        head.append(Message.from_role_and_content(Role.DEVELOPER, dev))
    conv = Conversation.from_messages([*head, *messages])
    return list(harmony_encoding().render_conversation_for_completion(conv, Role.ASSISTANT))


def user(text: str) -> Message:
    return Message.from_role_and_content(Role.USER, text)


def user_prompt(text: str, tools: list[ToolDescription] | None = None) -> list[int]:
    return render(user(text), tools=tools)


def tool_round(user_text: str, args: str, output: str, name: str = "get_weather") -> list[int]:
    """A prompt whose last message is the result of a function call."""
    return render(
        user(user_text),
        Message.from_role_and_content(Role.ASSISTANT, args)
        .with_channel("commentary")
        .with_recipient(f"functions.{name}")
        .with_content_type("<|constrain|>json"),
        Message.from_author_and_content(Author.new(Role.TOOL, f"functions.{name}"), output)
        .with_channel("commentary")
        .with_recipient("assistant"),
        tools=[WEATHER, LOOKUP],
    )


def parse_output(ids: list[int]) -> list[dict[str, Any]]:
    """The completion parsed by openai-harmony itself: proof it is valid Harmony."""
    msgs = harmony_encoding().parse_messages_from_completion_tokens(ids, Role.ASSISTANT)
    return [m.to_dict() for m in msgs]
