"""What the tools service does with a request: check it, then list tools (through the listing
cache) or call one, over a pooled MCP session, within the server's concurrency limit.

Failures are results, not crashes: an unreachable server, a tool error, a timeout, bad
arguments or an oversized response become ``ToolResult(error=...)`` (or
``ToolsListed(error=...)``) for the model to read. Only a request that is malformed on its face
(a URL that is not an absolute http(s) URL or carries credentials, an unknown built-in,
malformed headers) is a ``BusError``: that depends on the request's text alone.

A destination the policy refuses and a server that cannot be reached (refused connection,
reset, timeout, no handshake, a name that does not resolve) give the caller one and the same
message, naming the settings to change, so a caller cannot tell them apart nor map which
ports answer; the log line has the details.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar

from mcp import Client
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from contracts.errors import BusError, ErrorCode
from contracts.messages.items import McpToolInfo
from contracts.messages.tools import CallToolRequest, ListToolsRequest, McpServer, ToolResult, ToolsListed
from services.tools.cache import ServerKey, TtlCache, server_key
from services.tools.limits import RecentlyUnreachable, ServerBusy, ServerGate
from services.tools.mcp_client import ConnectFailed, SessionPool
from services.tools.policy import PolicyError, ServerPolicy, origin
from services.tools.results import (
    InvalidArguments,
    describe,
    failure_result,
    parse_arguments,
    to_tool_result,
    tool_info,
)
from services.tools.settings import Settings

log = logging.getLogger("chorus.tools")

T = TypeVar("T")


def unreachable_message(label: str) -> str:
    """What the caller learns about a refused or unreachable server: nothing more."""
    return (
        f"MCP server {label!r} could not be reached. If it is on a private or local network, "
        "the operator must allow it (CHORUS_ALLOW_PRIVATE_NETWORKS / CHORUS_ALLOW_LOOPBACK / "
        "CHORUS_ALLOWED_SERVERS)."
    )


def busy_message(label: str) -> str:
    return f"MCP server {label!r} is busy: too many calls to it are in progress. Try again later."


def _invalid(exc: PolicyError) -> BusError:
    return BusError(code=ErrorCode.INVALID_REQUEST, message=str(exc), param="tools")


def _failure(what: str, server: McpServer, exc: BaseException) -> str:
    if isinstance(exc, MCPError):
        return f"{what}: MCP server {server.server_label!r} answered with an error: {exc.error.message}"
    if isinstance(exc, ValidationError):
        return f"{what}: MCP server {server.server_label!r} sent a malformed result"
    return f"{what}: MCP server {server.server_label!r} failed ({describe(exc)})"


class _Failed(Exception):
    """A request that ends with ``error`` (the caller-visible text)."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


class ToolRunner:
    """Lists and calls MCP tools; built once at start-up with the policy, cache and pool."""

    def __init__(
        self, settings: Settings, policy: ServerPolicy, pool: SessionPool, listings: TtlCache[list[McpToolInfo]]
    ) -> None:
        self._settings = settings
        self._policy = policy
        self._pool = pool
        self._listings = listings
        self._gate = ServerGate(
            settings.max_concurrency_per_server, settings.max_waiting_per_server, settings.server_queue_timeout_s
        )
        self._unreachable = RecentlyUnreachable(settings.unreachable_ttl_s)

    async def list_tools(self, req: ListToolsRequest) -> ToolsListed | BusError:
        try:
            server = self._policy.resolve(req.server)
        except PolicyError as exc:
            return _invalid(exc)
        key = server_key(server.server_url, server.headers)
        tools = self._listings.get(key)
        if tools is not None:
            return ToolsListed(server_label=server.server_label, tools=tools)
        timeout = self._settings.list_timeout_s
        timed_out = f"Listing tools timed out after {timeout:g}s: MCP server {server.server_label!r} did not answer"
        try:
            tools = await self._on_server(
                req.request_id, server, key, timeout, self._list_all, "Could not list tools", timed_out
            )
        except _Failed as failed:
            return ToolsListed(server_label=server.server_label, tools=[], error=failed.error)
        self._listings.put(key, tools)
        return ToolsListed(server_label=server.server_label, tools=tools)

    async def _list_all(self, client: Client) -> list[McpToolInfo]:
        tools: list[McpToolInfo] = []
        cursor: str | None = None
        for _ in range(self._settings.max_list_pages):
            page = await client.list_tools(cursor=cursor)
            tools.extend(tool_info(tool) for tool in page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    async def call_tool(self, req: CallToolRequest) -> ToolResult | BusError:
        try:
            server = self._policy.resolve(req.server)
        except PolicyError as exc:
            return _invalid(exc)
        cap = self._settings.max_output_bytes
        try:
            arguments = parse_arguments(req.arguments)
        except InvalidArguments as exc:
            return failure_result(f"Invalid arguments for tool {req.name!r}: {exc}", cap)
        key = server_key(server.server_url, server.headers)
        timeout = max(0.0, min(req.timeout_s, self._settings.max_call_timeout_s))
        timed_out = f"Tool {req.name!r} on MCP server {server.server_label!r} timed out after {timeout:g}s"
        try:
            result = await self._on_server(
                req.request_id,
                server,
                key,
                timeout,
                lambda client: client.call_tool(req.name, arguments),
                f"Tool {req.name!r} failed",
                timed_out,
            )
        except _Failed as failed:
            return failure_result(failed.error, cap)
        return to_tool_result(result, req.name, cap)

    async def _on_server(
        self,
        request_id: str,
        server: McpServer,
        key: ServerKey,
        timeout: float,
        action: Callable[[Client], Awaitable[T]],
        what: str,
        timed_out: str,
    ) -> T:
        """``action`` on a session with ``server`` within ``timeout`` and the server's limits.
        Raises ``_Failed`` with the caller's error text (and logs the details)."""
        where = origin(server.server_url)
        label = server.server_label
        phase: Literal["waiting", "connecting", "running"] = "waiting"
        deadline = asyncio.timeout(timeout)
        try:
            if where in self._unreachable:
                raise ConnectFailed("unreachable moments ago; not trying again yet")
            async with deadline, self._gate.slot(where):
                if where in self._unreachable:  # found out while this call waited
                    raise ConnectFailed("unreachable moments ago; not trying again yet")
                phase = "connecting"
                async with self._pool.session(key, server) as client:
                    phase = "running"
                    self._unreachable.clear(where)
                    return await action(client)
        except ServerBusy as exc:
            error, detail = busy_message(label), str(exc)
        except TimeoutError as exc:
            if not deadline.expired():
                error, detail = _failure(what, server, exc), describe(exc)
            elif phase == "running":
                error, detail = timed_out, timed_out
            elif phase == "connecting":
                error, detail = unreachable_message(label), f"no session within {timeout:g}s"
            else:
                error, detail = busy_message(label), f"no free slot within {timeout:g}s"
        except Exception as exc:  # noqa: BLE001 - any failure of the server, its transport, or its result
            if phase == "running":
                error, detail = _failure(what, server, exc), describe(exc)
            else:  # refused, unreachable, or no handshake: one message for all
                if isinstance(exc, ConnectFailed) and exc.unreachable:
                    self._unreachable.mark(where)
                error, detail = unreachable_message(label), describe(exc)
        log.info("request %s: MCP server %r at %s: %s", request_id, label, where, detail)
        raise _Failed(error)
