"""Engine specs as the CLI, the settings and compose take them."""

from __future__ import annotations

import re

import pytest

from services.common.engine_spec import EngineSpec, parse_engine, split_engines
from services.dispatcher.settings import Settings


def test_a_spec_with_every_option_round_trips() -> None:
    text = "vllm=http://gpu1:8000/,kv_events=tcp://gpu1:5557,kv_replay=tcp://gpu1:5558,block_size=16,capacity=200000"
    spec = parse_engine(text)
    assert spec == EngineSpec(
        kind="vllm",
        url="http://gpu1:8000",
        kv_events="tcp://gpu1:5557",
        kv_replay="tcp://gpu1:5558",
        block_size=16,
        capacity=200000,
    )
    assert parse_engine(spec.text) == spec
    assert parse_engine("sglang+incremental=http://b:30000").mode == "incremental"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("tgi=http://a", "KIND one of"),
        ("vllm=gpu1:8000", "KIND=URL"),
        ("vllm+incremental=http://a", "only sglang"),
        ("vllm=http://a,kv_event=tcp://a:1", "unknown option 'kv_event=tcp://a:1'"),
        ("vllm=http://a,kv_events=http://a:1", "ZMQ endpoint"),
        ("vllm=http://a,kv_replay=tcp://a:2", "kv_replay needs kv_events"),
        ("vllm=http://a,block_size=0", "block_size wants a whole number above 0"),
        ("vllm=http://a,capacity=lots", "capacity wants a whole number"),
    ],
)
def test_mistakes_are_named(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_engine(text)


def test_a_comma_separated_list_keeps_options_with_their_engine() -> None:
    text = "vllm=http://a,kv_events=tcp://a:5557, sglang=http://b,block_size=1,vllm=http://c"
    assert split_engines(text) == [
        "vllm=http://a,kv_events=tcp://a:5557",
        "sglang=http://b,block_size=1",
        "vllm=http://c",
    ]
    assert Settings(engines=text).engines == split_engines(text)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="engine 'kv=tcp://x': want KIND=URL"):
        Settings(engines="vllm=http://a,kv=tcp://x")  # type: ignore[arg-type]
