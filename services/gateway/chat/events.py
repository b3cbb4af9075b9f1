"""Parser events -> Chat Completions chunks: the state of one choice (``ChatState``) and the
SSE chunks its deltas become (``ChunkWriter``); the whole answer is built in ``response.py``.

Reasoning goes out under BOTH ``reasoning_content`` (SGLang, DeepSeek clients) and
``reasoning`` (vLLM, OpenRouter clients), so either kind of client works unchanged."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from contracts.messages.items import FunctionCallItem, MessageItem, ReasoningItem
from contracts.messages.parse import Failed, Finished, ItemAdded, ItemDelta, ItemDone, ParseEvent, Usage

Delta = dict[str, Any]


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
    def aborted(self) -> bool:
        """The engine stopped the generation before its end (Chat has no finish reason for it:
        the run fails, so a cut-off answer never looks complete)."""
        return self.finished is not None and self.finished.finish_reason == "abort"

    @property
    def finish_reason(self) -> str:
        if self.finished is None:
            return "stop"
        reason = self.finished.finish_reason
        if self.tools and reason == "stop":
            return "tool_calls"
        return reason

    @property
    def text(self) -> str:
        return "".join(self.content)


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


class ChunkWriter:
    """SSE chunks of one streamed completion: the envelope is serialised once, each delta is
    spliced into it (a chunk per parser batch is on every token's path). Every chunk is a
    valid ChatCompletionChunk (a test checks). With ``include_usage`` every chunk but the last
    carries ``"usage": null``, as OpenAI's do."""

    def __init__(self, base: dict[str, Any], *, include_usage: bool = False) -> None:
        head = orjson.dumps({**base, "choices": [{"index": 0, "delta": None}]})
        self._head = b"data: " + head[: head.rindex(b"null")]
        self._end = b'}],"usage":null}\n\n' if include_usage else b"}]}\n\n"
        self._tail = b',"logprobs":null,"finish_reason":null' + self._end
        self.base = base
        self.include_usage = include_usage

    def delta(self, delta: dict[str, Any]) -> bytes:
        return self._head + orjson.dumps(delta) + self._tail

    def finish(self, finish_reason: str) -> bytes:
        return self._head + b'{},"logprobs":null,"finish_reason":' + orjson.dumps(finish_reason) + self._end

    def usage(self, state: ChatState) -> bytes:
        usage = usage_json(state.finished.usage if state.finished else None)
        return b"data: " + orjson.dumps({**self.base, "choices": [], "usage": usage}) + b"\n\n"
