"""Parser events -> typed Responses stream events (pure): every event is openai-python's own
type, the bookkeeping holds across model turns, and request input items convert or fail with
the offending path."""

from __future__ import annotations

from typing import Any, cast

import pytest
from openai.types.responses import (
    Response,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseStreamEvent,
)
from pydantic import TypeAdapter

from contracts.messages.items import ConversationItem, FunctionCallItem, MessageItem, ReasoningItem
from contracts.messages.parse import ItemAdded, ItemDelta, ItemDone, ParseEvent
from services.common.errors import ChorusError
from services.gateway.responses.events import Event, EventWriter
from services.gateway.responses.items import input_items, output_item
from services.gateway.responses.output import ItemView, Output
from services.gateway.responses.prepare import Prepared
from services.gateway.responses.request import ResponsesRequest
from services.gateway.responses.run import ResponseRun
from services.gateway.validation import parse_body

EVENT: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)


def _turn(suffix: str) -> list[ParseEvent]:
    rs = ReasoningItem(id=f"rs_{suffix}", text="", status="in_progress")
    fc = FunctionCallItem(id=f"fc_{suffix}", call_id=f"call_{suffix}", name="f", arguments="", status="in_progress")
    msg = MessageItem(id=f"msg_{suffix}", role="assistant", content="", channel="final", status="in_progress")
    return [
        ItemAdded(output_index=0, item=rs),
        ItemDelta(output_index=0, delta="Hm"),
        ItemDone(output_index=0, item=rs.model_copy(update={"text": "Hm", "status": "completed"})),
        ItemAdded(output_index=1, item=fc),
        ItemDelta(output_index=1, delta='{"a":1}'),
        ItemDone(output_index=1, item=fc.model_copy(update={"arguments": '{"a":1}', "status": "completed"})),
        ItemAdded(output_index=2, item=msg),
        ItemDelta(output_index=2, delta="Hi"),
        ItemDone(output_index=2, item=msg.model_copy(update={"content": "Hi", "status": "completed"})),
    ]


def _events(writer: EventWriter, parsed: list[ParseEvent]) -> list[Event]:
    out: list[Event] = []
    for event in parsed:
        out += writer.handle(event)
    return out


def _request(body: dict[str, object]) -> ResponsesRequest:
    import json

    return parse_body(json.dumps({"model": "m", **body}).encode(), ResponsesRequest)


def test_events_are_typed_and_keep_their_bookkeeping_across_turns() -> None:
    output = Output()
    w = EventWriter(output, ItemView())
    events = _events(w, _turn("a"))
    output.next_turn()
    events += _events(w, _turn("b"))
    for e in events:  # each one round-trips through openai-python's union
        assert EVENT.validate_json(e.model_dump_json()).type == e.type
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = [e.output_index for e in events if e.type == "response.output_item.added"]
    done = [e.output_index for e in events if e.type == "response.output_item.done"]
    assert added == done == [0, 1, 2, 3, 4, 5]
    assert all(getattr(e, "content_index", 0) == 0 for e in events)
    assert all(getattr(e, "item_id", None) for e in events if e.type.endswith(".delta"))
    assert [i.id for i in output.items] == ["rs_a", "fc_a", "msg_a", "rs_b", "fc_b", "msg_b"]


def test_reasoning_summary_events_when_asked() -> None:
    w = EventWriter(Output(), ItemView(summary=True))
    kinds = [e.type for e in _events(w, _turn("s")[:3])]
    assert "response.reasoning_summary_part.added" in kinds
    assert "response.reasoning_summary_text.delta" in kinds
    assert kinds.index("response.reasoning_summary_part.done") < kinds.index("response.output_item.done")


def test_open_items_are_closed_incomplete() -> None:
    w = EventWriter(Output(), ItemView())
    msg = MessageItem(id="msg_x", role="assistant", content="", status="in_progress")
    w.handle(ItemAdded(output_index=0, item=msg))
    w.handle(ItemDelta(output_index=0, delta="partial"))
    events = w.close_open()
    last = events[-1]
    assert isinstance(last, ResponseOutputItemDoneEvent) and isinstance(last.item, ResponseOutputMessage)
    assert last.item.status == "incomplete"
    text = last.item.content[0]
    assert isinstance(text, ResponseOutputText) and text.text == "partial"


def test_output_items_make_a_valid_response() -> None:
    items: list[ConversationItem] = [
        ReasoningItem(id="rs_1", text="t"),
        MessageItem(id="msg_1", role="assistant", content="x"),
        FunctionCallItem(id="fc_1", call_id="call_1", name="f", arguments="{}"),
    ]
    resp = Response.model_validate(
        {
            "id": "resp_1",
            "object": "response",
            "created_at": 1,
            "model": "m",
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "status": "completed",
            "output": [output_item(i).model_dump() for i in items],
        }
    )
    assert resp.output_text == "x"
    assert isinstance(resp.output[1], ResponseOutputMessage) and resp.output[1].phase == "final_answer"


def test_input_items_conversion_and_errors() -> None:
    req = _request(
        {
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
                {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "why"}]},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c", "output": "ok"},
                {"type": "message", "role": "assistant", "content": "Checking.", "phase": "commentary"},
            ]
        }
    )
    items = input_items(req.input, {})
    assert [i.type for i in items] == ["message", "reasoning", "function_call", "function_call_output", "message"]
    assert isinstance(items[0], MessageItem) and items[0].content == "ab"
    assert isinstance(items[1], ReasoningItem) and items[1].text == "why"
    assert all(i.id for i in items)
    assert isinstance(items[4], MessageItem) and items[4].channel == "commentary"
    with pytest.raises(ChorusError) as err:
        input_items(
            _request({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}).input, {}
        )
    assert err.value.error.param == "input[0].content[0].type"
    with pytest.raises(ChorusError) as err:
        _request({"input": [{"type": "computer_call"}]})
    assert err.value.error.param == "input[0]"
    with pytest.raises(ChorusError) as err:
        _request({"input": [{"type": "function_call", "call_id": 5, "name": "f"}]})
    assert err.value.error.param == "input[0].call_id"


def test_a_completed_response_has_one_completion_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The object returned, the one streamed last and the one stored are built at different
    moments; a second boundary between them must not give them different ``completed_at``."""
    clock = iter([1000.2, 1001.7, 1002.1])
    monkeypatch.setattr("time.time", lambda: next(clock))
    req = parse_body(b'{"model": "m", "input": "hi"}', ResponsesRequest)
    prepared = Prepared(req, "resp_1", 999, [], [], store=cast(Any, None))
    run = ResponseRun(cast(Any, None), prepared, status="completed")
    first, stored = run.response(), run.response()
    assert first.completed_at == stored.completed_at == 1000
    assert run.response("in_progress").completed_at is None
