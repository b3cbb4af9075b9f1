"""Dispatcher settings: engine workers and the timeouts on every engine call."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import field_validator
from pydantic_settings import NoDecode

from services.common.settings import BusSettings

ENGINE_KINDS = ("vllm", "sglang", "sim", "openai", "openai-chat")
StreamMode = Literal["auto", "cumulative", "incremental"]


class Settings(BusSettings):
    # "KIND=URL", KIND: vllm | sglang | sim (the stand-in engine, spoken to as vLLM).
    # SGLang workers may pin their stream mode: "sglang+incremental=URL", "sglang+cumulative=URL".
    # Env CHORUS_ENGINES: a JSON list or comma-separated.
    engines: Annotated[list[str], NoDecode] = []
    connect_timeout_s: float = 3.0
    accept_timeout_s: float = 8.0  # until the engine answers with a status
    read_timeout_s: float = 120.0  # between two chunks of an engine stream
    abort_timeout_s: float = 2.0  # SGLang POST /abort_request
    health_interval_s: float = 3.0
    health_retry_s: float = 0.5  # while a worker is down
    health_timeout_s: float = 2.0
    sglang_stream_mode: StreamMode = "auto"
    # SGLang's budget when the client set none. 0: null, which SGLang's scheduler clips to the
    # room left in the context. A number is sent as is: SGLang refuses (400) any request whose
    # prompt + max_new_tokens reaches the context length (its own default would be 128).
    sglang_default_max_tokens: int = 0
    max_connections: int = 1024  # engine answers in hand at once, all workers (more wait)

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
