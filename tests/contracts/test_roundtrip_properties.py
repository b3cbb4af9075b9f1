"""Round trips of generated messages: token-id lists, offsets, and any (surrogate-free) text the
model or a client can produce, through the JSON the bus carries and the adapters services use."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from contracts.errors import BusError, ErrorCode
from contracts.messages.control import Cancel, Heartbeat
from contracts.messages.encode import EncodeRequest
from contracts.messages.generate import (
    EngineUsage,
    EventFrame,
    GenerateRequest,
    GenerationFailed,
    ParsedBatch,
    ParseSpec,
    Route,
    TokenBatch,
    TokenFrame,
)
from contracts.messages.items import ConversationItem, FunctionCallItem, MessageItem, ReasoningItem
from contracts.messages.parse import Finished, ItemAdded, ItemDelta, ItemDone, Usage
from contracts.messages.tools import CallToolRequest, McpServer

TEXT = st.text(st.characters(codec="utf-8"))  # any code point but lone surrogates
IDS = st.text(st.characters(codec="utf-8"), min_size=1, max_size=24)
TOKEN = st.integers(min_value=0, max_value=2**32 - 1)
TOKENS = st.lists(TOKEN, max_size=64)
OFFSET = st.integers(min_value=0, max_value=2**53)
SECONDS = st.floats(min_value=0, max_value=1e10, allow_nan=False, allow_infinity=False)
TRACE = st.dictionaries(IDS, TEXT, max_size=3)

spec = st.builds(
    ParseSpec,
    request_id=IDS,
    turn=st.integers(0, 1000),
    tool_names=st.lists(IDS, max_size=3),
    tool_schemas=st.dictionaries(IDS, st.fixed_dictionaries({"description": TEXT}), max_size=2),
)
errors = st.builds(
    BusError, code=st.sampled_from(list(ErrorCode)), message=TEXT, param=st.none() | TEXT, retryable=st.booleans()
)
batches = st.builds(
    TokenBatch,
    generation_id=IDS,
    offset=OFFSET,
    token_ids=TOKENS,
    open=st.none() | spec,
    gateway=IDS,
    trace=TRACE,
    done=st.booleans(),
    finish_reason=st.none() | st.sampled_from(["stop", "length", "abort", "error"]),
    stop_token_id=st.none() | TOKEN,
    usage=st.none()
    | st.builds(EngineUsage, prompt_tokens=OFFSET, completion_tokens=OFFSET, cached_tokens=st.none() | OFFSET),
    error=st.none() | errors,
)
output_items = st.one_of(
    st.builds(
        MessageItem,
        role=st.sampled_from(["system", "developer", "user", "assistant"]),
        content=TEXT,
        id=st.none() | IDS,
        channel=st.none() | TEXT,
    ),
    st.builds(ReasoningItem, text=TEXT, id=st.none() | IDS),
    st.builds(FunctionCallItem, call_id=IDS, name=IDS, arguments=TEXT, namespace=IDS),
)
events = st.one_of(
    st.builds(ItemAdded, output_index=OFFSET, item=output_items),
    st.builds(ItemDelta, output_index=OFFSET, delta=TEXT),
    st.builds(ItemDone, output_index=OFFSET, item=output_items),
    st.builds(
        Finished,
        finish_reason=st.sampled_from(["stop", "length", "tool_calls", "abort"]),
        usage=st.builds(Usage, reasoning_tokens=OFFSET),
        recoveries=st.lists(TEXT, max_size=2),
    ),
)
parsed = st.builds(
    ParsedBatch, generation_id=IDS, offset=OFFSET, token_ids=TOKENS, events=st.lists(events, max_size=6), parser=IDS
)

FRAME: TypeAdapter[TokenFrame] = TypeAdapter(TokenFrame)  # as services/parser/app.py decodes
EVENTS: TypeAdapter[EventFrame] = TypeAdapter(EventFrame)  # as services/gateway/generation.py decodes
ITEMS: TypeAdapter[list[ConversationItem]] = TypeAdapter(list[ConversationItem])  # as the response store does


@settings(deadline=None)
@given(st.lists(batches, min_size=1, max_size=4))
def test_token_frames_round_trip(items: list[TokenBatch]) -> None:
    frame = TokenFrame(batches=items)
    decoded = FRAME.validate_json(frame.model_dump_json())
    assert decoded == frame
    assert [b.token_ids for b in decoded.batches] == [b.token_ids for b in items]
    assert [b.offset for b in decoded.batches] == [b.offset for b in items]


@settings(deadline=None)
@given(
    st.lists(
        parsed | st.builds(GenerationFailed, generation_id=IDS, stage=st.just("parser"), error=errors),
        min_size=1,
        max_size=3,
    )
)
def test_event_frames_round_trip(items: list[Any]) -> None:
    frame = EventFrame(events=items)
    decoded = EVENTS.validate_json(frame.model_dump_json())
    assert decoded == frame
    assert [type(e) for e in decoded.events] == [type(e) for e in items]
    for before, after in zip(items, decoded.events, strict=True):
        if isinstance(before, ParsedBatch):
            assert isinstance(after, ParsedBatch)
            assert [type(e) for e in after.events] == [type(e) for e in before.events]
            deltas = ["".join(e.delta for e in b.events if isinstance(e, ItemDelta)) for b in (before, after)]
            assert deltas[0] == deltas[1]  # the text a client streams is unchanged, byte for byte


@settings(deadline=None)
@given(
    generation_id=IDS,
    model=IDS,
    prompt=TOKENS,
    stops=TOKENS,
    resume=TOKENS,
    selection=TEXT,
    deadline=SECONDS,
    render_ms=SECONDS,
    trace=TRACE,
    parse=spec,
)
def test_generate_requests_round_trip(
    generation_id: str,
    model: str,
    prompt: list[int],
    stops: list[int],
    resume: list[int],
    selection: str,
    deadline: float,
    render_ms: float,
    trace: dict[str, str],
    parse: ParseSpec,
) -> None:
    request = GenerateRequest(
        generation_id=generation_id,
        model=model,
        prompt_token_ids=prompt,
        stop_token_ids=stops,
        resume_tokens=resume,
        selection_text=selection,
        parse=parse,
        route=Route(gateway="g", parser="p"),
        deadline=deadline,
        render_ms=render_ms,
        trace=trace,
    )
    decoded = GenerateRequest.model_validate_json(request.model_dump_json())
    assert decoded == request
    assert decoded.prompt_token_ids == prompt and decoded.resume_tokens == resume and decoded.deadline == deadline


@settings(deadline=None)
@given(st.lists(output_items, max_size=6), TEXT)
def test_conversations_round_trip(items: list[Any], instructions: str) -> None:
    request = EncodeRequest(model="m", items=items, instructions=instructions)
    assert EncodeRequest.model_validate_json(request.model_dump_json()) == request
    stored = ITEMS.dump_json(items)
    assert ITEMS.validate_json(stored) == items


@settings(deadline=None)
@given(IDS, TEXT, st.dictionaries(IDS, TEXT, max_size=3), TEXT, st.floats(0.001, 3600))
def test_tool_calls_round_trip(label: str, url: str, headers: dict[str, str], arguments: str, timeout: float) -> None:
    call = CallToolRequest(
        request_id="r",
        server=McpServer(server_label=label, server_url=url, headers=headers),
        name="t",
        arguments=arguments,
        timeout_s=timeout,
    )
    decoded = CallToolRequest.model_validate_json(call.model_dump_json())
    assert decoded == call
    assert decoded.arguments == arguments  # the model's JSON text, not re-encoded


@given(IDS, TEXT, IDS, SECONDS, OFFSET)
def test_control_messages_round_trip(
    generation_id: str, reason: str, instance: str, interval: float, load: int
) -> None:
    cancel = Cancel(generation_id=generation_id, reason=reason)
    assert Cancel.model_validate_json(cancel.model_dump_json()) == cancel
    beat = Heartbeat(service="parser", instance=instance, interval_s=interval, detail=reason, load=load)
    assert Heartbeat.model_validate_json(beat.model_dump_json()) == beat
