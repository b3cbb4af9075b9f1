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
    prefill_us_per_token: float = Field(
        default=0.0,
        ge=0,
        description="Prefill cost per prompt token not found in its prefix cache (microseconds); "
        "prefills then run one at a time, as on one GPU. 0: free.",
    )
    served_model_name: str = Field(default="openai/gpt-oss-20b", description="The model name it reports (/v1/models).")
    max_model_len: int = Field(default=131072, description="The context length it enforces, as the real engines do.")
    vocab_size: int = Field(default=201088, description="Token ids at or above this are refused.")
    log_level: str = Field(
        default="INFO",
        validation_alias=AliasChoices("CHORUS_SIM_LOG_LEVEL", "CHORUS_LOG_LEVEL"),
        description="Python log level.",
    )
    kv_cache_tokens: int = Field(
        default=200_000 * 16,
        description="KV cache capacity in tokens (whole blocks); the least recently used blocks are evicted beyond it.",
    )
    kv_block_size: int = Field(default=16, gt=0, description="Tokens per KV cache block, vLLM's default.")
    kv_events_endpoint: str | None = Field(
        default=None,
        description="Publish KV cache events on this ZMQ PUB endpoint, as vLLM's --kv-events-config does "
        "(e.g. tcp://127.0.0.1:5557; unset: not published).",
    )
    kv_events_replay_endpoint: str | None = Field(
        default=None,
        description="The ZMQ ROUTER endpoint answering replay requests for missed event batches "
        "(e.g. tcp://127.0.0.1:5558; unset: no replay).",
    )
    kv_events_form: Literal["map", "array"] = Field(
        default="map",
        description="How events are encoded: map (vLLM since its events became maps) or array (earlier vLLM, SGLang).",
    )
    kv_events_topic: str = Field(default="", description="The topic frame of every event message.")
    vllm_enable_in_reasoning: bool = Field(
        default=False,
        description="vLLM's --structured-outputs-config enable_in_reasoning (its default: off): a grammar "
        "constrains from the first output token, reasoning included, whatever vllm_reasoning_gate says.",
    )
    vllm_reasoning_gate: bool = Field(
        default=False,
        description="Behave as vLLM 0.10.2-0.26 with gpt-oss: its openai_gptoss reasoning parser holds a grammar "
        "back until the output has <|channel|>final...<|message|> (the tokens before are free). Off (vLLM 0.27 "
        "and later, whose parser reports the reasoning over from the start): from the first output token.",
    )
