"""Dispatcher settings: engine workers and the timeouts on every engine call."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import NoDecode

from services.common.engine_spec import parse_engine, split_engines
from services.common.settings import BusSettings

StreamMode = Literal["auto", "cumulative", "incremental"]
Routing = Literal["auto", "cache_aware", "least_load", "round_robin"]


class Settings(BusSettings):
    engines: Annotated[list[str], NoDecode] = Field(
        default=[],
        description="Engines, KIND=URL[,OPTION=VALUE...] each, comma-separated (a JSON list works too). "
        "KIND: vllm | sglang | openai | openai-chat (text mode) | sim (the stand-in engine, spoken to as "
        "vLLM); SGLang engines may pin their stream mode: sglang+incremental=URL, sglang+cumulative=URL. "
        "Options: kv_events=tcp://HOST:PORT (the engine's KV cache event publisher), "
        "kv_replay=tcp://HOST:PORT (its replay socket), block_size=N (tokens per KV block), "
        "capacity=TOKENS (what its KV cache holds).",
    )
    connect_timeout_s: float = Field(default=3.0, description="TCP connect to an engine (seconds).")
    accept_timeout_s: float = Field(
        default=8.0, description="Until the engine answers a generation with a status (seconds)."
    )
    read_timeout_s: float = Field(default=120.0, description="Between two chunks of an engine stream (seconds).")
    abort_timeout_s: float = Field(default=2.0, description="SGLang's POST /abort_request (seconds).")
    health_interval_s: float = Field(
        default=3.0,
        description="How often every worker's health is polled (seconds): GET /health, or "
        "/v1/models for text-mode upstreams.",
    )
    health_retry_s: float = Field(
        default=0.5, description="The polling interval instead while any worker is down (seconds)."
    )
    health_timeout_s: float = Field(default=2.0, description="One health check (seconds).")
    sglang_stream_mode: StreamMode = Field(
        default="auto",
        description="How SGLang workers without +mode stream: cumulative output_ids (SGLang's "
        "default), incremental (--incremental-streaming-output), or auto (detected per chunk).",
    )
    sglang_default_max_tokens: int = Field(
        default=0,
        description="SGLang's budget when the client set none. 0: null, which SGLang's scheduler "
        "clips to the room left in the context. A number is sent as is: SGLang refuses (400) any "
        "request whose prompt + max_new_tokens reaches the context length (its own default "
        "would be 128).",
    )
    max_connections: int = Field(
        default=1024, description="Engine answers in hand at once, all workers together (more wait)."
    )

    routing: Routing = Field(
        default="auto",
        description="How an engine is chosen per request. cache_aware: the lowest expected cost, the "
        "prompt tokens the engine must prefill (what it does not hold, from its KV cache events or, "
        "without them, from what the stack sent it) plus its queued prefill and running decodes, one "
        "view shared by every dispatcher over the bus; least_load: the same without the cache; "
        "round_robin: in turn; auto: cache_aware with more than one engine, else round_robin.",
    )
    decode_weight: float = Field(
        default=0.15,
        ge=0,
        description="In cache_aware and least_load routing, what one token of context held by a running "
        "generation costs an engine, in prompt tokens to prefill (a long-context decode slows every step).",
    )
    work_weight: float = Field(
        default=1.0,
        ge=0,
        description="In cache_aware routing, what a prompt token an engine must prefill costs beyond the "
        "request's own wait: the requests queued behind it pay for it too (0: only the wait counts). "
        "Keeps a conversation on the engine that holds it when moving would not make it faster.",
    )
    kv_capacity_tokens: int = Field(
        default=1_048_576,
        gt=0,
        description="How many tokens an engine without KV cache events (and no capacity= in its spec) is "
        "assumed to hold: the stack's record of what it sent there is aged to that.",
    )
    kv_block_size: int = Field(
        default=16, gt=0, description="Tokens per KV block of an engine without events and no block_size=."
    )
    kv_silence_s: float = Field(
        default=30.0,
        gt=0,
        description="An engine's KV event stream silent this long is logged (an idle engine sends nothing).",
    )

    @field_validator("engines", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return split_engines(text)
        return value

    @field_validator("engines")
    @classmethod
    def _check(cls, value: list[str]) -> list[str]:
        for spec in value:
            parse_engine(spec)  # a ValueError names what is wrong
        return value
