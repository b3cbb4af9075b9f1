"""Parser events -> Anthropic's streamed Message events and the whole Message (pure), checked with
the anthropic SDK's own types and, end to end, its client reading the bytes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic
import orjson
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from anthropic.types.shared import ErrorResponse
from cryptography.fernet import Fernet
from pydantic import TypeAdapter

from contracts.errors import BusError, ErrorCode
from contracts.messages.items import FunctionCallItem, MessageItem, ReasoningItem
from contracts.messages.parse import Failed, Finished, FinishReason, ItemAdded, ItemDelta, ItemDone, ParseEvent, Usage
from services.gateway.messages.events import MessageStream, message_bytes, message_json
from services.gateway.messages.items import messages_to_items
from services.gateway.messages.request import validate_request
from services.gateway.messages.response import error_body, status_of, usage_json
from services.gateway.sealing import Sealer

EVENTS: TypeAdapter[RawMessageStreamEvent] = TypeAdapter(RawMessageStreamEvent)
Payload = dict[str, Any]


def mark(text: str) -> str:
    return f"sealed<{text}>"


def reasoning(index: int, *pieces: str) -> list[ParseEvent]:
    return [
        ItemAdded(output_index=index, item=ReasoningItem(id=f"rs_{index}", text="")),
        *(ItemDelta(output_index=index, delta=p) for p in pieces),
        ItemDone(output_index=index, item=ReasoningItem(id=f"rs_{index}", text="".join(pieces))),
    ]


def text(index: int, *pieces: str, channel: str = "final") -> list[ParseEvent]:
    return [
        ItemAdded(output_index=index, item=MessageItem(role="assistant", content="", channel=channel)),
        *(ItemDelta(output_index=index, delta=p) for p in pieces),
        ItemDone(output_index=index, item=MessageItem(role="assistant", content="".join(pieces), channel=channel)),
    ]


def call(index: int, *pieces: str, call_id: str = "call_1", name: str = "get_weather") -> list[ParseEvent]:
    return [
        ItemAdded(output_index=index, item=FunctionCallItem(call_id=call_id, name=name, arguments="")),
        *(ItemDelta(output_index=index, delta=p) for p in pieces),
        ItemDone(output_index=index, item=FunctionCallItem(call_id=call_id, name=name, arguments="".join(pieces))),
    ]


def finished(reason: FinishReason = "tool_calls", cached: int | None = 32) -> Finished:
    return Finished(
        finish_reason=reason,
        usage=Usage(prompt_tokens=50, completion_tokens=20, reasoning_tokens=5, cached_tokens=cached),
    )


def turn() -> list[ParseEvent]:
    return [
        *reasoning(0, "Think", "ing."),
        *text(1, "Let me ", "check.", channel="commentary"),
        *call(2, '{"city":', '"Paris"}'),
        finished(),
    ]


def run(events: list[ParseEvent], *, show: bool = True, keep: bool = True, seal: Callable[[str], str] = mark) -> bytes:
    """The whole stream, the route's way: start, a batch at a time, finish."""
    stream = MessageStream("gpt-oss-120b", "msg_1", seal, show, keep_thinking=keep)
    return stream.start(input_tokens=50) + b"".join(stream.apply([e]) for e in events) + stream.finish()


def whole(events: list[ParseEvent], *, show: bool = True, keep: bool = True) -> MessageStream:
    stream = MessageStream("gpt-oss-120b", "msg_1", mark, show, keep_thinking=keep)
    stream.apply(events)
    return stream


def parse(sse: bytes) -> list[tuple[str, Payload]]:
    out: list[tuple[str, Payload]] = []
    for frame in sse.split(b"\n\n"):
        if not frame:
            continue
        head, data = frame.split(b"\n")
        assert head.startswith(b"event: ") and data.startswith(b"data: ")
        name, payload = head[len(b"event: ") :].decode(), orjson.loads(data[len(b"data: ") :])
        assert payload["type"] == name
        out.append((name, payload))
    return out


def accumulate(sse: bytes) -> Message:
    """The final Message a client builds from the events, each validated by the SDK's types."""
    message: Payload = {}
    partial: dict[int, str] = {}
    for _, payload in parse(sse):
        EVENTS.validate_python(payload)
        kind = payload["type"]
        if kind == "message_start":
            message = payload["message"]
        elif kind == "content_block_start":
            message["content"].append(payload["content_block"])
        elif kind == "content_block_delta":
            block, delta = message["content"][payload["index"]], payload["delta"]
            if delta["type"] == "input_json_delta":
                partial[payload["index"]] = partial.get(payload["index"], "") + delta["partial_json"]
            else:
                field = {"text_delta": "text", "thinking_delta": "thinking", "signature_delta": "signature"}
                name = field[delta["type"]]
                block[name] = (block[name] + delta[name]) if name != "signature" else delta[name]
        elif kind == "content_block_stop" and payload["index"] in partial:
            message["content"][payload["index"]]["input"] = json.loads(partial[payload["index"]])
        elif kind == "message_delta":
            message.update(payload["delta"])
            message["usage"].update({k: v for k, v in payload["usage"].items() if v is not None})
    return Message.model_validate(message)


def test_a_turn_gives_the_exact_event_sequence() -> None:
    events = parse(run(turn()))
    usage = {"input_tokens": 18, "output_tokens": 20, "cache_read_input_tokens": 32, "cache_creation_input_tokens": 0}
    assert events == [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "gpt-oss-120b",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 50, "output_tokens": 0},
                },
            },
        ),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "thinking", "thinking": "", "signature": ""},
            },
        ),
        delta(0, {"type": "thinking_delta", "thinking": "Think"}),
        delta(0, {"type": "thinking_delta", "thinking": "ing."}),
        delta(0, {"type": "signature_delta", "signature": "sealed<Thinking.>"}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        ),
        delta(1, {"type": "text_delta", "text": "Let me "}),
        delta(1, {"type": "text_delta", "text": "check."}),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 2,
                "content_block": {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}},
            },
        ),
        delta(2, {"type": "input_json_delta", "partial_json": '{"city":'}),
        delta(2, {"type": "input_json_delta", "partial_json": '"Paris"}'}),
        ("content_block_stop", {"type": "content_block_stop", "index": 2}),
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None}, "usage": usage},
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


def delta(index: int, body: Payload) -> tuple[str, Payload]:
    return ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": body})


def test_the_stream_adds_up_to_the_whole_message() -> None:
    streamed = accumulate(run(turn()))
    stream = whole(turn())
    message = Message.model_validate(message_json(stream))
    assert streamed == message
    assert Message.model_validate_json(message_bytes(stream)) == message
    assert message.stop_reason == "tool_use" and message.usage.cache_read_input_tokens == 32
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[2].model_dump(exclude_none=True) == {
        "type": "tool_use",
        "id": "call_1",
        "name": "get_weather",
        "input": {"city": "Paris"},
    }


def test_hidden_thinking_has_its_signature_and_no_text() -> None:
    events = parse(run(turn(), show=False))
    assert not [e for e in events if e[1].get("delta", {}).get("type") == "thinking_delta"]
    message = Message.model_validate(message_json(whole(turn(), show=False)))
    assert accumulate(run(turn(), show=False)) == message
    assert message.content[0].model_dump() == {"type": "thinking", "thinking": "", "signature": "sealed<Thinking.>"}


def test_thinking_off_sends_no_thinking_block() -> None:
    message = accumulate(run(turn(), keep=False))
    assert [b.type for b in message.content] == ["text", "tool_use"]
    assert message == Message.model_validate(message_json(whole(turn(), keep=False)))


def test_the_signature_brings_the_reasoning_back() -> None:
    sealer = Sealer([Fernet.generate_key()])
    message = accumulate(run(turn(), show=False, seal=sealer.seal))
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "Sunny"}]},
    ]
    request = validate_request({"model": "m", "max_tokens": 10, "messages": history})
    items = messages_to_items(request.messages, sealer.open)
    assert items[1] == ReasoningItem(text="Thinking.")
    assert items[3] == FunctionCallItem(call_id="call_1", name="get_weather", arguments='{"city":"Paris"}')


@pytest.mark.parametrize(
    ("pieces", "streamed", "value"),
    [
        (['{"a": [1, ', "2]}"], ['{"a": [1, ', "2]}"], {"a": [1, 2]}),
        (["[1, 2]"], ['{"_raw":"[1, 2]"}'], {"_raw": "[1, 2]"}),
        (["not json"], ['{"_raw":"not json"}'], {"_raw": "not json"}),
        (["  "], [], {}),
        ([], [], {}),
    ],
)
def test_tool_input_is_an_object(pieces: list[str], streamed: list[str], value: Payload) -> None:
    events = [*call(0, *pieces), finished()]
    sent = [e[1]["delta"]["partial_json"] for e in parse(run(events)) if e[0] == "content_block_delta"]
    assert sent == streamed
    message = Message.model_validate(message_json(whole(events)))
    assert message.content[0].model_dump()["input"] == value == accumulate(run(events)).content[0].model_dump()["input"]


def test_an_object_that_ends_invalid_is_raw_in_the_whole_message() -> None:
    events = [*call(0, '{"a": 1', ", oops"), finished()]
    sent = [e[1]["delta"]["partial_json"] for e in parse(run(events)) if e[0] == "content_block_delta"]
    assert "".join(sent) == '{"a": 1, oops'  # a streaming client gets what the model wrote
    assert message_json(whole(events))["content"][0]["input"] == {"_raw": '{"a": 1, oops'}


def test_text_held_back_and_items_that_only_arrive_done() -> None:
    stream = MessageStream("m", "msg_2", mark, True)
    stream.start()
    stream.apply([ItemAdded(output_index=0, item=MessageItem(role="assistant", content=""))])
    done = stream.apply([ItemDone(output_index=0, item=MessageItem(role="assistant", content="All of it"))])
    assert [p for _, p in parse(done)] == [
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "All of it"}},
        {"type": "content_block_stop", "index": 0},
    ]
    recovered = FunctionCallItem(call_id="call_9", name="f", arguments='{"x":1}')
    names = [n for n, _ in parse(stream.apply([ItemDone(output_index=1, item=recovered), finished("stop")]))]
    assert names == ["content_block_start", "content_block_delta", "content_block_stop"]
    assert message_json(stream)["content"][1]["input"] == {"x": 1} and stream.stop_reason == "tool_use"


@pytest.mark.parametrize(
    ("reason", "events", "stop_reason"),
    [
        ("stop", text(0, "Hi"), "end_turn"),
        ("length", text(0, "Hi"), "max_tokens"),
        ("length", [*reasoning(0, "Hmm")], "max_tokens"),
        ("tool_calls", call(0, "{}"), "tool_use"),
        ("stop", call(0, "{}"), "tool_use"),
    ],
)
def test_stop_reasons(reason: FinishReason, events: list[ParseEvent], stop_reason: str) -> None:
    stream = whole([*events, finished(reason, cached=None)])
    assert stream.stop_reason == stop_reason and not stream.aborted
    assert Message.model_validate(message_json(stream)).stop_reason == stop_reason


def test_a_matched_stop_sequence_is_reported_when_known() -> None:
    stream = whole([*text(0, "1, 2, 3"), finished("stop")])
    stream.stop_sequence = "4"
    message = Message.model_validate(message_json(stream))
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "4")


def test_usage_without_cache_information_and_an_abort() -> None:
    assert usage_json(Usage(prompt_tokens=7, completion_tokens=3)) == {"input_tokens": 7, "output_tokens": 3}
    assert usage_json(None) == {"input_tokens": 0, "output_tokens": 0}
    assert whole([*text(0, "cut"), finished("abort")]).aborted


def test_ping_and_failures_end_the_stream_as_anthropic_does() -> None:
    stream = MessageStream("m", "msg_3", mark, True)
    assert parse(stream.ping()) == [("ping", {"type": "ping"})]
    stream.apply([Failed(error=BusError(code=ErrorCode.ENGINE_UNAVAILABLE, message="worker w1 at 10.0.0.7 died"))])
    assert stream.failed is not None
    ((name, payload),) = parse(stream.error(stream.failed.error))
    assert name == "error" and payload["error"]["type"] == "overloaded_error"
    assert "10.0.0.7" not in payload["error"]["message"]  # cleaned for the client
    ErrorResponse.model_validate(payload)


@pytest.mark.parametrize(
    ("code", "kind", "status", "sdk_error"),
    [
        (ErrorCode.INVALID_REQUEST, "invalid_request_error", 400, anthropic.BadRequestError),
        (ErrorCode.MISSING_REQUIRED_PARAMETER, "invalid_request_error", 400, anthropic.BadRequestError),
        (ErrorCode.CONTEXT_LENGTH_EXCEEDED, "invalid_request_error", 400, anthropic.BadRequestError),
        (ErrorCode.INVALID_API_KEY, "authentication_error", 401, anthropic.AuthenticationError),
        (ErrorCode.NOT_FOUND, "not_found_error", 404, anthropic.NotFoundError),
        (ErrorCode.MODEL_NOT_FOUND, "not_found_error", 404, anthropic.NotFoundError),
        (ErrorCode.REQUEST_TOO_LARGE, "request_too_large", 413, anthropic.APIStatusError),
        (ErrorCode.ENGINE_UNAVAILABLE, "overloaded_error", 529, anthropic.OverloadedError),
        (ErrorCode.SERVICE_UNAVAILABLE, "overloaded_error", 529, anthropic.OverloadedError),
        (ErrorCode.TIMEOUT, "timeout_error", 504, anthropic.InternalServerError),
        (ErrorCode.ENGINE_ERROR, "api_error", 500, anthropic.InternalServerError),
        (ErrorCode.INTERNAL, "api_error", 500, anthropic.InternalServerError),
    ],
)
def test_errors_map_to_anthropic_types_and_statuses(
    code: ErrorCode, kind: str, status: int, sdk_error: type[anthropic.APIStatusError]
) -> None:
    body = error_body(code, "what happened")
    assert body == {"type": "error", "error": {"type": kind, "message": "what happened"}}
    assert status_of(code) == status
    if kind != "request_too_large":  # documented, but not among the SDK's error objects
        ErrorResponse.model_validate(body)
    client = sdk_client(lambda: (status, orjson.dumps(body), "application/json"))
    with pytest.raises(sdk_error) as caught:
        client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == status


# -- the SDK's client reading the bytes --------------------------------------------------------
def sdk_client(answer: Callable[[], tuple[int, bytes, str]]) -> anthropic.Anthropic:
    httpx = pytest.importorskip("httpx2")  # the transport of anthropic's client

    def respond(request: Any) -> Any:
        status, content, kind = answer()
        return httpx.Response(status, content=content, headers={"content-type": kind})

    http = httpx.Client(transport=httpx.MockTransport(respond))
    return anthropic.Anthropic(api_key="k", base_url="http://chorus", http_client=http, max_retries=0)


def test_the_sdk_reads_the_stream_and_the_whole_message_alike() -> None:
    stream = whole(turn())
    expected = Message.model_validate(message_json(stream))
    streamed = sdk_client(lambda: (200, stream_bytes(), "text/event-stream"))
    with streamed.messages.stream(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]) as s:
        final = s.get_final_message()
    assert Message.model_validate(final.model_dump()) == expected
    plain = sdk_client(lambda: (200, message_bytes(stream), "application/json"))
    assert plain.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]) == expected


def stream_bytes() -> bytes:
    out = MessageStream("gpt-oss-120b", "msg_1", mark, True)
    return out.start(50) + out.ping() + out.apply(turn()) + out.finish()


def test_the_sdk_raises_an_error_event() -> None:
    out = MessageStream("m", "msg_4", mark, True)
    failed = out.start() + out.apply(text(0, "partial")) + out.error(BusError(code=ErrorCode.TIMEOUT, message="slow"))
    client = sdk_client(lambda: (200, failed, "text/event-stream"))
    with (
        pytest.raises(anthropic.APIStatusError, match="timeout_error"),
        client.messages.stream(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]) as s,
    ):
        s.get_final_message()
