"""Dispatcher settings: engine workers and the timeouts on every engine call."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import NoDecode

from services.common.settings import BusSettings

ENGINE_KINDS = ("vllm", "sglang", "sim", "openai", "openai-chat")
StreamMode = Literal["auto", "cumulative", "incremental"]


class Settings(BusSettings):
    engines: Annotated[list[str], NoDecode] = Field(
        default=[],
        description="Engine workers, KIND=URL each (a JSON list works too). KIND: vllm | "
        "sglang | openai | openai-chat (text mode) | sim (the stand-in engine, spoken to as "
        "vLLM); SGLang workers may pin their stream mode: sglang+incremental=URL, "
        "sglang+cumulative=URL.",
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

    @field_validator("engines", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    @field_validator("engines")
    @classmethod
    def _check(cls, value: list[str]) -> list[str]:
        for spec in value:
            kind, sep, url = spec.partition("=")
            base, _, mode = kind.partition("+")
            if not sep or base not in ENGINE_KINDS or not url.startswith(("http://", "https://")):
                raise ValueError(f"engine {spec!r}: want KIND=URL, KIND one of {ENGINE_KINDS}")
            if mode and (base != "sglang" or mode not in ("auto", "cumulative", "incremental")):
                raise ValueError(f"engine {spec!r}: only sglang takes +auto|+cumulative|+incremental")
        return value
