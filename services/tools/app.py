"""The tools service: MCP client for the gateway's tool loop. The only place that wires the
broker, the session pool and the runner together."""

from __future__ import annotations

import asyncio
import logging

from contracts.messages.items import McpToolInfo
from services.common.runtime import add_health, make_broker, serve
from services.tools.cache import TtlCache
from services.tools.handlers import register
from services.tools.mcp_client import ConnectOptions, SessionPool, open_client
from services.tools.policy import ServerPolicy
from services.tools.runner import ToolRunner
from services.tools.settings import Settings


def build_policy(settings: Settings) -> ServerPolicy:
    return ServerPolicy(
        settings.allowed_servers,
        settings.builtin_tools,
        allow_loopback=settings.allow_loopback,
        max_header_bytes=settings.max_header_bytes,
    )


def build_pool(settings: Settings) -> SessionPool:
    opts = ConnectOptions(
        connect_timeout_s=settings.connect_timeout_s,
        read_timeout_s=max(settings.max_call_timeout_s, settings.list_timeout_s),
        max_response_bytes=settings.max_response_bytes,
        protocol_mode=settings.protocol_mode,
    )
    return SessionPool(
        lambda server: open_client(server, opts),
        connect_timeout_s=settings.connect_timeout_s,
        idle_s=settings.session_idle_s,
        max_sessions=settings.max_sessions,
    )


async def run(
    settings: Settings, stop: asyncio.Event | None = None, *, ready: asyncio.Event | None = None
) -> None:
    """Serve until ``stop`` (or a signal); ``ready`` is set once the handlers are subscribed."""
    # the HTTP client logs every request (with its URL) at INFO
    for name in ("httpx2", "httpcore2"):
        logging.getLogger(name).setLevel(logging.WARNING)
    listings: TtlCache[list[McpToolInfo]] = TtlCache(
        settings.list_cache_ttl_s, settings.list_cache_max_entries
    )
    policy = build_policy(settings)  # a bad allowlist entry fails here, at start-up
    async with build_pool(settings) as pool:
        runner = ToolRunner(settings, policy, pool, listings)
        broker = make_broker(settings, "tools")
        register(broker, settings, runner)
        add_health(broker, settings, "tools", lambda: (True, f"{len(pool)} MCP sessions"))

        async def started() -> None:
            # the subscriptions are on the server once it has answered a PING after them
            await broker.connection.flush(timeout=5)
            if ready is not None:
                ready.set()

        await serve(broker, on_start=started, stop=stop)
