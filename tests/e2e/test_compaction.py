"""Compaction end to end through `chorus up` with openai-python: `responses.compact()`, the
sealed item sent back (HTTP and WebSocket), `context_management` and `compaction_trigger`."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from openai.resources.responses.responses import ResponsesConnection
from openai.types.responses import (
    ResponseCompactionCompactingEvent,
    ResponseCompactionItem,
    ResponseInputParam,
    ResponseOutputItem,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponsesServerEvent,
)

from services.gateway.responses.compaction import INSTRUCTION
from tests.e2e.conftest import MODEL, RunningStack

SUMMARY_HEADER = "Summary of the conversation so far"
LONG_ANSWER = "The lighthouse keeper logged every ship. " * 150  # ~1,500 tokens of assistant text


def history() -> ResponseInputParam:
    return [
        {"role": "user", "content": "Tell me about the lighthouse on Skerry Point."},
        {"role": "assistant", "content": LONG_ANSWER},
        {"role": "user", "content": "Who kept it in 1901?"},
        {"role": "assistant", "content": "Agnes Moberg kept it from 1899 to 1923."},
    ]


def _text(item: ResponseOutputItem) -> str:
    """The text of a message item's first content part."""
    assert isinstance(item, ResponseOutputMessage), item
    part = item.content[0]
    assert isinstance(part, ResponseOutputText), part
    return part.text


def _error_param(error: openai.APIStatusError) -> object:
    """The ``param`` of an OpenAI error body."""
    assert isinstance(error.body, dict), error.body
    return error.body["param"]


def test_compact_returns_user_messages_and_a_sealed_item_that_renders_as_context(stack: RunningStack) -> None:
    client = stack.client()
    raw = client.responses.with_raw_response.compact(model=MODEL, input=history())
    compacted = raw.parse()
    assert compacted.object == "response.compaction"
    kinds = [item.type for item in compacted.output]
    assert kinds == ["message", "message", "compaction"]
    assert [_text(m) for m in compacted.output[:2]] == [
        "Tell me about the lighthouse on Skerry Point.",
        "Who kept it in 1901?",
    ]
    item = compacted.output[-1]
    assert isinstance(item, ResponseCompactionItem), item
    assert item.encrypted_content.startswith("chorus1.")
    assert LONG_ANSWER[:40] not in item.encrypted_content
    assert compacted.usage.output_tokens > 0 and compacted.usage.input_tokens > 0
    # the summary was written by the model, asked with the whole conversation
    assert INSTRUCTION in stack.engine_prompt(compacted.id)
    assert LONG_ANSWER[:80] in stack.engine_prompt(compacted.id)

    follow: ResponseInputParam = raw.http_response.json()["output"]  # sent back as it came
    follow.append({"role": "user", "content": "And after 1923?"})
    answer = client.responses.create(model=MODEL, input=follow)
    assert answer.status == "completed"
    prompt = stack.engine_prompt(answer.id)
    assert SUMMARY_HEADER in prompt and "And after 1923?" in prompt and "Skerry Point" in prompt
    assert LONG_ANSWER[:80] not in prompt  # the compacted answer is read as its summary

    # the same item over a WebSocket
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input=follow, store=False)
        events = list(_until_done(conn))
    assert events[-1].type == "response.completed"
    assert SUMMARY_HEADER in stack.engine_prompt(events[-1].response.id)


def _until_done(conn: ResponsesConnection) -> Iterator[ResponsesServerEvent]:
    for event in conn:
        yield event
        if event.type in ("response.completed", "response.failed", "error"):
            return


def test_compact_requires_a_model_and_refuses_foreign_items(stack: RunningStack) -> None:
    r = httpx.post(f"{stack.base_url}/v1/responses/compact", json={"input": "hello"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    with pytest.raises(openai.BadRequestError) as info:
        stack.client().responses.create(
            model=MODEL,
            input=[{"type": "compaction", "encrypted_content": "chorus1.forged"}, {"role": "user", "content": "hi"}],
        )
    assert _error_param(info.value) == "input[0].encrypted_content"


def test_compact_a_stored_chain(stack: RunningStack) -> None:
    client = stack.client()
    first = client.responses.create(model=MODEL, input=history())
    compacted = client.responses.compact(model=MODEL, previous_response_id=first.id, input="Keep the dates.")
    assert [i.type for i in compacted.output][-1] == "compaction"
    texts = [_text(i) for i in compacted.output if i.type == "message"]
    assert texts[-1] == "Keep the dates." and "Who kept it in 1901?" in texts
    with pytest.raises(openai.NotFoundError):
        client.responses.compact(model=MODEL, previous_response_id="resp_missing", input="x")


def test_context_management_compacts_when_the_prompt_passes_the_threshold(stack: RunningStack) -> None:
    client = stack.client()
    events = list(
        client.responses.create(
            model=MODEL,
            input=[*history(), {"role": "user", "content": "Summarise his log."}],
            context_management=[{"type": "compaction", "compact_threshold": 1000}],
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.compaction.compacting"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = events[-1]
    assert done.type == "response.completed"
    output = done.response.output
    compacting = events[2]
    assert isinstance(compacting, ResponseCompactionCompactingEvent), compacting
    assert isinstance(output[0], ResponseCompactionItem) and output[0].id == compacting.item_id
    assert output[-1].type == "message"
    prompt = stack.engine_prompt(done.response.id)
    assert SUMMARY_HEADER in prompt and LONG_ANSWER[:80] not in prompt and "Summarise his log." in prompt
    # usage counts the summary's generation too
    assert done.response.usage is not None and done.response.usage.input_tokens > 1000

    # continuing the chain reads the summary, not what it replaced
    nxt = client.responses.create(model=MODEL, previous_response_id=done.response.id, input="Thanks!")
    prompt = stack.engine_prompt(nxt.id)
    assert SUMMARY_HEADER in prompt and LONG_ANSWER[:80] not in prompt and "Thanks!" in prompt

    # under the threshold nothing is compacted
    small = client.responses.create(
        model=MODEL, input="hi", context_management=[{"type": "compaction", "compact_threshold": 1000}]
    )
    assert [i.type for i in small.output] != [] and all(i.type != "compaction" for i in small.output)


def test_a_compaction_trigger_compacts_and_ends_the_response(stack: RunningStack) -> None:
    client = stack.client()
    done = client.responses.create(model=MODEL, input=[*history(), {"type": "compaction_trigger"}])
    assert done.status == "completed"
    assert [i.type for i in done.output] == ["compaction"]
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, input=[{"type": "compaction_trigger"}, *history()])
    assert _error_param(info.value) == "input[0]"


def test_a_conversation_too_long_to_compact_is_a_400(stack: RunningStack) -> None:
    """Compacting a conversation longer than the model's context: the caller's 400, before
    anything is sent (streamed or not), as for any other model turn; not a failed response."""
    body = {
        "model": MODEL,
        "input": [{"role": "user", "content": "word " * 140_000}, {"type": "compaction_trigger"}],
        "context_management": [{"type": "compaction", "compact_threshold": 1000}],
    }
    with httpx.Client(base_url=stack.base_url, timeout=120) as http:
        for stream in (False, True):
            resp = http.post("/v1/responses", json={**body, "stream": stream})
            assert resp.status_code == 400, resp.text
            assert resp.json()["error"]["code"] == "context_length_exceeded"
