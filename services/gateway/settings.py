from __future__ import annotations

from pydantic import AliasChoices, Field

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
    # gpt-oss built-in tools routed to MCP servers (the tools service holds the URLs)
    builtin_tools: dict[str, str] = Field(default_factory=dict)
