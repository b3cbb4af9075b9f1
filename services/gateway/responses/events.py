"""Parser events -> Responses API stream events, with the bookkeeping clients depend on:
a strictly increasing ``sequence_number``, one ``output_index`` per item across every model
turn of the response, ``content_index`` from 0 in each item, every ``.added`` matched by its
``.done`` and ``item_id`` on every delta."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from contracts.messages.items import ConversationItem, FunctionCallItem, MessageItem, ReasoningItem
from contracts.messages.parse import ItemAdded, ItemDelta, ItemDone, ParseEvent
from services.gateway.responses.convert import as_reasoning, is_builtin_reasoning, output_json

Event = dict[str, Any]


@dataclass
class EventWriter:
    seq: int = 0
    offset: int = 0  # output_index of this turn's first item
    output: list[ConversationItem] = field(default_factory=list)  # finished items, in order
    _open: dict[int, ConversationItem] = field(default_factory=dict)  # output_index -> started item
    _texts: dict[int, list[str]] = field(default_factory=dict)
    _turn_max: int = -1

    def event(self, kind: str, **fields: Any) -> Event:
        ev = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return ev

    def next_turn(self) -> None:
        self.offset += self._turn_max + 1
        self._turn_max = -1

    @property
    def next_index(self) -> int:
        return self.offset + self._turn_max + 1

    def handle(self, event: ParseEvent) -> list[Event]:
        if isinstance(event, ItemAdded):
            return self._added(event.output_index, _shown(event.item))
        if isinstance(event, ItemDelta):
            return self._delta(event.output_index, event.delta)
        if isinstance(event, ItemDone):
            return self._done(event.output_index, _shown(event.item))
        return []

    def _added(self, local: int, item: ConversationItem) -> list[Event]:
        self._turn_max = max(self._turn_max, local)
        index = self.offset + local
        self._open[index] = item
        self._texts[index] = []
        out = [self.event("response.output_item.added", output_index=index,
                          item=output_json(item, streaming_start=True))]
        if isinstance(item, ReasoningItem):
            out.append(self.event("response.content_part.added", item_id=item.id, output_index=index,
                                  content_index=0, part={"type": "reasoning_text", "text": ""}))
        elif isinstance(item, MessageItem):
            out.append(self.event("response.content_part.added", item_id=item.id, output_index=index,
                                  content_index=0, part={"type": "output_text", "text": "", "annotations": [],
                                                         "logprobs": []}))
        return out

    def _delta(self, local: int, delta: str) -> list[Event]:
        index = self.offset + local
        item = self._open.get(index)
        if item is None or not delta:
            return []
        self._texts[index].append(delta)
        if isinstance(item, ReasoningItem):
            return [self.event("response.reasoning_text.delta", item_id=item.id, output_index=index,
                               content_index=0, delta=delta)]
        if isinstance(item, MessageItem):
            return [self.event("response.output_text.delta", item_id=item.id, output_index=index,
                               content_index=0, delta=delta, logprobs=[])]
        if isinstance(item, FunctionCallItem) and item.namespace != "browser":
            return [self.event("response.function_call_arguments.delta", item_id=item.id,
                               output_index=index, delta=delta)]
        return []

    def _done(self, local: int, item: ConversationItem) -> list[Event]:
        index = self.offset + local
        out: list[Event] = []
        if index not in self._open:
            out += self._added(local, item)
        self._open.pop(index, None)
        self._texts.pop(index, None)
        if isinstance(item, ReasoningItem):
            part = {"type": "reasoning_text", "text": item.text}
            out.append(self.event("response.reasoning_text.done", item_id=item.id, output_index=index,
                                  content_index=0, text=item.text))
            out.append(self.event("response.content_part.done", item_id=item.id, output_index=index,
                                  content_index=0, part=part))
        elif isinstance(item, MessageItem):
            part = {"type": "output_text", "text": item.content, "annotations": [], "logprobs": []}
            out.append(self.event("response.output_text.done", item_id=item.id, output_index=index,
                                  content_index=0, text=item.content, logprobs=[]))
            out.append(self.event("response.content_part.done", item_id=item.id, output_index=index,
                                  content_index=0, part=part))
        elif isinstance(item, FunctionCallItem) and item.namespace != "browser":
            out.append(self.event("response.function_call_arguments.done", item_id=item.id,
                                  output_index=index, arguments=item.arguments, name=output_json(item)["name"]))
        out.append(self.event("response.output_item.done", output_index=index, item=output_json(item)))
        self.output.append(item)
        return out

    def close_open(self) -> list[Event]:
        """Items still open when a turn ends abruptly are closed as incomplete."""
        out: list[Event] = []
        for index, item in sorted(self._open.items()):
            text = "".join(self._texts.get(index, []))
            if isinstance(item, ReasoningItem):
                done: ConversationItem = item.model_copy(update={"text": text, "status": "incomplete"})
            elif isinstance(item, MessageItem):
                done = item.model_copy(update={"content": text, "status": "incomplete"})
            elif isinstance(item, FunctionCallItem):
                done = item.model_copy(update={"arguments": text, "status": "incomplete"})
            else:
                continue
            out += self._done(index - self.offset, done)
        return out

    def add_item(self, item: ConversationItem) -> list[Event]:
        """An item produced by Chorus itself (an MCP call, a tool listing): added + done."""
        local = self.next_index - self.offset
        return self._added(local, item) + self._done(local, item)


def _shown(item: ConversationItem) -> ConversationItem:
    return as_reasoning(item) if is_builtin_reasoning(item) else item  # type: ignore[arg-type]
