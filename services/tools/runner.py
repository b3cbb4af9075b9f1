"""What the tools service does with a request: check the server against the policy, then list
tools (through the listing cache) or call one, over a pooled MCP session.

Failures are results, not crashes: an unreachable server, a tool error, a timeout, bad
arguments or an oversized response become ``ToolResult(error=...)`` (or
``ToolsListed(error=...)``) for the model to read. Only a request that must not be served (a
server URL outside the allowlist, an unknown built-in, malformed headers) is a ``BusError``.
"""

from __future__ import annotations

import asyncio
import logging

from mcp import Client
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from contracts.errors import BusError, ErrorCode
from contracts.messages.items import McpToolInfo
from contracts.messages.tools import (
    CallToolRequest,
    ListToolsRequest,
    McpServer,
    ToolResult,
    ToolsListed,
)
from services.tools.cache import TtlCache, server_key
from services.tools.mcp_client import ConnectFailed, SessionPool
from services.tools.policy import PolicyError, ServerPolicy
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


def _invalid(exc: PolicyError) -> BusError:
    return BusError(code=ErrorCode.INVALID_REQUEST, message=str(exc), param="tools")


def _failure(what: str, server: McpServer, exc: BaseException) -> str:
    if isinstance(exc, ConnectFailed):
        return f"{what}: could not connect to MCP server {server.server_label!r} ({exc})"
    if isinstance(exc, MCPError):
        return f"{what}: MCP server {server.server_label!r} answered with an error: {exc.error.message}"
    if isinstance(exc, ValidationError):
        return f"{what}: MCP server {server.server_label!r} sent a malformed result"
    return f"{what}: MCP server {server.server_label!r} failed ({describe(exc)})"


class ToolRunner:
    """Lists and calls MCP tools; built once at start-up with the policy, cache and pool."""

    def __init__(
        self,
        settings: Settings,
        policy: ServerPolicy,
        pool: SessionPool,
        listings: TtlCache[list[McpToolInfo]],
    ) -> None:
        self._settings = settings
        self._policy = policy
        self._pool = pool
        self._listings = listings

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
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline, self._pool.session(key, server) as client:
                tools = await self._list_all(client)
        except TimeoutError as exc:
            if not deadline.expired():
                return self._list_failed(req, server, _failure("Could not list tools", server, exc))
            error = f"Listing tools timed out after {timeout:g}s: MCP server {server.server_label!r} did not answer"
            return self._list_failed(req, server, error)
        except Exception as exc:  # any failure of the server or its transport
            return self._list_failed(req, server, _failure("Could not list tools", server, exc))
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

    def _list_failed(self, req: ListToolsRequest, server: McpServer, error: str) -> ToolsListed:
        log.info("request %s: %s", req.request_id, error)
        return ToolsListed(server_label=server.server_label, tools=[], error=error)

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
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline, self._pool.session(key, server) as client:
                result = await client.call_tool(req.name, arguments)
        except TimeoutError as exc:
            if not deadline.expired():
                return self._call_failed(req, _failure(f"Tool {req.name!r} failed", server, exc), cap)
            error = f"Tool {req.name!r} on MCP server {server.server_label!r} timed out after {timeout:g}s"
            return self._call_failed(req, error, cap)
        except Exception as exc:  # any failure of the server, its transport, or its result
            return self._call_failed(req, _failure(f"Tool {req.name!r} failed", server, exc), cap)
        return to_tool_result(result, req.name, cap)

    def _call_failed(self, req: CallToolRequest, error: str, cap: int) -> ToolResult:
        log.info("request %s: %s", req.request_id, error)
        return failure_result(error, cap)
