"""The output side of one request's parse: the output items its messages become, their text, and
the events that announce, extend and close them (``ItemAdded``, ``ItemDelta``, ``ItemDone``).

Items are numbered in output order, and an item's ids derive from the request id, the turn and
its output index, so a replay of the same tokens gives the same ids. An item's text goes out in
one of three ways: plain, as it comes (gathered into one ``ItemDelta`` per item per batch); as a
call's arguments, sent while they can still be valid JSON and held from where they cannot
(``arguments.ArgumentStream``); or held whole: when tools were offered, a final message is held
until its first visible character shows it is not a tool call written as JSON text, and a call
recovered from a message (``recovery.recover_tool_call``) becomes a function call item of its
own. Control text inside content is filtered out. The deltas of every item add up to its done
text exactly; every repair is counted in the session's ``recoveries``."""

from __future__ import annotations

import hashlib
from codecs import utf_8_decode
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from contracts.messages.items import FunctionCallItem, ItemStatus, MessageItem, OutputItem, ReasoningItem
from contracts.messages.parse import ItemAdded, ItemDelta, ItemDone, ParseEvent
from services.parser.arguments import ArgumentStream
from services.parser.recovery import (
    UNOFFERED,
    ControlTextFilter,
    Header,
    RecoveredCall,
    map_recipient,
    recover_tool_call,
    strip_control_text,
)


@dataclass(slots=True)
class OpenItem:
    """An output item whose message has not ended yet, with what its text still waits for."""

    index: int
    kind: str  # reasoning | message | call
    item: OutputItem
    undecoded: bytes = b""  # the start of a character whose other bytes are still to come
    text: list[str] = field(default_factory=list)
    filter: ControlTextFilter = field(default_factory=ControlTextFilter)
    hold: bool = False  # a final message that might be a misplaced tool call
    decided: bool = False
    announced: bool = False
    arguments: ArgumentStream | None = None  # a call's arguments (sent while they can be valid JSON)
    plain: bool = True  # text goes out as it comes (not held, not arguments)
    recover: bool = True  # may hold a tool call written as text (not so for an unoffered call's body)


class OutputItems:
    """The items of one parse and the events not taken yet. Text for one item is gathered and
    taken as one ``ItemDelta`` per batch (``take``)."""

    def __init__(
        self,
        request_id: str,
        turn: int,
        tool_names: list[str],
        namespaces: list[str],
        tool_schemas: dict[str, dict[str, Any]],
        recoveries: Counter[str],
    ) -> None:
        self.request_id = request_id
        self.turn = turn
        self.tool_names = tool_names
        self.namespaces = namespaces
        self.tool_schemas = tool_schemas
        self.recoveries = recoveries
        self.calls = 0  # function call items so far (the finish reason is then tool_calls)
        self._next_index = 0
        self._events: list[ParseEvent] = []
        self._delta_index = -1
        self._delta_parts: list[str] = []

    # -- events ---------------------------------------------------------------------------
    def take(self) -> list[ParseEvent]:
        """The events so far; none are kept."""
        self._flush_delta()
        events, self._events = self._events, []
        return events

    def push(self, event: ParseEvent) -> None:
        self._flush_delta()
        self._events.append(event)

    def _flush_delta(self) -> None:
        if self._delta_parts:
            self._events.append(ItemDelta(output_index=self._delta_index, delta="".join(self._delta_parts)))
            self._delta_parts = []

    def _delta(self, index: int, text: str) -> None:
        if index != self._delta_index:
            self._flush_delta()
            self._delta_index = index
        self._delta_parts.append(text)

    # -- opening --------------------------------------------------------------------------
    def open(self, header: Header) -> OpenItem:
        """The item a message with this header opens: a function call when its recipient is an
        offered tool, reasoning on the analysis channel, else an assistant message."""
        index = self._next_index
        self._next_index += 1
        recipient = map_recipient(header.recipient, self.tool_names, self.namespaces)
        channel = header.channel
        unoffered = recipient is not None and recipient.recovered == UNOFFERED
        if unoffered:  # a call to a tool nobody offered is no tool call: its text stays text
            self.recoveries[UNOFFERED] += 1
            recipient = None
        item: OutputItem
        if recipient is not None:
            if recipient.recovered:
                self.recoveries[recipient.recovered] += 1
            if channel != "commentary":
                self.recoveries["tool_call_on_" + (channel or "no_channel")] += 1
            self.calls += 1
            item = FunctionCallItem(
                id=self._id("fc", index),
                call_id=self._id("call", index),
                name=recipient.name,
                namespace=recipient.namespace,
                arguments="",
                status="in_progress",
            )
            kind = "call"
        elif channel == "analysis":
            item = ReasoningItem(id=self._id("rs", index), text="", status="in_progress")
            kind = "reasoning"
        else:
            if channel is None:
                self.recoveries["unknown_channel" if header.unknown_channel else "missing_channel"] += 1
            out_channel = "commentary" if channel == "commentary" else "final"
            item = MessageItem(
                id=self._id("msg", index), role="assistant", content="", channel=out_channel, status="in_progress"
            )
            kind = "message"
        entry = OpenItem(index=index, kind=kind, item=item)
        if kind == "call":
            entry.arguments, entry.plain = ArgumentStream(), False
        elif unoffered:
            entry.recover = False
        elif kind == "message" and self.tool_names:
            entry.hold, entry.plain = True, False
        if not entry.hold:
            self._announce(entry)
        return entry

    def complete(self, channel: str, text: str, incomplete: bool) -> None:
        """A whole item at once: text the model wrote outside any message."""
        entry = self.open(Header(channel=channel))
        if incomplete and entry.hold:  # cut off: no tool-call recovery, stream it as text
            entry.hold, entry.plain = False, True
            self._announce(entry)
        self.text(entry, text)
        self.close(entry, incomplete)

    def _announce(self, entry: OpenItem) -> None:
        entry.announced = True
        self.push(ItemAdded(output_index=entry.index, item=entry.item))

    def _id(self, prefix: str, index: int) -> str:
        digest = hashlib.sha1(f"{self.request_id}:{self.turn}:{prefix}:{index}".encode()).hexdigest()[:24]
        return f"{prefix}_{digest}"

    # -- text -----------------------------------------------------------------------------
    def text(self, entry: OpenItem, delta: str) -> None:
        """Decoded content of an open item: streamed, held, or fed to its arguments."""
        if entry.plain and "<" not in delta and not entry.filter.pending:
            # plain text into a streamed item
            entry.text.append(delta)
            if entry.index == self._delta_index:
                self._delta_parts.append(delta)
            else:
                self._delta(entry.index, delta)
            return
        before = entry.filter.removed
        text = entry.filter.feed(delta)
        if entry.filter.removed != before:
            self.recoveries["control_text_removed"] += 1
        if not text:
            return
        if entry.arguments is not None:
            self._arguments(entry.index, entry.arguments, text)
            return
        entry.text.append(text)
        if entry.hold and not entry.decided:
            so_far = "".join(entry.text).lstrip()
            if not so_far:
                return
            entry.decided = True
            if so_far[0] in "{`":
                return  # keep holding until the message ends
            entry.hold, entry.plain = False, True
            self._announce(entry)
            self._delta(entry.index, "".join(entry.text))
            return
        if not entry.hold:
            self._delta(entry.index, text)

    def _arguments(self, index: int, arguments: ArgumentStream, text: str) -> None:
        sent = arguments.feed(text)  # what can no longer change (services/parser/arguments.py)
        if sent:
            self._delta(index, sent)

    # -- closing --------------------------------------------------------------------------
    def close(self, entry: OpenItem, incomplete: bool = False) -> None:
        """The item's message ended (``incomplete``: cut off): what was held goes out, repaired
        where it must be, and the item is done; a tool call found in a held message follows it
        as an item of its own, or takes its place when the message was nothing but the call."""
        if entry.undecoded:  # the message ended inside a character: U+FFFD, as openai-harmony
            self.text(entry, utf_8_decode(entry.undecoded, "replace", True)[0])
        rest = entry.filter.flush()
        if rest:
            rest = strip_control_text(rest)
            if rest and entry.arguments is not None:
                self._arguments(entry.index, entry.arguments, rest)
            elif rest:
                entry.text.append(rest)
                if entry.announced:
                    self._delta(entry.index, rest)
        text = "".join(entry.text)
        status: ItemStatus = "incomplete" if incomplete else "completed"
        item = entry.item
        call = None
        if (
            entry.kind == "message"
            and entry.recover
            and self.tool_names
            and not incomplete
            and (entry.hold or "{" in text)
        ):
            call = recover_tool_call(text, self.tool_names, self.tool_schemas)
            if call is not None and call.whole and entry.hold:  # the message was nothing but the call
                self._emit_call(entry.index, call)
                return
        if entry.hold:  # a final message we held back: text (around a call, or no call at all)
            if not text:  # nothing to show: its output index goes to the next item
                if self._next_index == entry.index + 1:
                    self._next_index = entry.index
                return
            self._announce(entry)
            self._delta(entry.index, text)
        if isinstance(item, ReasoningItem):
            done: OutputItem = item.model_copy(update={"text": text, "status": status})
        elif isinstance(item, FunctionCallItem):
            args = entry.arguments
            assert args is not None
            arguments, repair = args.finish(incomplete)
            if repair:
                self.recoveries[repair] += 1
            if len(arguments) > args.sent:  # what was held back, repaired: the sent text is its prefix
                self._delta(entry.index, arguments[args.sent :])
            done = item.model_copy(update={"arguments": arguments, "status": status})
        else:
            done = item.model_copy(update={"content": text, "status": status})
        self.push(ItemDone(output_index=entry.index, item=done))
        if call is not None:  # a call written inside an answer shown as text: the text stays, the call follows
            self._emit_call(self._next_index, call)
            self._next_index += 1

    def _emit_call(self, index: int, call: RecoveredCall) -> None:
        """A tool call recovered from text, as a complete function call item at ``index``."""
        self.recoveries[call.kind] += 1
        self.calls += 1
        item = FunctionCallItem(
            id=self._id("fc", index),
            call_id=self._id("call", index),
            name=call.name,
            arguments=call.arguments,
            status="completed",
        )
        self.push(
            ItemAdded(output_index=index, item=item.model_copy(update={"arguments": "", "status": "in_progress"}))
        )
        if call.arguments:
            self._delta(index, call.arguments)
        self.push(ItemDone(output_index=index, item=item))
