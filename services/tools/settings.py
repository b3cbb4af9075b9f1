from __future__ import annotations

from typing import Literal

from pydantic import Field

from services.common.settings import BusSettings


class Settings(BusSettings):
    """The tools service: which MCP servers it may connect to, and how hard it tries.

    ``server_url`` arrives from API callers, so outbound connections are allowlisted:
    ``allowed_servers`` entries are host names (``mcp.example.com``, ``*.example.com``),
    ``host:port``, or URL prefixes (``https://mcp.example.com/v1/``); every ``builtin_tools``
    URL passes too. Host names are resolved and every address is checked (``egress``):
    loopback addresses need ``allow_loopback`` (``chorus up`` bound to a loopback address
    turns it on), private and link-local ones ``allow_private_networks``, unless an exact
    entry names the server; cloud metadata addresses need ``allow_metadata_addresses`` on
    top. Lists and dicts are JSON in the environment, e.g.
    ``CHORUS_ALLOWED_SERVERS='["mcp.example.com"]'``,
    ``CHORUS_BUILTIN_TOOLS='{"browser": "http://browser:8080/mcp"}'``.

    ``builtin_tools`` maps a built-in tool name to the MCP server implementing it; callers
    address one as ``McpServer.builtin(name)`` (server_url ``builtin:<name>``) and never see
    its URL.
    """

    allowed_servers: list[str] = Field(default_factory=list)
    allow_loopback: bool = False
    allow_private_networks: bool = False
    allow_metadata_addresses: bool = False
    builtin_tools: dict[str, str] = Field(default_factory=dict)

    # protocol negotiation: "auto" probes server/discover then falls back to initialize
    protocol_mode: Literal["auto", "legacy"] = "auto"

    # time caps (seconds)
    connect_timeout_s: float = 10.0  # name lookup, TCP connect and MCP handshake
    resolve_timeout_s: float = 5.0  # one name lookup (all its A/AAAA answers)
    list_timeout_s: float = 30.0  # a whole tools/list (all pages)
    max_call_timeout_s: float = 120.0  # caps CallToolRequest.timeout_s

    # size caps (bytes)
    max_output_bytes: int = 64 * 1024  # a tool's output text; the rest is cut with a marker
    max_response_bytes: int = 8 * 1024 * 1024  # one HTTP response / SSE event from a server
    max_header_bytes: int = 16 * 1024  # the caller's headers for one server, all together

    # tool listings, cached per (server_url, headers)
    list_cache_ttl_s: float = 300.0
    list_cache_max_entries: int = 1024
    max_list_pages: int = 50

    # MCP sessions, pooled per (server_url, headers)
    session_idle_s: float = 60.0
    max_sessions: int = 256
    max_concurrency: int = 128  # requests handled at once by one replica

    # per server (scheme://host:port), so one dead or slow server cannot hold every slot
    max_concurrency_per_server: int = 8  # calls and listings running against it at once
    max_waiting_per_server: int = 16  # more wait for a slot; beyond that they fail at once
    server_queue_timeout_s: float = 5.0  # a waiting call fails after this long
    unreachable_ttl_s: float = 5.0  # an unreachable server fails fast this long (0: off)
