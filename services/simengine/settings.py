"""Settings of the SIMULATED engine (env prefix CHORUS_SIM_)."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CHORUS_SIM_", extra="ignore")

    host: str = Field(default="127.0.0.1", description="Address the simulated engine listens on.")
    port: int = Field(default=9000, description="Its port.")
    protocol: Literal["vllm", "sglang", "both"] = Field(
        default="both", description="Which engine's HTTP routes it serves (vLLM's, SGLang's or both)."
    )
    sglang_incremental: bool = Field(
        default=False,
        description="Stream SGLang output as deltas, like SGLang's --incremental-streaming-output "
        "(default: cumulative).",
    )
    token_delay_ms: float = Field(default=0.0, description="Delay per output token (ms); benchmarks run at zero.")
    tokens_per_chunk: int = Field(default=1, description="Output tokens per streamed chunk.")
    prefill_delay_ms: float = Field(default=0.0, description="Delay before the first token (ms).")
    served_model_name: str = Field(default="openai/gpt-oss-20b", description="The model name it reports (/v1/models).")
    max_model_len: int = Field(default=131072, description="The context length it enforces, as the real engines do.")
    vocab_size: int = Field(default=201088, description="Token ids at or above this are refused.")
    log_level: str = Field(
        default="INFO",
        validation_alias=AliasChoices("CHORUS_SIM_LOG_LEVEL", "CHORUS_LOG_LEVEL"),
        description="Python log level.",
    )
