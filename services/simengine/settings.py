"""Settings of the SIMULATED engine (env prefix CHORUS_SIM_)."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CHORUS_SIM_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 9000
    protocol: Literal["vllm", "sglang", "both"] = "both"
    sglang_incremental: bool = False  # like SGLang's --incremental-streaming-output
    token_delay_ms: float = 0.0  # per token; benchmarks run at zero
    tokens_per_chunk: int = 1
    prefill_delay_ms: float = 0.0
    served_model_name: str = "openai/gpt-oss-20b"
    max_model_len: int = 131072
    vocab_size: int = 201088
    log_level: str = Field(
        default="INFO", validation_alias=AliasChoices("CHORUS_SIM_LOG_LEVEL", "CHORUS_LOG_LEVEL")
    )
