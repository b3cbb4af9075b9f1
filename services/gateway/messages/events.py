"""Parser events -> Anthropic's streamed Message: the content blocks of one answer and the SSE
events they become (``event: NAME`` / ``data: JSON``), as the Anthropic SDKs parse them. The
whole ``Message`` is built from the same state (``message_json``, at the end).

    message_start
    content_block_start / content_block_delta ... / content_block_stop    (per output item)
    message_delta (stop_reason, usage)
    message_stop

Reasoning is a ``thinking`` block: its text as ``thinking_delta``s (none when the thinking is
not shown: ``display: "omitted"``), then one ``signature_delta`` carrying the text sealed by
the server, which is what a client sends back. With thinking off (absent or ``disabled``)
reasoning is not sent at all, as Anthropic sends none. A message is a ``text`` block; a call a
``tool_use`` block whose ``input_json_delta``s stream the arguments as the parser sends them
when they open a JSON object; other arguments are held and sent at the end as
``{"_raw": text}`` (the input of a ``tool_use`` is an object). Arguments that open an object
but end invalid (the parser's repair failed: rare) reach a streaming client as they are (Claude
Code reports them to the model as a tool error) and the whole message as ``{"_raw": text}``.

``stop_sequence``: the one of ``stop_sequences`` the engine matched (vLLM's string
``stop_reason``, SGLang's ``matched``, carried to the parser's ``Finished``), with ``stop_reason``
``stop_sequence``. The engines trim only their text: the tokens that spelled it are in the
output, so the text ends with it (as vLLM's own gpt-oss serving, which parses token ids too)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from contracts.errors import BusError
from contracts.messages.items import FunctionCallItem, MessageItem, OutputItem, ReasoningItem
from contracts.messages.parse import Failed, Finished, ItemAdded, ItemDelta, ItemDone, ParseEvent, Usage
from services.gateway.errors import public
from services.gateway.messages.response import error_body, input_json, stop_reason_of, tool_input, usage_json

Seal = Callable[[str], str]
Event = tuple[str, dict[str, Any]]
PING = b'event: ping\ndata: {"type":"ping"}\n\n'


@dataclass
class Block:
    """One content block of the answer, in output order (``index`` is its place in ``content``).
    Its text (thinking, text, or a call's arguments) is kept in pieces, joined when read."""

    kind: Literal["thinking", "text", "tool_use"]
    index: int
    call_id: str = ""
    name: str = ""
    signature: str = ""  # thinking: the sealed text, once the block is done
    input: dict[str, Any] | None = None  # tool_use: the parsed arguments, once done
    streaming: bool | None = None  # tool_use: arguments streamed (an object), held, or undecided
    done: bool = False
    size: int = 0  # characters of text so far
    parts: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)  # pieces not sent yet

    @property
    def text(self) -> str:
        if len(self.parts) > 1:
            self.parts[:] = ["".join(self.parts)]
        return self.parts[0] if self.parts else ""

    def add(self, text: str) -> None:
        self.parts.append(text)
        self.pending.append(text)
        self.size += len(text)

    def take(self) -> str:
        out = "".join(self.pending)
        self.pending.clear()
        return out

    def replace(self, text: str) -> None:
        self.parts[:] = [text]
        self.size = len(text)
        self.pending.clear()


def sse(name: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def _full_text(item: OutputItem) -> str:
    if isinstance(item, ReasoningItem):
        return item.text
    if isinstance(item, FunctionCallItem):
        return item.arguments
    return item.content


class MessageStream:
    """One answer: ``start`` opens the stream, ``apply`` turns each parser batch into events,
    ``finish`` ends it (``error`` instead, when the run failed); ``response.message_json``
    builds the whole Message from the same state."""

    def __init__(
        self, model: str, message_id: str, seal: Seal, show_thinking: bool, *, keep_thinking: bool = True
    ) -> None:
        self.model, self.message_id = model, message_id
        self.seal = seal
        self.show_thinking = show_thinking and keep_thinking
        self.keep_thinking = keep_thinking
        self.blocks: list[Block] = []
        self.finished: Finished | None = None
        self.failed: Failed | None = None
        self.stop_sequence: str | None = None  # the stop sequence the engine matched, if one did
        self._at: dict[int, Block | None] = {}  # output index -> its block (None: reasoning not sent)

    # -- the stream ---------------------------------------------------------------------------
    def start(self, input_tokens: int = 0) -> bytes:
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 0},
        }
        return sse("message_start", {"type": "message_start", "message": message})

    def apply(self, events: list[ParseEvent]) -> bytes:
        out: list[Event] = []
        for event in events:
            if isinstance(event, ItemAdded):
                out += self._added(event.output_index, event.item)
            elif isinstance(event, ItemDelta):
                out += self._delta(event.output_index, event.delta)
            elif isinstance(event, ItemDone):
                out += self._done(event.output_index, event.item)
            elif isinstance(event, Finished):
                out += self._close_all()
                self.finished = event
                self.stop_sequence = event.stop_sequence
            elif isinstance(event, Failed):
                self.failed = event
        return b"".join(sse(name, payload) for name, payload in out)

    def finish(self) -> bytes:
        """``message_delta`` (why it stopped, the usage) and ``message_stop``."""
        out = self._close_all()
        out.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence},
                    "usage": usage_json(self.usage),
                },
            )
        )
        out.append(("message_stop", {"type": "message_stop"}))
        return b"".join(sse(name, payload) for name, payload in out)

    def error(self, error: BusError) -> bytes:
        """The stream's end when the run failed (a failure of the stack is cleaned for the client)."""
        shown = public(error)
        return sse("error", error_body(shown.code, shown.message))

    def ping(self) -> bytes:
        return PING

    # -- the state ----------------------------------------------------------------------------
    @property
    def usage(self) -> Usage | None:
        return self.finished.usage if self.finished else self.failed.usage if self.failed else None

    @property
    def called(self) -> bool:
        return any(b.kind == "tool_use" for b in self.blocks)

    @property
    def stop_reason(self) -> str:
        reason = self.finished.finish_reason if self.finished else None
        return stop_reason_of(reason, self.called, self.stop_sequence)

    @property
    def aborted(self) -> bool:
        """The engine stopped the generation before its end (Anthropic has no stop reason for
        it: the run fails, so a cut-off answer never looks complete)."""
        return self.finished is not None and self.finished.finish_reason == "abort"

    # -- parser events -> blocks ----------------------------------------------------------------
    def _open(self, output_index: int, block: Block, start: dict[str, Any]) -> list[Event]:
        self.blocks.append(block)
        self._at[output_index] = block
        return [("content_block_start", {"type": "content_block_start", "index": block.index, "content_block": start})]

    def _added(self, output_index: int, item: OutputItem) -> list[Event]:
        index = len(self.blocks)
        if isinstance(item, ReasoningItem):
            if not self.keep_thinking:
                self._at[output_index] = None
                return []
            start = {"type": "thinking", "thinking": "", "signature": ""}
            return self._open(output_index, Block("thinking", index), start)
        if isinstance(item, FunctionCallItem):
            name = item.name if item.namespace == "functions" else f"{item.namespace}.{item.name}"
            block = Block("tool_use", index, call_id=item.call_id, name=name)
            return self._open(output_index, block, {"type": "tool_use", "id": item.call_id, "name": name, "input": {}})
        return self._open(output_index, Block("text", index), {"type": "text", "text": ""})

    def _delta(self, output_index: int, text: str) -> list[Event]:
        out: list[Event] = []
        if output_index not in self._at:  # never announced: text, as the chat stream takes it
            out += self._added(output_index, MessageItem(role="assistant", content=""))
        block = self._at[output_index]
        if block is None or block.done or not text:
            return out
        block.add(text)
        return out + self._send(block)

    def _send(self, block: Block) -> list[Event]:
        """What of the block's text can go out now."""
        if not block.pending:
            return []
        if block.kind == "thinking":
            if not self.show_thinking:
                block.pending.clear()
                return []
            delta: dict[str, Any] = {"type": "thinking_delta", "thinking": block.take()}
        elif block.kind == "text":
            delta = {"type": "text_delta", "text": block.take()}
        else:
            if block.streaming is None:  # whitespace so far: the first character decides
                head = block.text.lstrip()
                block.streaming = head.startswith("{") if head else None
            if not block.streaming:
                if block.streaming is False:  # held: what goes out is decided at the end
                    block.pending.clear()
                return []
            delta = {"type": "input_json_delta", "partial_json": block.take()}
        return [("content_block_delta", {"type": "content_block_delta", "index": block.index, "delta": delta})]

    def _done(self, output_index: int, item: OutputItem) -> list[Event]:
        """Send whatever the final item holds beyond what was streamed (text the parser held
        back), then close the block."""
        out: list[Event] = []
        if output_index not in self._at:  # an item that only arrives done (a recovered call)
            out += self._added(output_index, item)
        block = self._at[output_index]
        if block is None or block.done:
            return out
        full = _full_text(item)
        if len(full) > block.size and full.startswith(block.text):
            out += self._delta(output_index, full[block.size :])
        elif full != block.text:  # the item's own text is authoritative
            block.replace(full)
        return out + self._close(block)

    def _close(self, block: Block) -> list[Event]:
        out: list[Event] = []
        at = block.index
        if block.kind == "thinking":
            block.signature = self.seal(block.text)
            delta = {"type": "signature_delta", "signature": block.signature}
            out.append(("content_block_delta", {"type": "content_block_delta", "index": at, "delta": delta}))
        elif block.kind == "tool_use":
            block.input = tool_input(block.text)
            if not block.streaming and block.input:
                delta = {"type": "input_json_delta", "partial_json": input_json(block.input)}
                out.append(("content_block_delta", {"type": "content_block_delta", "index": at, "delta": delta}))
        block.done = True
        out.append(("content_block_stop", {"type": "content_block_stop", "index": at}))
        return out

    def _close_all(self) -> list[Event]:
        out: list[Event] = []
        for block in self.blocks:
            if not block.done:
                out += self._close(block)
        return out


# -- the whole answer --------------------------------------------------------------------------


def block_json(block: Block, show_thinking: bool) -> dict[str, Any]:
    if block.kind == "thinking":
        return {"type": "thinking", "thinking": block.text if show_thinking else "", "signature": block.signature}
    if block.kind == "tool_use":
        value = block.input if block.input is not None else tool_input(block.text)
        return {"type": "tool_use", "id": block.call_id, "name": block.name, "input": value}
    return {"type": "text", "text": block.text}


def message_json(stream: MessageStream) -> dict[str, Any]:
    """The whole answer, its blocks in output order."""
    return {
        "id": stream.message_id,
        "type": "message",
        "role": "assistant",
        "model": stream.model,
        "content": [block_json(b, stream.show_thinking) for b in stream.blocks],
        "stop_reason": stream.stop_reason,
        "stop_sequence": stream.stop_sequence,
        "usage": usage_json(stream.usage),
    }


def message_bytes(stream: MessageStream) -> bytes:
    return orjson.dumps(message_json(stream))
