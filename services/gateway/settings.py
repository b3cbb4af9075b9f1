from __future__ import annotations

import json
from typing import Annotated

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import NoDecode

from services.common.settings import BusSettings


class Settings(BusSettings):
    host: str = Field(default="127.0.0.1", description="Address the HTTP API listens on.")
    port: int = Field(default=8000, description="Port of the HTTP API (and /metrics, /health).")
    models: list[str] = Field(
        default_factory=lambda: ["openai/gpt-oss-20b"],
        description="Served model names (/v1/models); other names are a 404.",
    )
    model_aliases: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=lambda: {"claude-*": ""},
        description="Other model names clients send, mapped to a served model: PATTERN=MODEL items, "
        "comma-separated (glob patterns; an empty MODEL: the first of models), or a JSON object. By "
        "default the names Claude Code sends (claude-*: its main and background models) reach the "
        "first served model instead of a 404.",
    )
    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("CHORUS_REDIS_URL", "REDIS_URL", "redis_url"),
        description="Redis holding Responses state (responses, conversations, background runs).",
    )
    redis_password: str | None = Field(
        default=None,
        description="Password of the Redis primary (and its replicas) when CHORUS_REDIS_URL carries none. "
        "A Sentinel URL: redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE_NAME[/DB] "
        "(rediss+sentinel:// over TLS).",
    )
    redis_sentinel_password: str | None = Field(
        default=None, description="Password of the sentinels, if they require one (a redis+sentinel:// URL)."
    )
    redis_min_replicas: int | None = Field(
        default=None,
        description="A write (a stored response, its items, a conversation, a background run's "
        "checkpoint) is acknowledged only once this many replicas have it (Redis WAIT); fewer in "
        "time: storage unavailable (503). Unset: 1 with a redis+sentinel:// URL, else 0.",
    )
    redis_wait_ms: int = Field(
        default=500, description="How long a write waits for CHORUS_REDIS_MIN_REPLICAS replicas (milliseconds)."
    )
    redis_failover_s: float | None = Field(
        default=None,
        description="An operation that finds Redis unreachable, demoted (READONLY) or without a "
        "primary is retried with backoff for this long (a failover) before storage counts as "
        "unavailable (seconds). Unset: 15 with a redis+sentinel:// URL, else 0 (redis-py's own "
        "few quick retries).",
    )
    response_ttl_s: int = Field(
        default=30 * 24 * 3600, description="How long stored responses and conversations live (seconds)."
    )
    bus_timeout_s: float = Field(
        default=10.0,
        description="How long a new generation may take to start: from sending its job until an engine has taken it (seconds).",
    )
    first_token_timeout_s: float = Field(
        default=120.0, description="From the engine accepting a generation to its first parsed event (seconds)."
    )
    idle_timeout_s: float = Field(default=120.0, description="Between two parsed batches of a generation (seconds).")
    default_max_tokens: int | None = Field(
        default=None, description="Output budget when the request sets none; unset: the engine's limit."
    )
    max_tool_iterations: int = Field(default=16, description="Server-side cap on Responses tool-loop turns.")
    mcp_call_timeout_s: float = Field(default=30.0, description="One MCP tool call, end to end (seconds).")
    metrics_timeout_s: float = Field(
        default=0.5, description="/metrics waits this long for every service's answer (seconds)."
    )
    builtin_tools: dict[str, str] = Field(
        default_factory=dict,
        description="gpt-oss built-in tools (browser, python) routed to MCP servers, e.g. "
        '{"browser": "http://browser:8080/mcp"}; set the same value on the tools service.',
    )
    sealing_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Keys for sealed content (encrypted reasoning, compaction, "
        "background credentials): the first seals, all open. Empty: one is generated and shared "
        "through Redis.",
    )
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="API keys: with keys, every /v1 route needs one, and what a "
        "key stores (responses, conversations, background streams) is visible to that key only.",
    )
    max_body_bytes: int = Field(default=16 * 1024 * 1024, description="Larger request bodies are a 413.")
    websocket_compression: bool = Field(
        default=False,
        description="Offer permessage-deflate on WebSocket mode: smaller frames for a slow link, at a "
        "compression per event (each delta is one) in the gateway and a decompression in the client.",
    )
    ignore_unknown_fields: bool = Field(
        default=False,
        description="Accept request fields OpenAI does not define (a client newer than this server) instead of a 400.",
    )

    @field_validator("model_aliases", mode="before")
    @classmethod
    def _aliases(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("{"):
                return json.loads(text)
            return dict(item.strip().partition("=")[::2] for item in text.split(",") if item.strip())
        return value

    @field_validator("sealing_keys", "api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return [k.strip() for k in value.split(",") if k.strip()]
        return value
