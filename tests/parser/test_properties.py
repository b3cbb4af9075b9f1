"""Property tests: whatever tokens the engine sends, the parser never raises, streaming in any
chunking agrees with one batch, no control-token text reaches an output field, and the text the
model wrote inside messages is not lost.

What is asserted precisely:
- never raises, chunking-invariance, no ``<|`` in outputs and the event contract (each item's
  streamed text, arguments included, is exactly its done text) hold for ANY special token
  spliced anywhere, for every truncation point and for arbitrary token soup;
- text preservation: every character of the messages' content survives, in order, when the spliced tokens are
  ones that end or break a message (<|end|>, <|return|>, <|call|>, <|endoftext|>, <|message|>,
  <|constrain|>, reserved specials). Splicing <|start|> or <|channel|> makes the following words
  a message *header* by Harmony's own grammar, where the recipient/channel words are consumed;
  that case is covered by the first three properties only."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.messages.generate import EngineFinishReason
from contracts.messages.items import FunctionCallItem, MessageItem, ReasoningItem
from contracts.messages.parse import Finished, ItemDone, ParseEvent
from services.common.harmony import CALL, CHANNEL, CONSTRAIN, END, ENDOFTEXT, MESSAGE, RETURN, START, harmony_encoding
from services.parser.session import ParseSession
from tests.parser.test_corpus import check_stream

ENC = harmony_encoding()
WORDS = st.sampled_from(["alpha", "beta", "gamma", "delta", "Grüße", "東京", "👋", "x=1", "{", "}", "?", "end"])
TEXT = st.lists(WORDS, min_size=1, max_size=12).map(" ".join)
BREAKING = [END, RETURN, CALL, ENDOFTEXT, MESSAGE, CONSTRAIN, 200013, 200017]
ANY_SPECIAL = [*BREAKING, START, CHANNEL]


@st.composite
def outputs(draw: st.DrawFn) -> tuple[str, list[str]]:
    reasoning: str = draw(TEXT)
    answer: str = draw(TEXT)
    with_call = draw(st.booleans())
    text = f"<|channel|>analysis<|message|>{reasoning}<|end|>"
    if with_call:
        text += '<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"q": "v"}<|call|>'
    else:
        text += f"<|start|>assistant<|channel|>final<|message|>{answer}<|return|>"
    return text, [reasoning] + ([] if with_call else [answer])


def parse(ids: list[int], chunks: list[int] | None = None, finish: EngineFinishReason = "stop") -> list[ParseEvent]:
    s = ParseSession(ENC, "prop", ["f"])
    events: list[ParseEvent] = []
    if chunks:
        i = 0
        for n in chunks:
            events += s.feed(ids[i : i + n])
            i += n
        events += s.feed(ids[i:])
    else:
        events += s.feed(ids)
    return events + s.finish(finish)


def fields(events: list[ParseEvent]) -> list[str]:
    out: list[str] = []
    for e in events:
        if isinstance(e, ItemDone):
            item = e.item
            if isinstance(item, ReasoningItem):
                out.append(item.text)
            elif isinstance(item, MessageItem):
                out.append(item.content)
            elif isinstance(item, FunctionCallItem):
                out += [item.name, item.arguments]
        else:
            for attr in ("delta",):
                if hasattr(e, attr):
                    out.append(getattr(e, attr))
    return out


def done_items(events: list[ParseEvent]) -> list[dict[str, Any]]:
    return [e.item.model_dump() for e in events if isinstance(e, ItemDone)] + [events[-1].model_dump()]


SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(outputs(), st.data())
def test_spliced_specials_never_break_or_leak(out: tuple[str, list[str]], data: st.DataObject) -> None:
    text, _ = out
    ids = ENC.encode(text, allowed_special="all")
    for _ in range(data.draw(st.integers(1, 3))):
        pos = data.draw(st.integers(0, len(ids)))
        ids.insert(pos, data.draw(st.sampled_from(ANY_SPECIAL)))
    whole = parse(ids)
    chunks = data.draw(st.lists(st.integers(1, 6), max_size=len(ids)))
    chunked = parse(ids, chunks)
    assert done_items(chunked) == done_items(whole)
    assert all("<|" not in f for f in fields(whole))
    check_stream(whole)
    check_stream(chunked)


@SETTINGS
@given(outputs(), st.data())
def test_every_truncation_point(out: tuple[str, list[str]], data: st.DataObject) -> None:
    text, _ = out
    ids = ENC.encode(text, allowed_special="all")
    cut = data.draw(st.integers(0, len(ids)))
    events = parse(ids[:cut], finish="length")
    check_stream(events)
    assert isinstance(events[-1], Finished) and events[-1].finish_reason in ("length", "tool_calls")
    assert all("<|" not in f for f in fields(events))
    assert [e.output_index for e in events if e.type == "item_added"] == [
        e.output_index for e in events if e.type == "item_done"
    ]


@SETTINGS
@given(outputs(), st.data())
def test_message_text_survives_breaking_tokens(out: tuple[str, list[str]], data: st.DataObject) -> None:
    text, pieces = out
    ids = ENC.encode(text, allowed_special="all")
    for _ in range(data.draw(st.integers(1, 3))):
        pos = data.draw(st.integers(0, len(ids)))
        ids.insert(pos, data.draw(st.sampled_from(BREAKING)))
    done = [f for e in parse(ids) if isinstance(e, ItemDone) for f in fields([e])]
    have = iter("".join("".join(done).split()))
    # ASCII characters are compared: a token spliced between the bytes of a multi-byte
    # character cuts that character in two, and no parser can put it back together
    want = "".join(ch for ch in "".join("".join(pieces).split()) if ch.isascii())
    # every character of the messages' text, in order (a token spliced mid-word splits the word
    # across two items but loses nothing)
    assert all(ch in have for ch in want), (pieces, done)


@SETTINGS
@given(st.lists(st.integers(0, 200_018), max_size=60), st.sampled_from(["stop", "length", "abort"]))
def test_arbitrary_token_soup(ids: list[int], finish: EngineFinishReason) -> None:
    events = parse(ids, finish=finish)
    check_stream(events)
    assert events[-1].type == "finished"
    assert all("<|" not in f for f in fields(events))


def test_the_stop_string_matched_is_named_when_it_ended_the_answer() -> None:
    answer = ENC.encode("<|channel|>final<|message|>one two END", allowed_special="all")
    session = ParseSession(ENC, "r1")
    session.feed(answer)
    [*_, finished] = session.finish("stop", stop_text="END")
    assert isinstance(finished, Finished) and (finished.finish_reason, finished.stop_sequence) == ("stop", "END")
    call = ENC.encode('<|channel|>commentary to=functions.f<|message|>{"a": 1}', allowed_special="all")
    session = ParseSession(ENC, "r2", ["f"])
    session.feed([*call, CALL])
    [*_, finished] = session.finish("stop")
    assert isinstance(finished, Finished) and (finished.finish_reason, finished.stop_sequence) == ("tool_calls", None)
