"""Anthropic Messages API conversations -> our items (pure): messages mapped in order (thinking,
tool uses and their results, text), arguments kept as written, system messages joined to the
instructions without Claude Code's billing header, tool results answering earlier tool uses,
blocks in the wrong role and prefill refused, and thinking signatures that must be ours and
untouched."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from cryptography.fernet import Fernet

from contracts.messages.items import FunctionCallItem, FunctionCallOutputItem, MessageItem, ReasoningItem
from services.common.errors import CallerError
from services.gateway.messages.items import instructions_of, messages_to_items, to_encode_request
from services.gateway.messages.request import validate_request
from services.gateway.sealing import Sealer
from tests.gateway.messages_bodies import BASE, BILLING, SEALER, body, tool


def items_refused(data: dict[str, Any], sealer: Sealer = SEALER) -> CallerError:
    request = validate_request(data)
    with pytest.raises(CallerError) as caught:
        to_encode_request(request, unseal=sealer.open)
    assert caught.value.status_code == 400
    return caught.value


def test_conversation_maps_to_items_in_order() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Find q."}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "I should search.", "signature": SEALER.seal("I should search.")},
                {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"q": "ß"}},
                {"type": "tool_use", "id": "toolu_2", "name": "ToolSearch", "input": {"query": "select:search"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Also look at this."},
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "boom", "is_error": True},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [{"type": "text", "text": "Found:"}, {"type": "tool_reference", "tool_name": "search"}],
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "redacted_thinking", "data": SEALER.seal("Done thinking.")},
                {"type": "text", "text": "Here it is."},
                {"type": "text", "text": "Anything else?"},
            ],
        },
        {"role": "user", "content": "Thanks"},
    ]
    request = validate_request(body(system="Be brief.", tools=[tool("search"), tool("ToolSearch")], messages=messages))
    assert instructions_of(request) == "Be brief."
    assert messages_to_items(request.messages, SEALER.open) == [
        MessageItem(role="user", content="Find q."),
        ReasoningItem(text="I should search."),
        FunctionCallItem(call_id="toolu_1", name="search", arguments='{"q":"ß"}'),
        FunctionCallItem(call_id="toolu_2", name="ToolSearch", arguments='{"query":"select:search"}'),
        FunctionCallOutputItem(call_id="toolu_1", output="Error: boom"),
        FunctionCallOutputItem(call_id="toolu_2", output="Found:\nLoaded tool: search"),
        MessageItem(role="user", content="Also look at this."),
        ReasoningItem(text="Done thinking."),
        MessageItem(role="assistant", content="Here it is.\n\nAnything else?", channel="final"),
        MessageItem(role="user", content="Thanks"),
    ]


def test_arguments_that_were_not_an_object_come_back_as_written() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"_raw": "[1, 2"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "bad input"}]},
    ]
    items = messages_to_items(validate_request(body(messages=messages)).messages, SEALER.open)
    assert items[1] == FunctionCallItem(call_id="t", name="f", arguments="[1, 2")


def test_system_messages_join_the_instructions_without_the_billing_header() -> None:
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "First rule."}]},
        {"role": "user", "content": "a"},
        {"role": "system", "content": "Only until the next user turn.", "clear_at": "next_user_message"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "system", "content": "Last rule.", "clear_at": "next_user_message"},
    ]
    request = validate_request(body(system=f"{BILLING}\nBe kind.", messages=messages))
    assert instructions_of(request) == "Be kind.\n\nFirst rule.\n\nLast rule."
    assert instructions_of(validate_request(body(system=[{"type": "text", "text": BILLING}]))) is None
    bad = [{"role": "system", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}, *messages]
    assert items_refused(body(messages=bad)).error.param == "messages.0.content.0.type"


def test_tool_result_must_answer_an_earlier_tool_use() -> None:
    lonely = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"}]}]
    error = items_refused(body(messages=lonely)).error
    assert error.param == "messages.0.content.0.tool_use_id" and "toolu_9" in error.message
    later = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "tool_result", "tool_use_id": "t"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
    ]
    assert items_refused(body(messages=later)).error.param == "messages.2.content.1.tool_use_id"


def test_blocks_in_the_wrong_role_and_prefill_are_refused() -> None:
    use = {"type": "tool_use", "id": "t", "name": "f", "input": {}}
    assert items_refused(body(messages=[{"role": "user", "content": [use]}])).error.param == "messages.0.content.0.type"
    result = {"type": "tool_result", "tool_use_id": "t"}
    wrong = [{"role": "user", "content": "a"}, {"role": "assistant", "content": [use, result]}, BASE["messages"][0]]
    assert items_refused(body(messages=wrong)).error.param == "messages.1.content.1.type"
    prefill = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "The answer is ("}]
    assert items_refused(body(messages=prefill)).error.param == "messages.1"
    assert items_refused(body(messages=[{"role": "system", "content": "only"}])).error.param == "messages"


def test_thinking_signatures_round_trip_and_tampering_is_refused() -> None:
    sealed = SEALER.seal("The real reasoning.")
    turn: list[dict[str, Any]] = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "an edited text", "signature": sealed}]},
        {"role": "user", "content": "go on"},
    ]
    items = messages_to_items(validate_request(body(messages=turn)).messages, SEALER.open)
    assert items[1] == ReasoningItem(text="The real reasoning.")  # the sealed text, not the plain one

    tampered = copy.deepcopy(turn)
    tampered[1]["content"][0]["signature"] = sealed[:-6] + ("A" if sealed[-6] != "A" else "B") + sealed[-5:]
    error = items_refused(body(messages=tampered)).error
    assert error.param == "messages.1.content.0.signature" and "not valid" in error.message

    foreign = Sealer([Fernet.generate_key()])  # another server's key
    assert items_refused(body(messages=turn), foreign).error.param == "messages.1.content.0.signature"
    anthropics = copy.deepcopy(turn)
    anthropics[1]["content"][0]["signature"] = "EqQBCkYIBxgCKkBsignaturefromclaude"
    assert items_refused(body(messages=anthropics)).error.param == "messages.1.content.0.signature"
    redacted = copy.deepcopy(turn)
    redacted[1]["content"][0] = {"type": "redacted_thinking", "data": "chorus1.not-a-token"}
    assert items_refused(body(messages=redacted)).error.param == "messages.1.content.0.data"
