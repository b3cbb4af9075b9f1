"""A Responses run's output as typed stream events (openai.types.responses), with the
bookkeeping clients depend on: a strictly increasing ``sequence_number``, one ``output_index``
per item across every model turn, ``content_index`` from 0 in each item, every ``.added``
matched by its ``.done``, ``item_id`` on every delta.

``EventWriter`` turns parser events and items Chorus makes itself into stream events and
records them in the run's ``Output``; how an item is shown is ``ItemView``'s business (both in
output.py)."""

from __future__ import annotations

import functools
import typing
from typing import Any, TypeVar

from openai.types.responses import (
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseMcpCallArgumentsDeltaEvent,
    ResponseMcpCallArgumentsDoneEvent,
    ResponseMcpCallCompletedEvent,
    ResponseMcpCallFailedEvent,
    ResponseMcpCallInProgressEvent,
    ResponseMcpListToolsCompletedEvent,
    ResponseMcpListToolsFailedEvent,
    ResponseMcpListToolsInProgressEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputText,
    ResponseReasoningSummaryPartAddedEvent,
    ResponseReasoningSummaryPartDoneEvent,
    ResponseReasoningSummaryTextDeltaEvent,
    ResponseReasoningSummaryTextDoneEvent,
    ResponseReasoningTextDeltaEvent,
    ResponseReasoningTextDoneEvent,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
    ResponseWebSearchCallCompletedEvent,
    ResponseWebSearchCallInProgressEvent,
    ResponseWebSearchCallSearchingEvent,
)
from openai.types.responses.response_content_part_added_event import PartReasoningText as AddedReasoningText
from openai.types.responses.response_content_part_done_event import PartReasoningText as DoneReasoningText
from openai.types.responses.response_reasoning_summary_part_added_event import Part as AddedSummary
from openai.types.responses.response_reasoning_summary_part_done_event import Part as DoneSummary
from pydantic import BaseModel

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
from services.gateway.responses.output import ItemView, Open, Output

Event = ResponseStreamEvent
E = TypeVar("E", bound=BaseModel)
BUILTIN_NAMESPACES = ("browser", "python", "container")


@functools.cache
def event_type(kind: type[BaseModel]) -> str:
    """An event class's ``type``: the one value its Literal allows."""
    (value,) = typing.get_args(kind.model_fields["type"].annotation)
    return str(value)


class EventWriter:
    def __init__(self, output: Output, view: ItemView) -> None:
        self.out = output
        self.view = view
        # what the tool loop must still do with this turn's calls, by output index
        self.called_mcp: list[tuple[int, McpCallItem]] = []
        self.called_builtin: list[tuple[int, FunctionCallItem]] = []
        self.searching: dict[int, FunctionCallItem] = {}  # web_search_call items not yet run

    def seq(self) -> int:
        n = self.out.seq
        self.out.seq += 1
        return n

    def _event(self, kind: type[E], item_id: str, index: int, **fields: Any) -> E:
        """An event about one item: its type, the next sequence number, the item's id and index."""
        return kind(type=event_type(kind), sequence_number=self.seq(), item_id=item_id, output_index=index, **fields)

    # parser events ----------------------------------------------------------------------
    def handle(self, event: ParseEvent) -> list[Event]:
        if isinstance(event, ItemAdded):
            return self._added(event.output_index, self.view.show(event.item))
        if isinstance(event, ItemDelta):
            return self._delta(event.output_index, event.delta)
        if isinstance(event, ItemDone):
            raw = event.item
            if isinstance(raw, FunctionCallItem) and raw.namespace in BUILTIN_NAMESPACES:
                self.called_builtin.append((self.out.offset + event.output_index, raw))
            return self._done(event.output_index, self.view.show(raw))
        return []

    def _added(self, local: int, item: ConversationItem) -> list[Event]:
        out_state = self.out
        out_state.turn_max = max(out_state.turn_max, local)
        index = out_state.offset + local
        out_state.open[index] = Open(item)
        item_id = getattr(item, "id", None) or ""
        out: list[Event] = [
            ResponseOutputItemAddedEvent(
                type="response.output_item.added",
                sequence_number=self.seq(),
                output_index=index,
                item=self.view.json(item, streaming_start=True),
            )
        ]
        if isinstance(item, McpCallItem):
            out.append(self._event(ResponseMcpCallInProgressEvent, item_id, index))
        elif isinstance(item, FunctionCallItem) and item.namespace == "browser":
            out.append(self._event(ResponseWebSearchCallInProgressEvent, item_id, index))
        elif isinstance(item, McpListToolsItem):
            out.append(self._event(ResponseMcpListToolsInProgressEvent, item_id, index))
        elif isinstance(item, ReasoningItem):
            out.append(
                self._event(
                    ResponseContentPartAddedEvent,
                    item_id,
                    index,
                    content_index=0,
                    part=AddedReasoningText(type="reasoning_text", text=""),
                )
            )
            if self.view.summary:
                out.append(
                    self._event(
                        ResponseReasoningSummaryPartAddedEvent,
                        item_id,
                        index,
                        summary_index=0,
                        part=AddedSummary(type="summary_text", text=""),
                    )
                )
        elif isinstance(item, MessageItem):
            out.append(
                self._event(
                    ResponseContentPartAddedEvent,
                    item_id,
                    index,
                    content_index=0,
                    part=ResponseOutputText(type="output_text", text="", annotations=[], logprobs=[]),
                )
            )
        return out

    def _delta(self, local: int, delta: str) -> list[Event]:
        index = self.out.offset + local
        open_ = self.out.open.get(index)
        if open_ is None or not delta:
            return []
        open_.texts.append(delta)
        item = open_.item
        item_id = getattr(item, "id", None) or ""
        if isinstance(item, ReasoningItem):
            out: list[Event] = [
                self._event(ResponseReasoningTextDeltaEvent, item_id, index, content_index=0, delta=delta)
            ]
            if self.view.summary:
                out.append(
                    self._event(ResponseReasoningSummaryTextDeltaEvent, item_id, index, summary_index=0, delta=delta)
                )
            return out
        if isinstance(item, MessageItem):
            return [self._event(ResponseTextDeltaEvent, item_id, index, content_index=0, delta=delta, logprobs=[])]
        if isinstance(item, FunctionCallItem) and item.namespace != "browser":
            return [self._event(ResponseFunctionCallArgumentsDeltaEvent, item_id, index, delta=delta)]
        if isinstance(item, McpCallItem):
            return [self._event(ResponseMcpCallArgumentsDeltaEvent, item_id, index, delta=delta)]
        return []

    def _done(self, local: int, item: ConversationItem) -> list[Event]:
        index = self.out.offset + local
        out: list[Event] = []
        if index not in self.out.open:
            out += self._added(local, item)
        self.out.open.pop(index, None)
        item_id = getattr(item, "id", None) or ""
        if isinstance(item, ReasoningItem):
            out.append(self._event(ResponseReasoningTextDoneEvent, item_id, index, content_index=0, text=item.text))
            out.append(
                self._event(
                    ResponseContentPartDoneEvent,
                    item_id,
                    index,
                    content_index=0,
                    part=DoneReasoningText(type="reasoning_text", text=item.text),
                )
            )
            if self.view.summary:
                out.append(
                    self._event(ResponseReasoningSummaryTextDoneEvent, item_id, index, summary_index=0, text=item.text)
                )
                out.append(
                    self._event(
                        ResponseReasoningSummaryPartDoneEvent,
                        item_id,
                        index,
                        summary_index=0,
                        part=DoneSummary(type="summary_text", text=item.text),
                    )
                )
        elif isinstance(item, MessageItem):
            out.append(
                self._event(ResponseTextDoneEvent, item_id, index, content_index=0, text=item.content, logprobs=[])
            )
            out.append(
                self._event(
                    ResponseContentPartDoneEvent,
                    item_id,
                    index,
                    content_index=0,
                    part=ResponseOutputText(type="output_text", text=item.content, annotations=[], logprobs=[]),
                )
            )
        elif isinstance(item, FunctionCallItem) and item.namespace != "browser":
            out.append(
                ResponseFunctionCallArgumentsDoneEvent.model_validate(
                    {
                        "type": "response.function_call_arguments.done",
                        "sequence_number": self.seq(),
                        "item_id": item_id,
                        "output_index": index,
                        "arguments": item.arguments,
                        "name": item.name,
                    }
                )
            )  # ``name`` as OpenAI sends it (not in openai-python's type)
        elif isinstance(item, FunctionCallItem) and item.status != "incomplete":  # browser
            # the search runs next (when a browser is configured); it is done after that
            out.append(self._event(ResponseWebSearchCallSearchingEvent, item_id, index))
            self.searching[index] = item
            return out
        elif isinstance(item, McpCallItem) and item.output is None and item.error is None:
            # the model has called it; it runs next, and its output_item.done comes after that
            out.append(self._event(ResponseMcpCallArgumentsDoneEvent, item_id, index, arguments=item.arguments))
            self.called_mcp.append((index, item))
            return out
        elif isinstance(item, McpCallItem):
            out.append(self._mcp_outcome(index, item))
        elif isinstance(item, McpListToolsItem):
            out.append(
                self._event(ResponseMcpListToolsFailedEvent, item_id, index)
                if item.error
                else self._event(ResponseMcpListToolsCompletedEvent, item_id, index)
            )
        out.append(self._item_done(index, item))
        return out

    def _item_done(self, index: int, item: ConversationItem, *, failed: bool = False) -> Event:
        self.out.done[index] = item
        shown = self.view.json(item)
        if failed and hasattr(shown, "status"):
            shown = shown.model_copy(update={"status": "failed"})
        return ResponseOutputItemDoneEvent(
            type="response.output_item.done", sequence_number=self.seq(), output_index=index, item=shown
        )

    def _mcp_outcome(self, index: int, item: McpCallItem) -> Event:
        if item.error:
            return self._event(ResponseMcpCallFailedEvent, item.id, index)
        return self._event(ResponseMcpCallCompletedEvent, item.id, index)

    # items Chorus completes or makes itself ----------------------------------------------
    def complete_mcp(self, index: int, item: McpCallItem) -> list[Event]:
        """A called MCP tool has run: its completion, then the item with its output."""
        return [self._mcp_outcome(index, item), self._item_done(index, item)]

    def complete_search(self, index: int, ok: bool) -> list[Event]:
        """A web search call has run (or never will): completed, then its output_item.done."""
        item = self.searching.pop(index, None)
        if item is None:
            return []
        out: list[Event] = []
        if ok:
            out.append(self._event(ResponseWebSearchCallCompletedEvent, item.id or "", index))
        out.append(self._item_done(index, item, failed=not ok))
        return out

    def add_item(self, item: ConversationItem) -> list[Event]:
        """An item produced by Chorus itself (an MCP call, a tool listing): added + done."""
        local = self.out.next_index - self.out.offset
        return self._added(local, item) + self._done(local, item)

    def close_open(self) -> list[Event]:
        """Items still open when a turn ends abruptly are closed as incomplete."""
        out: list[Event] = []
        for index, open_ in sorted(self.out.open.items()):
            text = "".join(open_.texts)
            item = open_.item
            done: ConversationItem
            if isinstance(item, ReasoningItem):
                done = item.model_copy(update={"text": text, "status": "incomplete"})
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
            out += self._done(index - self.out.offset, done)
        return out

    def renumber(self, events: list[Event]) -> list[Event]:
        """Events built out of order get consecutive sequence numbers, in list order."""
        start = min(e.sequence_number for e in events)
        return [e.model_copy(update={"sequence_number": start + i}) for i, e in enumerate(events)]
