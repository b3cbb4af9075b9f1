"""Parser events -> Responses API stream events, with the bookkeeping clients depend on:
a strictly increasing ``sequence_number``, one ``output_index`` per item across every model
turn of the response, ``content_index`` from 0 in each item, every ``.added`` matched by its
``.done`` and ``item_id`` on every delta."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contracts.messages.items import (
    ConversationItem,
    FunctionCallItem,
    McpApprovalRequestItem,
    McpCallItem,
    McpListToolsItem,
    MessageItem,
    ReasoningItem,
)
from contracts.messages.parse import ItemAdded, ItemDelta, ItemDone, ParseEvent
from services.gateway.responses.convert import as_reasoning, is_builtin_reasoning, output_json

Event = dict[str, Any]


@dataclass
class EventWriter:
    seq: int = 0
    offset: int = 0  # output_index of this turn's first item
    mcp_labels: frozenset[str] = frozenset()
    needs_approval: Callable[[str, str], bool] = lambda label, name: False
    pending_mcp: list[tuple[int, McpCallItem]] = field(default_factory=list)  # called, not yet run
    # gpt-oss built-in calls (browser.*, python) as the model wrote them, by output_index
    builtin_calls: list[tuple[int, FunctionCallItem]] = field(default_factory=list)
    pending_search: dict[int, FunctionCallItem] = field(default_factory=dict)  # web_search_call not yet run
    _finished: dict[int, ConversationItem] = field(default_factory=dict)  # output_index -> done item
    _open: dict[int, ConversationItem] = field(default_factory=dict)  # output_index -> started item
    _texts: dict[int, list[str]] = field(default_factory=dict)
    _turn_max: int = -1

    @property
    def output(self) -> list[ConversationItem]:
        """Finished items in output_index order."""
        return [self._finished[i] for i in sorted(self._finished)]

    def turn_items(self) -> list[ConversationItem]:
        """Finished items of the current model turn."""
        return [self._finished[i] for i in sorted(self._finished) if i >= self.offset]

    def _shown(self, item: ConversationItem) -> ConversationItem:
        """How a parsed item is shown: python/container calls as reasoning (as vLLM does), calls
        into an MCP server's namespace as mcp_call (or mcp_approval_request)."""
        if isinstance(item, FunctionCallItem):
            if item.namespace in self.mcp_labels:
                suffix = (item.id or "").split("_", 1)[-1]
                if self.needs_approval(item.namespace, item.name):
                    return McpApprovalRequestItem(id=f"mcpr_{suffix}", server_label=item.namespace,
                                                  name=item.name, arguments=item.arguments)
                return McpCallItem(id=f"mcp_{suffix}", server_label=item.namespace, name=item.name,
                                   arguments=item.arguments, status=item.status)
            if is_builtin_reasoning(item):
                return as_reasoning(item)
        return item

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
            return self._added(event.output_index, self._shown(event.item))
        if isinstance(event, ItemDelta):
            return self._delta(event.output_index, event.delta)
        if isinstance(event, ItemDone):
            raw = event.item
            if isinstance(raw, FunctionCallItem) and raw.namespace in ("browser", "python", "container"):
                self.builtin_calls.append((self.offset + event.output_index, raw))
            return self._done(event.output_index, self._shown(raw))
        return []

    def _added(self, local: int, item: ConversationItem) -> list[Event]:
        self._turn_max = max(self._turn_max, local)
        index = self.offset + local
        self._open[index] = item
        self._texts[index] = []
        out = [self.event("response.output_item.added", output_index=index,
                          item=output_json(item, streaming_start=True))]
        if isinstance(item, McpCallItem):
            out.append(self.event("response.mcp_call.in_progress", item_id=item.id, output_index=index))
        elif isinstance(item, FunctionCallItem) and item.namespace == "browser":
            out.append(self.event("response.web_search_call.in_progress", item_id=item.id, output_index=index))
        elif isinstance(item, McpListToolsItem):
            out.append(self.event("response.mcp_list_tools.in_progress", item_id=item.id, output_index=index))
        elif isinstance(item, ReasoningItem):
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
        if isinstance(item, McpCallItem):
            return [self.event("response.mcp_call_arguments.delta", item_id=item.id, output_index=index,
                               delta=delta)]
        return []

    def _done(self, local: int, item: ConversationItem) -> list[Event]:
        index = self.offset + local
        out: list[Event] = []
        if index not in self._open:
            out += self._added(local, item)
        self._open.pop(index, None)
        self._texts.pop(index, None)
        part: dict[str, Any]
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
        elif isinstance(item, FunctionCallItem) and item.namespace == "browser" and item.status != "incomplete":
            # the search runs next (when a browser is configured); it is done after that
            out.append(self.event("response.web_search_call.searching", item_id=item.id, output_index=index))
            self.pending_search[index] = item
            return out
        elif isinstance(item, McpCallItem) and item.output is None and item.error is None:
            # the model has called it; it runs next, and its output_item.done comes after that
            out.append(self.event("response.mcp_call_arguments.done", item_id=item.id, output_index=index,
                                  arguments=item.arguments))
            self.pending_mcp.append((index, item))
            return out
        elif isinstance(item, McpCallItem):
            kind = "response.mcp_call.failed" if item.error else "response.mcp_call.completed"
            out.append(self.event(kind, item_id=item.id, output_index=index))
        elif isinstance(item, McpListToolsItem):
            kind = "response.mcp_list_tools.failed" if item.error else "response.mcp_list_tools.completed"
            out.append(self.event(kind, item_id=item.id, output_index=index))
        out.append(self.event("response.output_item.done", output_index=index, item=output_json(item)))
        self._finished[index] = item
        return out

    def complete_search(self, index: int, ok: bool) -> list[Event]:
        """A web search call has run (or never will): completed, then its output_item.done."""
        item = self.pending_search.pop(index, None)
        if item is None:
            return []
        done = output_json(item)
        out = []
        if ok:
            out.append(self.event("response.web_search_call.completed", item_id=item.id, output_index=index))
        else:
            done["status"] = "failed"
        out.append(self.event("response.output_item.done", output_index=index, item=done))
        self._finished[index] = item
        return out

    def indexed_output(self) -> list[tuple[int, ConversationItem]]:
        return sorted(self._finished.items())

    def complete_mcp(self, index: int, item: McpCallItem) -> list[Event]:
        """A called MCP tool has run: its completion, then the item with its output."""
        kind = "response.mcp_call.failed" if item.error else "response.mcp_call.completed"
        out = [self.event(kind, item_id=item.id, output_index=index),
               self.event("response.output_item.done", output_index=index, item=output_json(item))]
        self._finished[index] = item
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
            elif isinstance(item, McpCallItem):
                done = item.model_copy(update={"arguments": text, "error": "the call was cut off"})
            elif isinstance(item, McpApprovalRequestItem):
                done = item.model_copy(update={"arguments": text})
            else:
                continue
            out += self._done(index - self.offset, done)
        return out

    def add_item(self, item: ConversationItem) -> list[Event]:
        """An item produced by Chorus itself (an MCP call, a tool listing): added + done."""
        local = self.next_index - self.offset
        return self._added(local, item) + self._done(local, item)
