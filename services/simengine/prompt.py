"""Reading a rendered Harmony prompt back (SIMULATOR support code, not a model).

The stand-in engine only sees prompt token ids, like a real engine. To say something
plausible it decodes them and recovers the messages and the declared tools: enough structure
to answer the last message, nothing more. Pure functions, no I/O."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.common.harmony import CALL, END, MESSAGE, RETURN, START

_END_IDS = frozenset({END, CALL, RETURN, START})
_NAMESPACE = re.compile(r"namespace (\w+) \{\n(.*?)\n\} // namespace \1", re.DOTALL)
_TOOL_HEAD = re.compile(r"^type (\w+) = \((?:_: \{)?", re.MULTILINE)
_PROP = re.compile(r"^(\w+)(\?)?: (.+?),?$")
_DIRECTIVE = re.compile(r"\[\[sim:(\w+)=(.*?)\]\]", re.DOTALL)
# the developer message's last section: "# Response Formats\n\n## name\n\n// ...\n{schema}"
_RESPONSE_FORMAT = re.compile(r"(?:^|\n\n)# Response Formats\n\n## [^\n]*\n\n(?:(?://[^\n]*)\n)*(\{.*\})\Z", re.DOTALL)


@dataclass(frozen=True)
class PromptMessage:
    author: str  # user | assistant | system | developer | functions.NAME | ...
    content: str
    channel: str | None = None
    recipient: str | None = None


@dataclass(frozen=True)
class ToolProp:
    name: str
    type: str  # the TypeScript-like type as rendered, e.g. `string`, `"c" | "f"`, `number`
    optional: bool


@dataclass(frozen=True)
class ToolSignature:
    namespace: str
    name: str
    props: tuple[ToolProp, ...] = field(default_factory=tuple)

    @property
    def recipient(self) -> str:
        return f"{self.namespace}.{self.name}"


def parse_prompt(ids: Sequence[int], decode: Callable[[list[int]], str]) -> list[PromptMessage]:
    """The complete messages of a prompt, split on the special token ids (text that merely
    looks like ``<|start|>`` inside a message is ordinary text there). The trailing
    ``<|start|>assistant`` (the generation prompt) has no ``<|message|>`` and is left out."""
    messages: list[PromptMessage] = []
    i, n = 0, len(ids)
    while i < n:
        if ids[i] != START:
            i += 1
            continue
        j = i + 1
        while j < n and ids[j] not in (MESSAGE, START):
            j += 1
        if j >= n or ids[j] == START:
            i = j
            continue
        k = j + 1
        while k < n and ids[k] not in _END_IDS:
            k += 1
        messages.append(_message(decode(list(ids[i + 1 : j])), decode(list(ids[j + 1 : k]))))
        i = k
    return messages


def _message(header: str, content: str) -> PromptMessage:
    role_part, _, channel_part = header.partition("<|channel|>")
    role_words = role_part.split()
    channel_words = channel_part.replace("<|constrain|>", " ").split()
    recipient = next((w[3:] for w in (*role_words, *channel_words) if w.startswith("to=")), None)
    return PromptMessage(
        author=role_words[0] if role_words else "",
        content=content,
        channel=channel_words[0] if channel_words else None,
        recipient=recipient,
    )


def parse_tools(text: str) -> list[ToolSignature]:
    """Tools declared as TypeScript-like namespaces (``namespace functions { type f = ... }``)
    in a system or developer message, in declaration order."""
    tools: list[ToolSignature] = []
    for ns in _NAMESPACE.finditer(text):
        body = ns.group(2)
        heads = list(_TOOL_HEAD.finditer(body))
        for i, head in enumerate(heads):
            end = heads[i + 1].start() if i + 1 < len(heads) else len(body)
            props = _top_level_props(body[head.end() : end]) if head.group(0).endswith("{") else ()
            tools.append(ToolSignature(ns.group(1), head.group(1), props))
    return tools


def _top_level_props(block: str) -> tuple[ToolProp, ...]:
    props: list[ToolProp] = []
    depth = 0
    for raw in block.splitlines():
        line = raw.strip()
        if not line or line.startswith("//"):
            continue
        if depth == 0 and (m := _PROP.match(line)):
            props.append(ToolProp(m.group(1), m.group(3).strip(), bool(m.group(2))))
        depth += line.count("{") + line.count("[") - line.count("}") - line.count("]")
        if depth < 0:  # the `}) => any;` closing the parameter object
            break
    return tuple(props)


def parse_response_format(text: str) -> dict[str, Any] | None:
    """The JSON schema of a "# Response Formats" section ending a developer message, if any."""
    m = _RESPONSE_FORMAT.search(text)
    if m is None:
        return None
    try:
        schema = json.loads(m.group(1))
    except ValueError:
        return None
    return schema if isinstance(schema, dict) else None


def directives(text: str) -> dict[str, str]:
    """``[[sim:key=value]]`` directives in a user's text (the last one of a key wins)."""
    return {m.group(1): m.group(2) for m in _DIRECTIVE.finditer(text)}


def strip_directives(text: str) -> str:
    return " ".join(_DIRECTIVE.sub(" ", text).split())
