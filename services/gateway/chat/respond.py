"""Parser events -> Chat Completions: the streamed chunk deltas and the final message.

Reasoning goes out under BOTH ``reasoning_content`` (SGLang, DeepSeek clients) and
``reasoning`` (vLLM, OpenRouter clients), so either kind of client works unchanged."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from openai.types.chat import ChatCompletion

from contracts.messages.items import FunctionCallItem, MessageItem, ReasoningItem
from contracts.messages.parse import Failed, Finished, ItemAdded, ItemDelta, ItemDone, ParseEvent, Usage

Delta = dict[str, Any]


@dataclass
class _ToolCall:
    index: int
    call_id: str
    name: str
    arguments: str = ""


@dataclass
class ChatState:
    """Accumulates one choice; ``apply`` returns the deltas to stream for a batch of events."""

    reasoning: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    tools: list[_ToolCall] = field(default_factory=list)
    finished: Finished | None = None
    failed: Failed | None = None
    _kinds: dict[int, str] = field(default_factory=dict)  # output_index -> reasoning|content|tool
    _tool_at: dict[int, _ToolCall] = field(default_factory=dict)
    _streamed: dict[int, int] = field(default_factory=dict)  # chars already sent per item

    def apply(self, events: list[ParseEvent]) -> list[Delta]:
        deltas: list[Delta] = []
        for event in events:
            if isinstance(event, ItemAdded):
                deltas.extend(self._added(event))
            elif isinstance(event, ItemDelta):
                deltas.extend(self._text(event.output_index, event.delta))
            elif isinstance(event, ItemDone):
                deltas.extend(self._done(event))
            elif isinstance(event, Finished):
                self.finished = event
            elif isinstance(event, Failed):
                self.failed = event
        return _coalesce(deltas)

    def _added(self, event: ItemAdded) -> list[Delta]:
        item = event.item
        if isinstance(item, ReasoningItem):
            self._kinds[event.output_index] = "reasoning"
        elif isinstance(item, MessageItem):
            self._kinds[event.output_index] = "content"
        elif isinstance(item, FunctionCallItem):
            name = item.name if item.namespace == "functions" else f"{item.namespace}.{item.name}"
            call = _ToolCall(index=len(self.tools), call_id=item.call_id, name=name)
            self.tools.append(call)
            self._tool_at[event.output_index] = call
            self._kinds[event.output_index] = "tool"
            return [
                {
                    "tool_calls": [
                        {
                            "index": call.index,
                            "id": call.call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": ""},
                        }
                    ]
                }
            ]
        return []

    def _text(self, index: int, text: str) -> list[Delta]:
        if not text:
            return []
        kind = self._kinds.get(index, "content")
        self._streamed[index] = self._streamed.get(index, 0) + len(text)
        if kind == "reasoning":
            self.reasoning.append(text)
            return [{"reasoning_content": text, "reasoning": text}]
        if kind == "tool":
            call = self._tool_at[index]
            call.arguments += text
            return [{"tool_calls": [{"index": call.index, "function": {"arguments": text}}]}]
        self.content.append(text)
        return [{"content": text}]

    def _done(self, event: ItemDone) -> list[Delta]:
        """Send whatever the final item holds beyond what was streamed (e.g. text the parser
        held back while deciding whether it was a misplaced tool call)."""
        deltas: list[Delta] = []
        if event.output_index not in self._kinds:
            deltas.extend(self._added(ItemAdded(output_index=event.output_index, item=event.item)))
        item = event.item
        full = (
            item.text
            if isinstance(item, ReasoningItem)
            else item.arguments
            if isinstance(item, FunctionCallItem)
            else item.content
        )
        sent = self._streamed.get(event.output_index, 0)
        if len(full) > sent:
            deltas.extend(self._text(event.output_index, full[sent:]))
        return deltas

    @property
    def finish_reason(self) -> str:
        if self.finished is None:
            return "stop"
        reason = self.finished.finish_reason
        if reason == "abort":
            return "stop"
        if self.tools and reason == "stop":
            return "tool_calls"
        return reason

    @property
    def text(self) -> str:
        return "".join(self.content)

    def completion(self, request_id: str, model: str, created: int) -> ChatCompletion:
        """The whole answer, as openai-python's ChatCompletion (reasoning under both of the
        names clients read)."""
        return ChatCompletion.model_validate(
            {
                "id": request_id,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "system_fingerprint": None,
                "choices": [
                    {"index": 0, "message": self.message(), "logprobs": None, "finish_reason": self.finish_reason}
                ],
                "usage": usage_json(self.finished.usage if self.finished else None),
            }
        )

    def message(self) -> dict[str, Any]:
        reasoning = "".join(self.reasoning) or None
        msg: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self.content) if (self.content or not self.tools) else None,
            "refusal": None,
            "annotations": [],
            "reasoning_content": reasoning,
            "reasoning": reasoning,
        }
        if self.tools:
            msg["tool_calls"] = [
                {"id": t.call_id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
                for t in self.tools
            ]
        return msg


def _coalesce(deltas: list[Delta]) -> list[Delta]:
    """Merge neighbouring text deltas of the same field: one SSE chunk per engine batch."""
    out: list[Delta] = []
    for d in deltas:
        prev = out[-1] if out else None
        if prev is not None and prev.keys() == d.keys():
            if "content" in d:
                prev["content"] += d["content"]
                continue
            if "reasoning" in d:
                prev["reasoning"] += d["reasoning"]
                prev["reasoning_content"] += d["reasoning_content"]
                continue
            if "tool_calls" in d:
                p, n = prev["tool_calls"][0], d["tool_calls"][0]
                if p["index"] == n["index"] and "id" not in p and "id" not in n:
                    p["function"]["arguments"] += n["function"]["arguments"]
                    continue
        out.append(d)
    return out


def usage_json(usage: Usage | None) -> dict[str, Any]:
    u = usage or Usage()
    out: dict[str, Any] = {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
    }
    if u.cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": u.cached_tokens}
    return out
