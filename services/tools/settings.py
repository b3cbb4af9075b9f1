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

    allowed_servers: list[str] = Field(
        default_factory=list,
        description="MCP servers callers may name: host names (mcp.example.com, "
        "*.example.com), host:port, IP literals or URL prefixes (https://mcp.example.com/v1/).",
    )
    allow_loopback: bool = Field(
        default=False,
        description="Allow MCP servers on loopback addresses (chorus up bound to a loopback address turns it on).",
    )
    allow_private_networks: bool = Field(
        default=False,
        description="Allow MCP servers on private and link-local addresses (an exact "
        "allowed_servers entry vouches for its server without this).",
    )
    allow_metadata_addresses: bool = Field(
        default=False,
        description="Allow cloud metadata addresses (169.254.169.254 and the like); they are "
        "then judged as the range they fall in (link-local: allow_private_networks).",
    )
    builtin_tools: dict[str, str] = Field(
        default_factory=dict,
        description="gpt-oss built-in tools (browser, python) -> the MCP server implementing "
        'each, e.g. {"browser": "http://browser:8080/mcp"}; these URLs are always allowed.',
    )

    protocol_mode: Literal["auto", "legacy"] = Field(
        default="auto",
        description="MCP protocol negotiation: auto probes server/discover, then falls back to "
        "initialize; legacy always initializes.",
    )

    # time caps (seconds)
    connect_timeout_s: float = Field(default=10.0, description="Name lookup, TCP connect and MCP handshake (seconds).")
    resolve_timeout_s: float = Field(default=5.0, description="One name lookup, all its A/AAAA answers (seconds).")
    list_timeout_s: float = Field(default=30.0, description="A whole tools/list, all pages (seconds).")
    max_call_timeout_s: float = Field(
        default=120.0, description="Upper bound on the timeout a tool call asks for (seconds)."
    )

    # size caps (bytes)
    max_output_bytes: int = Field(
        default=64 * 1024, description="A tool's output text; the rest is cut with a marker (bytes)."
    )
    max_response_bytes: int = Field(
        default=8 * 1024 * 1024, description="One HTTP response or SSE event from a server (bytes)."
    )
    max_header_bytes: int = Field(
        default=16 * 1024, description="The caller's headers for one server, all together (bytes)."
    )

    # tool listings, cached per (server_url, headers)
    list_cache_ttl_s: float = Field(default=300.0, description="How long a server's tool listing is cached (seconds).")
    list_cache_max_entries: int = Field(default=1024, description="Tool listings cached at most.")
    max_list_pages: int = Field(default=50, description="Pages of one tools/list followed at most.")

    # MCP sessions, pooled per (server_url, headers)
    session_idle_s: float = Field(
        default=60.0, description="An idle pooled MCP session is closed after this long (seconds)."
    )
    max_sessions: int = Field(default=256, description="Pooled MCP sessions at most.")
    max_concurrency: int = Field(default=128, description="Requests handled at once by one replica.")

    # per server (scheme://host:port), so one dead or slow server cannot hold every slot
    max_concurrency_per_server: int = Field(
        default=8, description="Calls and listings running against one server at once."
    )
    max_waiting_per_server: int = Field(
        default=16, description="More wait for a slot on that server; beyond that they fail at once."
    )
    server_queue_timeout_s: float = Field(
        default=5.0, description="A call waiting for a server slot fails after this long (seconds)."
    )
    unreachable_ttl_s: float = Field(
        default=5.0, description="A server that just failed to answer fails fast for this long (seconds; 0: off)."
    )
