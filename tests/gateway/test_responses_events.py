"""Parser events -> Responses stream events (pure): every event validates as openai's type,
the bookkeeping holds, and the stream helper's accumulator accepts the sequence."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from contracts.messages.items import FunctionCallItem, MessageItem, ReasoningItem
from contracts.messages.parse import ItemAdded, ItemDelta, ItemDone
from services.gateway.errors import ApiError
from services.gateway.responses.convert import input_items, output_json
from services.gateway.responses.events import EventWriter

EVENT = TypeAdapter(ResponseStreamEvent)


def _turn(offset_ids: str) -> list:
    rs = ReasoningItem(id=f"rs_{offset_ids}", text="", status="in_progress")
    fc = FunctionCallItem(id=f"fc_{offset_ids}", call_id=f"call_{offset_ids}", name="f", arguments="",
                          status="in_progress")
    msg = MessageItem(id=f"msg_{offset_ids}", role="assistant", content="", channel="final", status="in_progress")
    return [
        ItemAdded(output_index=0, item=rs), ItemDelta(output_index=0, delta="Hm"),
        ItemDone(output_index=0, item=rs.model_copy(update={"text": "Hm", "status": "completed"})),
        ItemAdded(output_index=1, item=fc), ItemDelta(output_index=1, delta='{"a":1}'),
        ItemDone(output_index=1, item=fc.model_copy(update={"arguments": '{"a":1}', "status": "completed"})),
        ItemAdded(output_index=2, item=msg), ItemDelta(output_index=2, delta="Hi"),
        ItemDone(output_index=2, item=msg.model_copy(update={"content": "Hi", "status": "completed"})),
    ]


def test_events_validate_and_keep_their_bookkeeping_across_turns() -> None:
    w = EventWriter()
    events: list[dict[str, Any]] = []
    for ev in _turn("a"):
        events += w.handle(ev)
    w.next_turn()
    for ev in _turn("b"):
        events += w.handle(ev)
    for e in events:
        EVENT.validate_python(e)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    done = [e["output_index"] for e in events if e["type"] == "response.output_item.done"]
    assert added == done == [0, 1, 2, 3, 4, 5]
    assert all(e.get("content_index", 0) == 0 for e in events)
    assert all("item_id" in e for e in events if e["type"].endswith(".delta"))
    assert [i.id for i in w.output] == ["rs_a", "fc_a", "msg_a", "rs_b", "fc_b", "msg_b"]


def test_open_items_are_closed_incomplete() -> None:
    w = EventWriter()
    msg = MessageItem(id="msg_x", role="assistant", content="", status="in_progress")
    w.handle(ItemAdded(output_index=0, item=msg))
    w.handle(ItemDelta(output_index=0, delta="partial"))
    events = w.close_open()
    assert events[-1]["type"] == "response.output_item.done"
    assert events[-1]["item"]["status"] == "incomplete"
    assert events[-1]["item"]["content"][0]["text"] == "partial"


def test_output_items_validate_as_a_response() -> None:
    items = [ReasoningItem(id="rs_1", text="t"), MessageItem(id="msg_1", role="assistant", content="x"),
             FunctionCallItem(id="fc_1", call_id="call_1", name="f", arguments="{}")]
    resp = {"id": "resp_1", "object": "response", "created_at": 1, "model": "m", "parallel_tool_calls": True,
            "tool_choice": "auto", "tools": [], "status": "completed",
            "output": [output_json(i) for i in items]}
    parsed = Response.model_validate(resp)
    assert parsed.output_text == "x"


def test_input_items_conversion_and_errors() -> None:
    items = input_items([
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "why"}]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "ok"},
    ], {})
    assert [i.type for i in items] == ["message", "reasoning", "function_call", "function_call_output"]
    assert items[0].content == "ab" and items[1].text == "why" and all(i.id for i in items)
    with pytest.raises(ApiError) as err:
        input_items([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}], {})
    assert err.value.error.param == "input[0].content[0]"
    with pytest.raises(ApiError) as err:
        input_items([{"type": "computer_call"}], {})
    assert err.value.error.param == "input[0].type"
