"""Parser events -> Chat Completions deltas and message (pure)."""

from __future__ import annotations

import openai.types.chat as chat_types

from contracts.messages.items import FunctionCallItem, FunctionCallOutputItem, MessageItem, ReasoningItem
from contracts.messages.parse import Finished, ItemAdded, ItemDelta, ItemDone, ParseEvent, Usage
from services.gateway.chat.events import ChatState, usage_json
from services.gateway.chat.items import messages_to_items
from services.gateway.chat.request import ChatMessage
from services.gateway.chat.response import message


def _events() -> list[ParseEvent]:
    return [
        ItemAdded(output_index=0, item=ReasoningItem(id="rs_1", text="")),
        ItemDelta(output_index=0, delta="Think"),
        ItemDelta(output_index=0, delta="ing."),
        ItemDone(output_index=0, item=ReasoningItem(id="rs_1", text="Thinking.")),
        ItemAdded(output_index=1, item=FunctionCallItem(id="fc_1", call_id="call_1", name="f", arguments="")),
        ItemDelta(output_index=1, delta='{"a":'),
        ItemDelta(output_index=1, delta="1}"),
        ItemDone(output_index=1, item=FunctionCallItem(id="fc_1", call_id="call_1", name="f", arguments='{"a":1}')),
        Finished(finish_reason="tool_calls", usage=Usage(prompt_tokens=10, completion_tokens=7, reasoning_tokens=3)),
    ]


def test_deltas_are_coalesced_per_batch_and_carry_both_reasoning_names() -> None:
    state = ChatState()
    deltas = state.apply(_events())
    assert deltas == [
        {"reasoning_content": "Thinking.", "reasoning": "Thinking."},
        {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"a":1}'}}]},
    ]
    assert state.finish_reason == "tool_calls"
    msg = message(state)
    assert msg["content"] is None and msg["reasoning"] == msg["reasoning_content"] == "Thinking."
    chat_types.ChatCompletionMessage.model_validate(msg)


def test_item_done_sends_text_that_was_held_back() -> None:
    state = ChatState()
    state.apply([ItemAdded(output_index=0, item=MessageItem(role="assistant", content="", id="m"))])
    deltas = state.apply([ItemDone(output_index=0, item=MessageItem(role="assistant", content="All of it", id="m"))])
    assert deltas == [{"content": "All of it"}]
    # an item that only ever arrives as done (e.g. a recovered tool call) is announced first
    deltas = state.apply([ItemDone(output_index=1, item=FunctionCallItem(call_id="call_2", name="g", arguments="{}"))])
    assert deltas[0]["tool_calls"][0]["id"] == "call_2"
    assert message(state)["tool_calls"][0]["function"]["arguments"] == "{}"


def test_usage_shape() -> None:
    u = usage_json(Usage(prompt_tokens=3, completion_tokens=4, reasoning_tokens=2, cached_tokens=1))
    assert u == {
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "total_tokens": 7,
        "completion_tokens_details": {"reasoning_tokens": 2},
        "prompt_tokens_details": {"cached_tokens": 1},
    }


def test_history_conversion_keeps_reasoning_preamble_and_calls() -> None:
    items = messages_to_items(
        [
            ChatMessage(role="user", content="hi"),
            ChatMessage.model_validate(
                {
                    "role": "assistant",
                    "content": "Checking.",
                    "thinking": "Plan.",
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}],
                }
            ),
            ChatMessage.model_validate(
                {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "ok"}]}
            ),
        ]
    )
    assert [i.type for i in items] == ["message", "reasoning", "message", "function_call", "function_call_output"]
    preamble, call, output = items[2], items[3], items[4]
    assert isinstance(preamble, MessageItem) and preamble.channel == "commentary"
    assert isinstance(call, FunctionCallItem) and call.arguments == '{"x": 1}'
    assert isinstance(output, FunctionCallOutputItem) and output.output == "ok"


def test_an_engine_abort_is_not_a_complete_answer() -> None:
    """Chat has no finish reason for a generation the engine cut off: the state says it was
    aborted (the run then fails) instead of passing it off as ``stop``."""
    state = ChatState()
    state.apply([ItemAdded(output_index=0, item=MessageItem(role="assistant", content="", id="m"))])
    state.apply([ItemDelta(output_index=0, delta="Half an ans"), Finished(finish_reason="abort", usage=Usage())])
    assert state.aborted and state.finish_reason == "abort"
    done = ChatState()
    done.apply([Finished(finish_reason="stop", usage=Usage())])
    assert not done.aborted and done.finish_reason == "stop"
