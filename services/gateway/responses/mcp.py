"""MCP tools in a Responses request: listing (through the tools service), what the model may
see, which calls need the caller's approval, and executing calls (concurrently)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from pydantic import TypeAdapter

from contracts.messages.encode import FunctionTool, ToolNamespace
from contracts.messages.items import (
    FunctionCallItem,
    FunctionCallOutputItem,
    McpCallItem,
    McpListToolsItem,
    McpToolInfo,
)
from contracts.messages.tools import (
    BUILTIN_URL_SCHEME,
    CallToolReply,
    CallToolRequest,
    ListToolsReply,
    ListToolsRequest,
    McpServer,
    ToolResult,
    ToolsListed,
)
from services.common.errors import ChorusError
from services.common.metrics import TOOL_CALLS
from services.gateway.context import GatewayContext
from services.gateway.responses.items import new_id
from services.gateway.responses.request import McpAllowedToolsFilter, McpApprovalFilter, McpToolParam

_LIST: TypeAdapter[ListToolsReply] = TypeAdapter(ListToolsReply)
_CALL: TypeAdapter[CallToolReply] = TypeAdapter(CallToolReply)
TOOL_TIMEOUT_S = 30.0


def matches(filter_: McpAllowedToolsFilter | None, tool: McpToolInfo) -> bool:
    """Does ``tool`` pass an MCP tool filter (by name, or by its read-only hint)?"""
    if filter_ is None:
        return False
    if filter_.tool_names is not None and tool.name in filter_.tool_names:
        return True
    read_only = bool((tool.annotations or {}).get("readOnlyHint"))
    return filter_.read_only is not None and filter_.read_only == read_only and filter_.tool_names is None


@dataclass
class McpServerTools:
    param: McpToolParam
    server: McpServer
    tools: list[McpToolInfo] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.param.server_label

    def allowed(self, tool: McpToolInfo) -> bool:
        allowed = self.param.allowed_tools
        if allowed is None:
            return True
        if isinstance(allowed, list):
            return tool.name in allowed
        return matches(allowed, tool) or (allowed.tool_names is None and allowed.read_only is None)

    def needs_approval(self, name: str) -> bool:
        policy = self.param.require_approval
        if policy is None or policy == "always":
            return True
        if policy == "never":
            return False
        assert isinstance(policy, McpApprovalFilter)
        tool = next((t for t in self.tools if t.name == name), McpToolInfo(name=name))
        return not matches(policy.never, tool)


def _server(param: McpToolParam) -> McpServer:
    headers = dict(param.headers or {})
    if param.authorization:
        token = param.authorization
        headers["Authorization"] = token if token.lower().startswith("bearer ") else f"Bearer {token}"
    return McpServer(
        server_label=param.server_label,
        server_url=param.server_url or "",
        headers=headers,
        server_description=param.server_description,
    )


class McpTooling:
    def __init__(self, ctx: GatewayContext, request_id: str, params: list[McpToolParam]) -> None:
        self.ctx = ctx
        self.request_id = request_id
        self.servers = {p.server_label: McpServerTools(p, _server(p)) for p in params}

    @property
    def labels(self) -> list[str]:
        return list(self.servers)

    async def list_all(self) -> list[McpListToolsItem]:
        """List every server's tools (concurrently). A server_url wrong on its face raises (400);
        a refused or unreachable server is an item with ``error`` (the same for both)."""

        async def one(s: McpServerTools) -> McpListToolsItem:
            listed = await self.ctx.bus.request(
                self.ctx.bus.subjects.tools_list,
                ListToolsRequest(request_id=self.request_id, server=s.server),
                _LIST,
                timeout=TOOL_TIMEOUT_S,
                service="tools",
            )
            assert isinstance(listed, ToolsListed)
            s.tools = [t for t in listed.tools if s.allowed(t)]
            return McpListToolsItem(
                id=new_id("mcpl"), server_label=s.label, tools=s.tools, error=getattr(listed, "error", None)
            )

        return list(await asyncio.gather(*(one(s) for s in self.servers.values())))

    def namespaces(self) -> list[ToolNamespace]:
        return [
            ToolNamespace(
                name=s.label,
                description=s.param.server_description,
                tools=[
                    FunctionTool(name=t.name, description=t.description, parameters=t.input_schema) for t in s.tools
                ],
            )
            for s in self.servers.values()
            if s.tools
        ]

    def needs_approval(self, label: str, name: str) -> bool:
        s = self.servers.get(label)
        return s is not None and s.needs_approval(name)

    def known(self, label: str, name: str) -> bool:
        s = self.servers.get(label)
        return s is not None and any(t.name == name for t in s.tools)

    async def call(self, item: McpCallItem) -> McpCallItem:
        s = self.servers.get(item.server_label)
        if s is None or not self.known(item.server_label, item.name):
            return item.model_copy(
                update={
                    "error": f"Tool '{item.name}' is not available on server '{item.server_label}'.",
                    "status": "completed",
                }
            )
        result = await call_tool(self.ctx, self.request_id, s.server, item.name, item.arguments or "{}")
        return item.model_copy(update={"output": result.output, "error": result.error, "status": "completed"})


async def call_tool(ctx: GatewayContext, request_id: str, server: McpServer, name: str, arguments: str) -> ToolResult:
    """One tool call through the tools service; a bus failure is a result with ``error``."""
    timeout = ctx.settings.mcp_call_timeout_s
    try:
        result = await ctx.bus.request(
            ctx.bus.subjects.tools_call,
            CallToolRequest(request_id=request_id, server=server, name=name, arguments=arguments, timeout_s=timeout),
            _CALL,
            timeout=timeout + 5,
            service="tools",
        )
    except ChorusError as exc:
        TOOL_CALLS.labels(server_kind(server), "unavailable").inc()
        return ToolResult(error=exc.error.message)
    assert isinstance(result, ToolResult)
    TOOL_CALLS.labels(server_kind(server), "ok" if result.error is None else "error").inc()
    return result


def server_kind(server: McpServer) -> str:
    """A metric label with bounded values: the built-in's name, or ``mcp`` for the servers
    requests name (their labels are the caller's to choose)."""
    url = server.server_url
    return url.removeprefix(BUILTIN_URL_SCHEME) if url.startswith(BUILTIN_URL_SCHEME) else "mcp"


async def run_builtin(ctx: GatewayContext, request_id: str, call: FunctionCallItem) -> FunctionCallOutputItem:
    """A gpt-oss built-in call (``browser.search``/``open``/``find``, ``python``) on the MCP
    server configured for it. The python tool receives the model's code as ``{"code": ...}``."""
    if call.namespace == "python":
        name, arguments = "python", json.dumps({"code": call.arguments})
    else:
        name, arguments = call.name, call.arguments or "{}"
    result = await call_tool(ctx, request_id, McpServer.builtin(call.namespace), name, arguments)
    text = result.output if result.error is None else f"Error: {result.error}"
    return FunctionCallOutputItem(call_id=call.call_id, output=text or "", id=new_id("fco"))
