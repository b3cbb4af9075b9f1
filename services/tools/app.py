"""The tools service: MCP client for the gateway's tool loop. The only place that wires the
bus, the session pool and the runner together."""

from __future__ import annotations

import asyncio
import logging

from contracts.messages.items import McpToolInfo
from services.common.runtime import Runtime
from services.tools.cache import TtlCache
from services.tools.egress import EgressRules, Resolver, system_resolver
from services.tools.handlers import register
from services.tools.mcp_client import ConnectOptions, SessionPool, checked_connector
from services.tools.policy import ServerPolicy
from services.tools.runner import ToolRunner
from services.tools.settings import Settings


def build_policy(settings: Settings) -> ServerPolicy:
    rules = EgressRules(
        allow_loopback=settings.allow_loopback,
        allow_private_networks=settings.allow_private_networks,
        allow_metadata_addresses=settings.allow_metadata_addresses,
    )
    return ServerPolicy(
        settings.allowed_servers, settings.builtin_tools, rules=rules, max_header_bytes=settings.max_header_bytes
    )


def build_pool(settings: Settings, policy: ServerPolicy, resolve: Resolver) -> SessionPool:
    """Sessions that connect only after the policy resolved and checked the server's host,
    and only to the addresses it checked."""
    opts = ConnectOptions(
        connect_timeout_s=settings.connect_timeout_s,
        read_timeout_s=max(settings.max_call_timeout_s, settings.list_timeout_s),
        max_response_bytes=settings.max_response_bytes,
        protocol_mode=settings.protocol_mode,
    )
    return SessionPool(
        checked_connector(lambda url: policy.addresses(url, resolve, settings.resolve_timeout_s), opts),
        connect_timeout_s=settings.connect_timeout_s,
        idle_s=settings.session_idle_s,
        max_sessions=settings.max_sessions,
    )


async def run(
    settings: Settings,
    stop: asyncio.Event | None = None,
    *,
    ready: asyncio.Event | None = None,
    resolve: Resolver = system_resolver,
) -> None:
    """Serve until ``stop`` (or a signal); ``ready`` is set once the handlers are subscribed.
    ``resolve`` turns MCP server host names into addresses (tests pass a fake one)."""
    # the HTTP client logs every request (with its URL) at INFO
    for name in ("httpx2", "httpcore2"):
        logging.getLogger(name).setLevel(logging.WARNING)
    listings: TtlCache[list[McpToolInfo]] = TtlCache(settings.list_cache_ttl_s, settings.list_cache_max_entries)
    policy = build_policy(settings)  # a bad allowlist entry fails here, at start-up
    async with build_pool(settings, policy, resolve) as pool, Runtime.start(settings, "tools", stop=stop) as rt:
        await register(rt.bus, settings, ToolRunner(settings, policy, pool, listings))
        rt.ready = lambda: (True, f"{len(pool)} MCP sessions")
        await rt.serve(ready=ready)
