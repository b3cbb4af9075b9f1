"""gateway -> tools: list an MCP server's tools, call one."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from contracts.errors import BusError
from contracts.messages.base import Contract
from contracts.messages.items import McpToolInfo

BUILTIN_URL_SCHEME = "builtin:"


class McpServer(Contract):
    """An MCP server to reach. ``headers`` go to this server only. A ``server_url`` of the
    form ``builtin:<name>`` names a built-in tool server that the tools service resolves
    from its ``builtin_tools`` setting (see ``McpServer.builtin``)."""

    server_label: str
    server_url: str
    headers: dict[str, str] = Field(default_factory=dict)
    server_description: str | None = None

    @classmethod
    def builtin(cls, name: str, server_label: str | None = None) -> McpServer:
        """A reference to the built-in tool server ``name`` (e.g. "browser", "python")."""
        return cls(server_label=server_label or name, server_url=f"{BUILTIN_URL_SCHEME}{name}")


class ListToolsRequest(Contract):
    kind: Literal["list_tools"] = "list_tools"
    request_id: str
    server: McpServer


class ToolsListed(Contract):
    """A server's tools. When the server could not be listed (unreachable, timed out, protocol
    error), ``tools`` is empty and ``error`` says why, like ``McpListToolsItem.error``."""

    kind: Literal["tools_listed"] = "tools_listed"
    server_label: str
    tools: list[McpToolInfo]
    error: str | None = None


ListToolsReply = Annotated[ToolsListed | BusError, Field(discriminator="kind")]


class CallToolRequest(Contract):
    kind: Literal["call_tool"] = "call_tool"
    request_id: str
    server: McpServer
    name: str
    arguments: str  # JSON text as the model wrote it
    timeout_s: float = 30.0


class ToolResult(Contract):
    """A tool's outcome. A failure (unreachable, tool error, timeout, bad arguments) is a
    result with ``error`` set, not a bus error: the model is told and the loop goes on."""

    kind: Literal["tool_result"] = "tool_result"
    output: str | None = None
    error: str | None = None
    truncated: bool = False


CallToolReply = Annotated[ToolResult | BusError, Field(discriminator="kind")]
