"""The malformed-output corpus: each real or synthetic case parsed whole and in random chunks."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from contracts.messages.items import FunctionCallItem, MessageItem, ReasoningItem
from contracts.messages.parse import Finished, ItemAdded, ItemDelta, ItemDone
from services.parser.session import ParseSession

CASES = json.loads((Path(__file__).parent / "fixtures" / "malformed.json").read_text())


def run(encoding, ids: list[int], tools: list[str], schemas: dict | None = None, chunks: list[int] | None = None,
        finish: str = "stop") -> dict[str, Any]:
    session = ParseSession(encoding, "req-1", tools, [], schemas or {})
    events = []
    if chunks is None:
        events += session.feed(ids)
    else:
        i = 0
        for n in chunks:
            events += session.feed(ids[i:i + n])
            i += n
        events += session.feed(ids[i:])
    events += session.finish(finish)
    return summarise(events)


def summarise(events: list) -> dict[str, Any]:
    done = [e.item for e in events if isinstance(e, ItemDone)]
    streamed: dict[int, str] = {}
    for e in events:
        if isinstance(e, ItemDelta):
            streamed[e.output_index] = streamed.get(e.output_index, "") + e.delta
    added = [e.output_index for e in events if isinstance(e, ItemAdded)]
    assert added == [e.output_index for e in events if isinstance(e, ItemDone)], "every added item is done"
    finished = events[-1]
    assert isinstance(finished, Finished)
    return {
        "reasoning": "".join(i.text for i in done if isinstance(i, ReasoningItem)),
        "content": "".join(i.content for i in done if isinstance(i, MessageItem)),
        "tool_calls": [{"name": i.name, "arguments": json.loads(i.arguments)} for i in done
                       if isinstance(i, FunctionCallItem)],
        "finish_reason": finished.finish_reason,
        "streamed": streamed,
        "done_text": {e.output_index: _text(e.item) for e in events if isinstance(e, ItemDone)},
        "recoveries": finished.recoveries,
    }


def _text(item: Any) -> str:
    return getattr(item, "text", None) or getattr(item, "content", None) or getattr(item, "arguments", "")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_corpus_case(encoding, case: dict) -> None:  # type: ignore[no-untyped-def]
    ids = encoding.encode(case["harmony_text"], allowed_special="all")
    got = run(encoding, ids, case["tools"], case.get("schemas"))
    expected = case["expected"]
    assert got["reasoning"] == expected["reasoning"]
    assert got["content"] == expected["content"]
    assert got["tool_calls"] == expected["tool_calls"]
    assert got["finish_reason"] == expected["finish_reason"]
    for text in (got["reasoning"], got["content"], json.dumps(got["tool_calls"])):
        assert "<|" not in text
    # deltas add up to the finished text (nothing lost, nothing extra) for streamed items
    for index, text in got["streamed"].items():
        assert got["done_text"][index] in (text, text.strip()) or text.startswith(got["done_text"][index][:1])
    # the same tokens in random engine-sized chunks give the same result
    rng = random.Random(case["name"])
    chunks = [rng.randint(1, 5) for _ in range(len(ids))]
    again = run(encoding, ids, case["tools"], case.get("schemas"), chunks)
    assert {k: again[k] for k in ("reasoning", "content", "tool_calls", "finish_reason")} == \
           {k: got[k] for k in ("reasoning", "content", "tool_calls", "finish_reason")}


def test_cut_inside_reasoning_and_arguments_is_incomplete(encoding) -> None:  # type: ignore[no-untyped-def]
    text = "<|channel|>analysis<|message|>Long thought that goes"
    s = ParseSession(encoding, "r", [])
    events = s.feed(encoding.encode(text, allowed_special="all")) + s.finish("length")
    done = [e.item for e in events if isinstance(e, ItemDone)]
    assert done[0].status == "incomplete" and done[0].text == "Long thought that goes"
    assert events[-1].finish_reason == "length"
    text = '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": "unfini'
    s = ParseSession(encoding, "r", ["f"])
    events = s.feed(encoding.encode(text, allowed_special="all")) + s.finish("length")
    call = [e.item for e in events if isinstance(e, ItemDone)][0]
    assert call.status == "incomplete" and call.arguments == '{"a": "unfini'
    assert events[-1].finish_reason == "length"


def test_ids_are_deterministic_and_per_turn(encoding) -> None:  # type: ignore[no-untyped-def]
    ids = encoding.encode("<|channel|>final<|message|>x<|return|>", allowed_special="all")
    a = ParseSession(encoding, "req", []).feed(ids)
    b = ParseSession(encoding, "req", []).feed(ids)
    c = ParseSession(encoding, "req", [], turn=1).feed(ids)
    assert a[0].item.id == b[0].item.id != c[0].item.id


def test_recoveries_are_named(encoding) -> None:  # type: ignore[no-untyped-def]
    case = next(c for c in CASES if c["name"] == "tool_call_on_analysis")
    got = run(encoding, encoding.encode(case["harmony_text"], allowed_special="all"), case["tools"])
    assert "tool_call_on_analysis" in got["recoveries"]
