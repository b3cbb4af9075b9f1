from __future__ import annotations

from typing import Annotated

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import NoDecode

from services.common.settings import BusSettings


class Settings(BusSettings):
    host: str = "127.0.0.1"
    port: int = 8000
    models: list[str] = Field(default_factory=lambda: ["openai/gpt-oss-20b"])
    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("CHORUS_REDIS_URL", "REDIS_URL", "redis_url"),
    )
    response_ttl_s: int = 30 * 24 * 3600  # how long stored responses / conversations live
    bus_timeout_s: float = 10.0  # encode / parse-open / generate accept
    first_token_timeout_s: float = 120.0  # from accept to the first parsed event
    idle_timeout_s: float = 120.0  # between two parsed batches
    default_max_tokens: int | None = None  # None: the engine's limit
    max_tool_iterations: int = 16  # server-side cap on Responses tool-loop turns
    mcp_call_timeout_s: float = 30.0  # one MCP tool call, end to end
    metrics_timeout_s: float = 0.5  # /metrics waits this long for every service's answer
    # gpt-oss built-in tools routed to MCP servers (the tools service holds the URLs)
    builtin_tools: dict[str, str] = Field(default_factory=dict)
    # keys for sealed content (encrypted reasoning, compaction, background credentials): the
    # first seals, all open. Empty: one is generated and shared through Redis.
    sealing_keys: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # API keys (CHORUS_API_KEYS, comma-separated): with keys, every /v1 route needs one, and what
    # a key stores (responses, conversations, background streams) is visible to that key only
    api_keys: Annotated[list[str], NoDecode] = Field(default_factory=list)
    max_body_bytes: int = 16 * 1024 * 1024  # larger request bodies are a 413
    ignore_unknown_fields: bool = False  # accept fields OpenAI does not define (a client newer than this server)

    @field_validator("sealing_keys", "api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return [k.strip() for k in value.split(",") if k.strip()]
        return value
