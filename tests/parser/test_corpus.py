"""The malformed-output corpus (fixtures/malformed.json): each case, real (its issue cited in
``source``) or synthetic, parsed as token ids in one batch, one token per batch, in random
engine-sized chunks and in the chunks the fixture names; all must give the expected result and
the same events.

A fixture's ``harmony_text`` is the raw model output; its token ids are
``encoding.encode(text, allowed_special="all")`` except the parts written ``⟦…⟧``, which are
encoded as ordinary text (control-token *text* the model spelled out), or ``token_ids`` given
verbatim when no text encodes them (invalid UTF-8). ``engine_finish`` is the engine's finish
reason (default "stop")."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding

from contracts.messages.generate import EngineFinishReason
from contracts.messages.items import FunctionCallItem, MessageItem, ReasoningItem
from contracts.messages.parse import Finished, ItemAdded, ItemDelta, ItemDone, ParseEvent
from services.parser.session import ParseSession

CASES: list[dict[str, Any]] = json.loads((Path(__file__).parent / "fixtures" / "malformed.json").read_text())
PLAIN = re.compile(r"⟦(.*?)⟧")


def token_ids(encoding: HarmonyEncoding, case: dict[str, Any]) -> list[int]:
    if "token_ids" in case:
        return list(case["token_ids"])
    text: str = case["harmony_text"]
    ids: list[int] = []
    pos = 0
    for m in PLAIN.finditer(text):
        ids += encoding.encode(text[pos : m.start()], allowed_special="all")
        ids += encoding.encode(m.group(1), disallowed_special=())
        pos = m.end()
    ids += encoding.encode(text[pos:], allowed_special="all")
    return ids


def run(
    encoding: HarmonyEncoding,
    ids: list[int],
    tools: list[str],
    schemas: dict[str, Any] | None = None,
    chunks: list[int] | None = None,
    finish: EngineFinishReason = "stop",
) -> list[ParseEvent]:
    session = ParseSession(encoding, "req-1", tools, [], schemas or {})
    events: list[ParseEvent] = []
    i = 0
    for n in chunks or []:
        events += session.feed(ids[i : i + n])
        i += n
    events += session.feed(ids[i:])
    return events + session.finish(finish)


def _args(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # kept verbatim when not JSON


def summarise(events: list[ParseEvent]) -> dict[str, Any]:
    done = [e.item for e in events if isinstance(e, ItemDone)]
    finished = events[-1]
    assert isinstance(finished, Finished)
    return {
        "reasoning": "".join(i.text for i in done if isinstance(i, ReasoningItem)),
        "content": "".join(i.content for i in done if isinstance(i, MessageItem)),
        "tool_calls": [
            {"name": i.name, "arguments": _args(i.arguments)} for i in done if isinstance(i, FunctionCallItem)
        ],
        "finish_reason": finished.finish_reason,
        "recoveries": finished.recoveries,
    }


def shape(events: list[ParseEvent]) -> list[tuple[str, int | None, str]]:
    """The events with each item's deltas merged: what must not depend on batching."""
    out: list[tuple[str, int | None, str]] = []
    for e in events:
        if isinstance(e, ItemDelta) and out and out[-1][0] == "delta" and out[-1][1] == e.output_index:
            out[-1] = ("delta", e.output_index, out[-1][2] + e.delta)
        elif isinstance(e, ItemDelta):
            out.append(("delta", e.output_index, e.delta))
        else:
            out.append((e.type, getattr(e, "output_index", None), e.model_dump_json()))
    return out


def check_stream(events: list[ParseEvent]) -> None:
    """The event contract the gateway relies on: ItemAdded first, deltas only for an open item,
    ItemDone once, Finished/Failed last; the streamed text is exactly the done text, for
    arguments too (repaired ones included: Chat clients build them from the deltas)."""
    assert events and events[-1].type in ("finished", "failed")
    assert all(e.type not in ("finished", "failed") for e in events[:-1])
    opened: dict[int, str] = {}
    closed: set[int] = set()
    for e in events[:-1]:
        if isinstance(e, ItemAdded):
            assert e.output_index not in opened and e.output_index not in closed
            opened[e.output_index] = ""
        elif isinstance(e, ItemDelta):
            assert e.output_index in opened and e.delta
            opened[e.output_index] += e.delta
        else:
            assert isinstance(e, ItemDone) and e.output_index in opened
            streamed, item = opened.pop(e.output_index), e.item
            closed.add(e.output_index)
            if isinstance(item, ReasoningItem):
                assert item.text == streamed
            elif isinstance(item, MessageItem):
                assert item.content == streamed
            else:
                assert isinstance(item, FunctionCallItem) and item.arguments == streamed
    assert not opened, "every added item is done"
    assert sorted(closed) == list(range(len(closed))), "output indexes are 0..n-1"


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_corpus_case(encoding: HarmonyEncoding, case: dict[str, Any]) -> None:
    ids = token_ids(encoding, case)
    assert encoding.decode(ids) == PLAIN.sub(r"\1", case["harmony_text"]), "text and token ids agree"
    finish = case.get("engine_finish", "stop")
    whole = run(encoding, ids, case["tools"], case.get("schemas"), finish=finish)
    got = summarise(whole)
    assert {k: got[k] for k in case["expected"]} == case["expected"], got["recoveries"]
    check_stream(whole)
    for e in whole:
        text = e.model_dump_json()
        assert "<|" not in text, text
    # the same tokens one per batch, in random engine-sized chunks, and in the fixture's chunks
    rng = random.Random(case["name"])
    for chunks in ([1] * len(ids), [rng.randint(1, 6) for _ in range(len(ids))], case.get("chunks")):
        if chunks is None:
            continue
        again = run(encoding, ids, case["tools"], case.get("schemas"), chunks, finish=finish)
        check_stream(again)
        assert shape(again) == shape(whole)


def test_corpus_is_broad() -> None:
    """30+ cases, a third or more taken from real reports, every one with a source."""
    real = [c for c in CASES if "https://github.com/" in c["source"]]
    assert len(CASES) >= 30 and len(real) >= len(CASES) // 3
    assert len({c["name"] for c in CASES}) == len(CASES)


def test_split_characters_stream_whole(encoding: HarmonyEncoding) -> None:
    """Emoji and CJK split across tokens come out whole in every delta, one token per batch."""
    text = "Grüße 👋🏽 東京 🦩 𝕏 鑫龘 🧑‍🚀 — ok"
    ids = encoding.encode(f"<|channel|>final<|message|>{text}<|return|>", allowed_special="all")
    assert any("\ufffd" in encoding.decode([t]) for t in ids), "some token holds part of a character"
    s = ParseSession(encoding, "r", [])
    deltas = [e.delta for t in ids for e in s.feed([t]) if isinstance(e, ItemDelta)]
    assert "".join(deltas) == text and not any("\ufffd" in d for d in deltas)


def test_cut_inside_reasoning_and_arguments_is_incomplete(encoding: HarmonyEncoding) -> None:
    text = "<|channel|>analysis<|message|>Long thought that goes"
    s = ParseSession(encoding, "r", [])
    events = s.feed(encoding.encode(text, allowed_special="all")) + s.finish("length")
    done = [e.item for e in events if isinstance(e, ItemDone)]
    assert isinstance(done[0], ReasoningItem)
    assert done[0].status == "incomplete" and done[0].text == "Long thought that goes"
    assert isinstance(events[-1], Finished) and events[-1].finish_reason == "length"
    text = '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": "unfini'
    s = ParseSession(encoding, "r", ["f"])
    events = s.feed(encoding.encode(text, allowed_special="all")) + s.finish("length")
    call = [e.item for e in events if isinstance(e, ItemDone)][0]
    assert isinstance(call, FunctionCallItem)
    assert call.status == "incomplete" and call.arguments == '{"a": "unfini'
    assert isinstance(events[-1], Finished) and events[-1].finish_reason == "length"


def test_ids_are_deterministic_and_per_turn(encoding: HarmonyEncoding) -> None:
    ids = encoding.encode("<|channel|>final<|message|>x<|return|>", allowed_special="all")

    def first_id(session: ParseSession) -> str | None:
        added = session.feed(ids)[0]
        assert isinstance(added, ItemAdded)
        return added.item.id

    a = first_id(ParseSession(encoding, "req", []))
    b = first_id(ParseSession(encoding, "req", []))
    c = first_id(ParseSession(encoding, "req", [], turn=1))
    d = first_id(ParseSession(encoding, "other", []))
    assert a == b != c != d


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("tool_call_on_analysis", "tool_call_on_analysis"),
        ("bare_recipient", "bare_recipient"),
        ("hyphenated_tool_name", "tool_name_normalised"),
        ("glued_json_after_tool_name", "tool_name_normalised"),
        ("json_call_in_final", "json_tool_call"),
        ("doubly_nested_call", "nested_tool_call"),
        ("tool_call_in_prose", "prose_tool_call"),
        ("arguments_trailing_comma_repaired", "arguments_repaired"),
        ("arguments_single_quotes_repaired", "arguments_repaired"),
        ("arguments_raw_newline_repaired", "arguments_repaired"),
        ("json_block_after_prose", "prose_tool_call"),
        ("tool_object_in_prose_without_arguments", "prose_tool_call"),
        ("tool_inferred_from_arguments", "inferred_tool_call"),
        ("call_to_unoffered_tool_stays_text", "unoffered_tool_call"),
        ("call_without_tools_offered_stays_text", "unoffered_tool_call"),
        ("call_to_unoffered_namespace_stays_text", "unoffered_tool_call"),
        ("arguments_not_json_kept_verbatim", "arguments_not_json"),
        ("control_text_tokens_in_content", "control_text_removed"),
        ("invalid_utf8_bytes", None),
        ("header_cut_by_end", "header_without_message"),
        ("refusal_without_header", "body_in_header"),
        ("start_inside_content_resyncs", "start_in_content"),
        ("endoftext_boundary", "endoftext_boundary"),
    ],
)
def test_recoveries_are_named(encoding: HarmonyEncoding, name: str, kind: str | None) -> None:
    case = next(c for c in CASES if c["name"] == name)
    got = summarise(
        run(
            encoding,
            token_ids(encoding, case),
            case["tools"],
            case.get("schemas"),
            finish=case.get("engine_finish", "stop"),
        )
    )
    if kind is None:
        assert got["recoveries"] == []
    else:
        assert kind in got["recoveries"]


def test_well_formed_output_needs_no_recovery(encoding: HarmonyEncoding) -> None:
    for name in ("well_formed_tool_call", "final_only", "preamble_then_call"):
        case = next(c for c in CASES if c["name"] == name)
        assert summarise(run(encoding, token_ids(encoding, case), case["tools"]))["recoveries"] == []
