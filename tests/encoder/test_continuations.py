"""A continued prompt (``EncodeRequest.continues``: only the items after a remembered prompt)
renders to exactly the tokens of the whole conversation, and the encoder refuses a
continuation only where the remembered part would render differently (``unusable``).

Properties over random conversations (messages, reasoning, calls and their outputs, final
answers, developer items) cut at a random point; then the encoder's own path, inline and in a
render process; then over the bus (tests/gateway/test_continued_prompts.py and the WebSocket
e2e tests drive it from the gateway)."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai_harmony import HarmonyEncoding

from contracts.errors import ErrorCode
from contracts.messages.encode import EncodeRequest, FunctionTool, PromptContinuation
from contracts.messages.generate import GenerateJob, ParseSpec, Route
from contracts.messages.items import (
    CompactionItem,
    ConversationItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    ReasoningItem,
)
from contracts.subjects import Subjects
from services.common.bus import Bus
from services.common.wire import Wire
from services.encoder.continuations import PromptMemory, Remembered, continued, final_end, redone, remembered, unusable
from services.encoder.render import RenderError, prefix_tokens
from services.encoder.renderer import Renderer
from services.encoder.service import Encoder
from services.encoder.settings import Settings

TODAY = dt.date.today()  # the encoder renders with its own clock
WEATHER = FunctionTool(name="get_weather", description="Weather", parameters={"type": "object"})
_TEXT = st.sampled_from(["", "hi", "sunny <|end|> 21C", "a" * 500, "👍🏽 café\n\nline", '{"city": "Oslo"}'])


def _turn(n: int, text: str, kind: str) -> list[ConversationItem]:
    """One piece of a conversation: a user message, an answer, a tool call with its output..."""
    if kind == "user":
        return [MessageItem(role="user", content=f"{text} {n}")]
    if kind == "final":
        return [ReasoningItem(text=f"think {n}"), MessageItem(role="assistant", content=f"{text} {n}")]
    if kind == "call":
        return [
            ReasoningItem(text=f"look it up {n}"),
            FunctionCallItem(call_id=f"c{n}", name="get_weather", arguments='{"city": "Oslo"}'),
            FunctionCallOutputItem(call_id=f"c{n}", output=f"{text} {n}"),
        ]
    if kind == "commentary":
        return [MessageItem(role="assistant", channel="commentary", content=f"{text} {n}")]
    if kind == "developer":
        return [MessageItem(role="developer", content=f"{text} {n}")]
    return [CompactionItem(summary=f"so far {n}")]


_KIND = st.sampled_from(["user", "user", "final", "call", "call", "commentary", "developer", "compaction"])


def _conversation(pieces: list[tuple[str, str]]) -> list[ConversationItem]:
    return [item for n, (text, kind) in enumerate(pieces) for item in _turn(n, text, kind)]


def _request(items: list[ConversationItem], **fields: object) -> EncodeRequest:
    return EncodeRequest(model="m", items=items, tools=[WEATHER], instructions="Be brief.", **fields)  # type: ignore[arg-type]


def _continue(renderer: Renderer, base: Remembered, req: EncodeRequest) -> tuple[list[int], Remembered]:
    """What the encoder's continuation path assembles (``Encoder._continue``), inline."""
    prefix = renderer.prefix(req, TODAY, None, items=base.prefix_items)
    kept, redo = redone(base, req.items)
    recipients = dict(base.recipients)
    tail = renderer.tail(redo, recipients, 10**9)
    tokens = [*prefix, *base.body[:kept], *tail, *renderer.assistant]
    return tokens, continued(base, req.items, kept, redo, tail, recipients)


@pytest.fixture(scope="module")
def renderer(encoding: HarmonyEncoding) -> Renderer:
    return Renderer(encoding)


@settings(max_examples=200, deadline=None)
@given(
    pieces=st.lists(st.tuples(_TEXT, _KIND), min_size=2, max_size=9),
    cuts=st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=3),
)
def test_a_continuation_renders_the_whole_conversation(
    renderer: Renderer, pieces: list[tuple[str, str]], cuts: list[int]
) -> None:
    items = _conversation(pieces)
    whole = renderer.render(_request(items), TODAY).token_ids
    points = sorted({min(c, len(items) - 1) for c in cuts})
    first = _request(items[: points[0]])
    base = remembered(first, renderer.render(first, TODAY), len(renderer.assistant))
    for start, end in zip(points, [*points[1:], len(items)], strict=True):
        req = _request(items[start:end], continues=PromptContinuation(key="k", length=start))
        why = unusable(base, req.continues, req)  # type: ignore[arg-type]
        tail = items[start:end]
        if why is not None:  # only where the developer message would change
            assert any(isinstance(i, CompactionItem) or getattr(i, "role", "") == "developer" for i in tail), why
            return
        tokens, base = _continue(renderer, base, req)
        assert tokens == renderer.render(_request(items[:end]), TODAY).token_ids
    assert base.length == len(items) and list(base.body) == whole[len(whole) - len(base.body) - 2 : -2]


def test_a_tool_loop_and_a_chat_always_continue(renderer: Renderer) -> None:
    """What a WebSocket chain sends turn after turn is never refused: calls and their outputs,
    then questions answered (a final answer after a tool loop drops the loop's reasoning: the
    loop's items are rendered again, what came before them is kept)."""
    items = _conversation([("hi", "user"), ("x", "call"), ("y", "call")])
    base = remembered(_request(items), renderer.render(_request(items), TODAY), len(renderer.assistant))
    for n, kind in enumerate(["call", "user", "final", "user", "call", "final", "user"], start=3):
        tail = _turn(n, "t", kind)
        req = _request(tail, continues=PromptContinuation(key="k", length=len(items)))
        assert unusable(base, req.continues, req) is None  # type: ignore[arg-type]
        tokens, base = _continue(renderer, base, req)
        items += tail
        assert tokens == renderer.render(_request(items), TODAY).token_ids


def test_what_cannot_continue(renderer: Renderer) -> None:
    items = _conversation([("hi", "user"), ("x", "call")])
    base = remembered(_request(items), renderer.render(_request(items), TODAY), len(renderer.assistant))
    ref = PromptContinuation(key="k", length=len(items))
    cases = {
        "remember": (None, _request(_turn(9, "q", "user"), continues=ref)),
        "items": (base, _request(_turn(9, "q", "user"), continues=PromptContinuation(key="k", length=1))),
        "truncat": (base, _request(_turn(9, "q", "user"), continues=ref, truncation="auto")),
        "developer": (base, _request(_turn(9, "q", "developer"), continues=ref)),
        "compaction": (base, _request(_turn(9, "q", "compaction"), continues=ref)),
    }
    for words, (given_base, req) in cases.items():
        why = unusable(given_base, ref if words != "items" else req.continues, req)  # type: ignore[arg-type]
        assert why is not None and words in why, (words, why)


def test_a_final_answers_end_is_found_in_the_tokens(encoding: HarmonyEncoding, renderer: Renderer) -> None:
    from array import array

    assert encoding.encode("final", disallowed_special=()) == [17196]  # harmony.FINAL
    items = [
        *_turn(0, "<|channel|>final<|message|>", "user"),
        *_turn(1, "done <|end|>", "final"),
        *_turn(2, "x", "call"),
    ]
    body = array("I", renderer.render(_request(items), TODAY).token_ids)
    end = final_end(body)
    assert end is not None and body[end - 1] == 200007
    assert encoding.decode(list(body[:end])).endswith("done <|end|> 1<|end|>")
    assert final_end(array("I", renderer.render(_request(items[:1]), TODAY).token_ids)) is None


def test_the_memory_keeps_the_most_recent_within_its_budget(renderer: Renderer) -> None:
    items = _conversation([("a" * 500, "user")])
    one = remembered(_request(items), renderer.render(_request(items), TODAY), len(renderer.assistant))
    memory = PromptMemory(budget=3 * len(one.body))  # three of them
    for key in ("a", "b", "c", "d", "e"):
        memory.put(key, one)
        assert memory.tokens <= memory.budget
    assert memory.get("a") is None and memory.get("e") is one
    memory.get("c")  # used: kept over d
    memory.put("f", one)
    assert memory.get("c") is one and memory.get("d") is None


def _job(gid: str, encode: EncodeRequest) -> GenerateJob:
    return GenerateJob(
        generation_id=gid,
        encode=encode,
        parse=ParseSpec(request_id=gid),
        route=Route(gateway="g", parser="p"),
        deadline=time.time() + 30,
    )


@pytest.mark.parametrize("pooled", [False, True])
async def test_the_encoder_continues_what_it_remembered(renderer: Renderer, pooled: bool) -> None:
    unused = Bus(Wire(["nats://127.0.0.1:1"]), Subjects("unit"))  # never connected: nothing is published
    encoder = Encoder(Settings(render_processes=1 if pooled else 0, inline_render_chars=10), bus=unused)
    encoder.start_pool()
    try:
        items = _conversation([("hi", "user"), ("x", "call")])
        await encoder.render(_job("r1", _request(items, remember=True)), pooled=False)
        tail = _turn(5, "more", "call") + _turn(6, "and", "user")
        ref = PromptContinuation(key="r1", length=len(items))
        prompt = await encoder.render(_job("r2", _request(tail, continues=ref, remember=True)), pooled=pooled)
        assert prompt.token_ids == renderer.render(_request(items + tail), TODAY).token_ids
        assert prompt.selection_text == "and 6"
        again = PromptContinuation(key="r2", length=len(items) + len(tail))
        prompt = await encoder.render(_job("r3", _request(_turn(7, "z", "final"), continues=again)), pooled=pooled)
        assert prompt.token_ids == renderer.render(_request(items + tail + _turn(7, "z", "final")), TODAY).token_ids
        with pytest.raises(RenderError) as unknown:
            await encoder.render(_job("r4", _request(tail, continues=PromptContinuation(key="r9", length=3))), False)
        assert unknown.value.error.code == ErrorCode.CONTINUATION_UNKNOWN and unknown.value.error.retryable
    finally:
        encoder.close()


def test_a_chains_turns_render_their_system_and_developer_messages_once(
    encoding: HarmonyEncoding, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each turn of a chain names a new turn to continue from; its instructions and tools are
    the same, and so is their rendering: done once, not once a turn."""
    rendered: list[EncodeRequest] = []

    def counted(req: EncodeRequest, *args: object) -> list[int]:
        rendered.append(req)
        return prefix_tokens(req, *args)  # type: ignore[arg-type]

    monkeypatch.setattr("services.encoder.renderer.prefix_tokens", counted)
    fresh = Renderer(encoding)
    items = _conversation([("hi", "user"), ("x", "call")])
    base = remembered(_request(items), fresh.render(_request(items, remember=True), TODAY), len(fresh.assistant))
    for n in range(3, 7):
        req = _request(
            _turn(n, "t", "call"), continues=PromptContinuation(key=f"r{n}", length=len(items)), remember=True
        )
        _, base = _continue(fresh, base, req)
        items += req.items
    assert len(rendered) == 1
