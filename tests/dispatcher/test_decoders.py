"""Engine stream decoding and request bodies, as pure functions."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.errors import ErrorCode
from contracts.messages.generate import GenerateRequest, ParseSpec, Route, SamplingParams
from services.common.harmony import CALL, RETURN
from services.dispatcher.engines import make_adapter
from services.dispatcher.engines.base import EngineChunk, StreamDecoder, error_for_status, error_message
from services.dispatcher.engines.sglang import Mode, SglangAdapter, SglangDecoder, generate_body
from services.dispatcher.engines.vllm import VllmDecoder, completion_body
from services.dispatcher.fleet import RoundRobin, parse_engines
from services.dispatcher.settings import Settings

REQ = GenerateRequest(
    generation_id="r1",
    model="openai/gpt-oss-20b",
    prompt_token_ids=[1, 2, 3],
    stop_token_ids=[RETURN, CALL],
    parse=ParseSpec(request_id="r1"),
    route=Route(gateway="g", parser="p"),
    deadline=2e9,
    sampling=SamplingParams(
        temperature=0.5, top_p=0.9, presence_penalty=0.5, frequency_penalty=-0.25, seed=7, stop=["END"]
    ),
)


def test_vllm_body_is_the_reference_shape() -> None:
    body = completion_body(REQ)
    assert body == {
        "model": "openai/gpt-oss-20b",
        "prompt": [1, 2, 3],
        "max_tokens": None,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "skip_special_tokens": False,
        "stop_token_ids": [RETURN, CALL],
        "request_id": "r1",
        "temperature": 0.5,
        "top_p": 0.9,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.25,
        "seed": 7,
        "stop": ["END"],
    }


def test_sglang_body_always_sets_max_new_tokens() -> None:
    """Absent means SGLang's 128; without a client limit it is null (the scheduler clips it to
    the room left), never a number that could reach the context length (a 400)."""
    body = generate_body(REQ)
    assert body["input_ids"] == [1, 2, 3] and body["rid"] == "r1" and body["stream"] is True
    sp = body["sampling_params"]
    assert "max_new_tokens" in sp and sp["max_new_tokens"] is None
    assert b'"max_new_tokens":null' in orjson.dumps(body)
    assert sp["stop_token_ids"] == [RETURN, CALL]
    assert sp["skip_special_tokens"] is False and sp["no_stop_trim"] is True
    assert (sp["temperature"], sp["top_p"], sp["stop"]) == (0.5, 0.9, ["END"])
    assert (sp["presence_penalty"], sp["frequency_penalty"]) == (0.5, -0.25)
    capped = REQ.model_copy(update={"sampling": SamplingParams(max_tokens=64)})
    assert generate_body(capped)["sampling_params"]["max_new_tokens"] == 64
    assert generate_body(REQ, 4096)["sampling_params"]["max_new_tokens"] == 4096  # a set default
    assert "structural_tag" not in sp
    # the dispatcher's setting: 0 (its default) is null
    assert Settings().sglang_default_max_tokens == 0
    adapter = make_adapter("sglang", sglang_default_max_tokens=Settings().sglang_default_max_tokens)
    assert adapter.request(REQ)[1]["sampling_params"]["max_new_tokens"] is None


def _vllm(ids: list[int] | None, finish: str | None = None, stop_reason: Any = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "text": "x", "finish_reason": finish, "stop_reason": stop_reason}
    if ids is not None:
        choice["token_ids"] = ids
    return {"choices": [choice], "usage": None}


def fed(decoder: StreamDecoder, event: dict[str, Any]) -> EngineChunk:
    """The chunk ``event`` decodes to (each event fed through here makes one)."""
    chunk = decoder.feed(event)
    assert chunk is not None
    return chunk


def test_vllm_decoder_stop_tokens_and_usage() -> None:
    dec = VllmDecoder([RETURN, CALL])
    assert fed(dec, _vllm([5, 6])).token_ids == [5, 6]
    end = fed(dec, _vllm([7, RETURN], "stop", None))
    assert (end.finish_reason, end.stop_token_id, end.token_ids) == ("stop", RETURN, [7, RETURN])
    usage = fed(
        dec,
        {
            "choices": [],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 2}},
        },
    )
    assert usage.usage is not None and usage.usage.model_dump() == {
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "cached_tokens": 2,
    }
    call = fed(VllmDecoder([RETURN, CALL]), _vllm([9, CALL], "stop", CALL))
    assert call.stop_token_id == CALL and call.token_ids == [9, CALL]
    # a finish chunk without the stop id in token_ids: the stop token still ends the stream
    bare = VllmDecoder([RETURN, CALL])
    bare.feed(_vllm([9]))
    fin = fed(bare, _vllm([], "stop", CALL))
    assert fin.token_ids == [CALL] and fin.stop_token_id == CALL
    length = fed(VllmDecoder([RETURN]), _vllm([1, 2], "length"))
    assert (length.finish_reason, length.stop_token_id) == ("length", None)


def test_vllm_decoder_without_token_ids_is_an_error() -> None:
    chunk = fed(VllmDecoder([RETURN]), _vllm(None))
    assert chunk.error is not None and "return_token_ids" in chunk.error.message


def _sg(ids: list[int], completion: int, finish: Any = None) -> dict[str, Any]:
    return {
        "text": "",
        "output_ids": ids,
        "meta_info": {
            "id": "r",
            "finish_reason": finish,
            "prompt_tokens": 3,
            "completion_tokens": completion,
            "cached_tokens": 0,
        },
    }


@pytest.mark.parametrize("mode", ["auto", "cumulative"])
def test_sglang_cumulative(mode: Mode) -> None:
    dec = SglangDecoder(mode)
    got = [
        fed(dec, _sg([1], 1)),
        fed(dec, _sg([1, 2, 3], 3)),
        fed(dec, _sg([1, 2, 3, RETURN], 4, {"type": "stop", "matched": RETURN})),
    ]
    assert [c.token_ids for c in got] == [[1], [2, 3], [RETURN]]
    assert got[-1].finish_reason == "stop" and got[-1].stop_token_id == RETURN
    assert got[-1].usage is not None and got[-1].usage.completion_tokens == 4


@pytest.mark.parametrize("mode", ["auto", "incremental"])
def test_sglang_incremental(mode: Mode) -> None:
    dec = SglangDecoder(mode)
    got = [
        fed(dec, _sg([1], 1)),
        fed(dec, _sg([2, 3], 3)),
        fed(dec, _sg([1], 4)),
        fed(dec, _sg([CALL], 5, {"type": "stop", "matched": CALL})),
    ]
    assert [c.token_ids for c in got] == [[1], [2, 3], [1], [CALL]]
    assert got[-1].stop_token_id == CALL


def test_sglang_auto_with_repeating_ids_and_trimmed_stop() -> None:
    # incremental deltas that happen to look like a prefix: completion_tokens decides
    dec = SglangDecoder("auto")
    assert [fed(dec, _sg([1], 1)).token_ids, fed(dec, _sg([1, 1], 3)).token_ids] == [[1], [1, 1]]
    # cumulative with the stop token trimmed by the server: it is put back
    dec = SglangDecoder("auto")
    dec.feed(_sg([4, 5], 2))
    end = fed(dec, _sg([4, 5, 6], 4, {"type": "stop", "matched": RETURN}))
    assert end.token_ids == [6, RETURN] and end.stop_token_id == RETURN


def test_a_matched_stop_string_is_reported_with_the_ids_kept() -> None:
    """vLLM's string ``stop_reason`` and SGLang's string ``matched``: the stop string, the
    tokens that spelled it kept and no stop token added."""
    vllm = fed(VllmDecoder([RETURN, CALL]), _vllm([5, 6], "stop", "END"))
    assert (vllm.finish_reason, vllm.stop_text, vllm.stop_token_id, vllm.token_ids) == ("stop", "END", None, [5, 6])
    sglang = fed(SglangDecoder("auto"), _sg([5, 6], 2, {"type": "stop", "matched": "END"}))
    assert (sglang.finish_reason, sglang.stop_text, sglang.stop_token_id) == ("stop", "END", None)
    assert sglang.token_ids == [5, 6]
    token = fed(VllmDecoder([RETURN]), _vllm([7, RETURN], "stop", None))
    assert token.stop_text is None


def test_sglang_length_and_abort() -> None:
    dec = SglangDecoder("auto")
    assert fed(dec, _sg([1, 2], 2, {"type": "length", "length": 2})).finish_reason == "length"
    aborted = fed(SglangDecoder("auto"), _sg([1], 1, {"type": "abort", "message": "boom"}))
    assert aborted.error is not None and aborted.error.code == ErrorCode.ENGINE_ERROR
    assert aborted.error.message == "boom"
    bad = fed(SglangDecoder("auto"), _sg([], 0, {"type": "abort", "message": "input is too long", "status_code": 400}))
    assert bad.error is not None and bad.error.code == ErrorCode.CONTEXT_LENGTH_EXCEEDED


@pytest.mark.parametrize(
    ("status", "message", "code"),
    [
        (400, "This model's maximum context length is 10 tokens.", ErrorCode.CONTEXT_LENGTH_EXCEEDED),
        (400, "temperature must be >= 0", ErrorCode.INVALID_REQUEST),
        (404, "The model `x` does not exist.", ErrorCode.MODEL_NOT_FOUND),
        (429, "slow down", ErrorCode.ENGINE_ERROR),
        (503, "overloaded", ErrorCode.ENGINE_ERROR),
    ],
)
def test_error_for_status(status: int, message: str, code: ErrorCode) -> None:
    assert error_for_status(status, message).code == code


def test_stream_error_events_say_whose_fault() -> None:
    """An ``{"error"}`` event's code decides; SGLang's carry none and are its TokenizerManager
    refusing the request (a ValueError: the caller's), vLLM's carry one."""
    from services.dispatcher.engines.stream import decode_event

    context = (
        b'{"error": {"message": "Requested token count exceeds the model\'s maximum context length of 8 tokens."}}'
    )
    chunk = decode_event(SglangDecoder("auto"), context)
    assert chunk is not None and chunk.finish_reason == "error" and chunk.error is not None
    assert chunk.error.code == ErrorCode.CONTEXT_LENGTH_EXCEEDED and not chunk.error.retryable
    bad = decode_event(SglangDecoder("auto"), b'{"error": {"message": "top_p must be in (0, 1], got 2."}}')
    assert bad is not None and bad.error is not None and bad.error.code == ErrorCode.INVALID_REQUEST
    crash = decode_event(VllmDecoder([RETURN]), b'{"error": {"message": "boom", "code": 500}}')
    assert crash is not None and crash.error is not None and crash.error.code == ErrorCode.ENGINE_ERROR
    refused = decode_event(VllmDecoder([RETURN]), b'{"error": {"message": "no", "code": 400}}')
    assert refused is not None and refused.error is not None and refused.error.code == ErrorCode.INVALID_REQUEST
    plain = decode_event(VllmDecoder([RETURN]), b'{"error": "gone"}')
    assert plain is not None and plain.error is not None and plain.error.code == ErrorCode.ENGINE_ERROR


def test_error_message_shapes() -> None:
    assert error_message({"error": {"message": "a"}}, "d") == "a"
    assert error_message({"object": "error", "message": "b"}, "d") == "b"
    assert error_message({"detail": "c"}, "d") == "c"
    assert error_message("plain text", "d") == "plain text"
    assert error_message({}, "d") == "d"


def test_round_robin_skips_unhealthy_engines() -> None:
    engines = parse_engines(["sim=http://a", "vllm=http://b", "sglang+incremental=http://c"])
    assert [e.kind for e in engines] == ["sim", "vllm", "sglang"]
    pinned = engines[2].adapter
    assert isinstance(pinned, SglangAdapter) and pinned.mode == "incremental"
    policy = RoundRobin()
    firsts = [policy.rank(REQ, engines)[0].url for _ in range(3)]
    assert firsts == ["http://a", "http://b", "http://c"]
    engines[1].mark_down("refused")
    ranks = [policy.rank(REQ, engines) for _ in range(3)]
    assert all("http://b" not in [e.url for e in r] for r in ranks)
    for e in engines:
        e.mark_down("refused")
    assert len(policy.rank(REQ, engines)) == 3  # all down: try them all anyway


def test_engine_settings_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """CHORUS_ENGINES as operators write it: KIND=URL items split on commas, or a JSON list."""

    def engines(value: str) -> list[str]:
        monkeypatch.setenv("CHORUS_ENGINES", value)
        return Settings().engines

    assert engines("sim=http://a:1, sglang=http://b:2") == ["sim=http://a:1", "sglang=http://b:2"]
    assert engines('["vllm=http://a:1"]') == ["vllm=http://a:1"]
    with pytest.raises(ValueError, match="KIND=URL"):
        engines("tgi=http://a:1")
    with pytest.raises(ValueError, match="only sglang"):
        engines("vllm+incremental=http://a:1")


@st.composite
def chunked_output(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """Output ids (ending with a stop token) and the sizes of the chunks they stream in."""
    ids = draw(st.lists(st.integers(0, 5), min_size=1, max_size=40))  # small alphabet: repeats
    ids.append(RETURN)
    cuts = sorted(draw(st.sets(st.integers(1, len(ids) - 1), max_size=len(ids) - 1)))
    bounds = [0, *cuts, len(ids)]
    return ids, [b - a for a, b in zip(bounds, bounds[1:], strict=False)]


@settings(max_examples=200, deadline=None)
@given(chunked_output(), st.booleans(), st.booleans())
def test_sglang_auto_mode_recovers_any_stream(case: tuple[list[int], list[int]], incremental: bool, trim: bool) -> None:
    """Whatever the chunking, auto mode reads back exactly the ids the engine generated, from
    cumulative or incremental streams, with or without the stop token trimmed."""
    ids, sizes = case
    dec = SglangDecoder("auto")
    got: list[int] = []
    sent = 0
    for n, size in enumerate(sizes):
        sent += size
        last = n == len(sizes) - 1
        out = ids[sent - size : sent] if incremental else ids[:sent]
        if last and trim:
            out = out[:-1]
        finish = {"type": "stop", "matched": RETURN} if last else None
        chunk = dec.feed(_sg(out, sent, finish))
        assert chunk is not None
        got.extend(chunk.token_ids)
    assert got == ids


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "choices",
                        "usage",
                        "token_ids",
                        "finish_reason",
                        "stop_reason",
                        "output_ids",
                        "meta_info",
                        "completion_tokens",
                        "type",
                        "matched",
                    ]
                ),
                inner,
                max_size=4,
            )
        ),
        max_leaves=12,
    )
)
def test_decoders_never_raise_on_odd_events(event: object) -> None:
    """Engine output is not trusted: odd events give a chunk, nothing, or an error chunk."""
    from services.dispatcher.engines.stream import decode_event

    for decoder in (VllmDecoder([RETURN]), SglangDecoder("auto")):
        chunk = decode_event(decoder, json.dumps(event).encode())
        assert chunk is None or isinstance(chunk, EngineChunk)
        if chunk is not None:
            assert all(type(t) is int and t >= 0 for t in chunk.token_ids)
            # an error always ends the stream as one, with what went wrong
            assert (chunk.error is not None) == (chunk.finish_reason == "error")
