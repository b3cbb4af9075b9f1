"""The tools service as the tools tests run it: over real NATS, with a fake resolver, and a
client speaking to it the way the gateway does."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

from pydantic import TypeAdapter

from contracts.messages.tools import (
    CallToolReply,
    CallToolRequest,
    ListToolsReply,
    ListToolsRequest,
    McpServer,
    ToolResult,
    ToolsListed,
)
from services.common import bus
from services.tools.app import run
from services.tools.runner import unreachable_message
from services.tools.settings import Settings
from tests.tools.fakes import FakeResolver

LIST_REPLY: TypeAdapter[Any] = TypeAdapter(ListToolsReply)
CALL_REPLY: TypeAdapter[Any] = TypeAdapter(CallToolReply)
# what a caller is told of a server it cannot use, whatever the reason (`mcp`'s label)
UNREACHABLE = unreachable_message("test")


class Tools:
    """A client of the tools service, the way the gateway talks to it."""

    def __init__(self, nc: Any, settings: Settings) -> None:
        self.nc = nc
        self.settings = settings

    async def list(self, server: McpServer) -> ToolsListed:
        rid = uuid.uuid4().hex
        req = ListToolsRequest(request_id=rid, server=server)
        reply: ToolsListed = await bus.Bus(self.nc, self.settings.subjects).request(
            self.settings.subjects.tools_list, req, LIST_REPLY, timeout=10, service="tools"
        )
        return reply

    async def call(self, server: McpServer, name: str, arguments: str = "{}", **kw: Any) -> ToolResult:
        rid = uuid.uuid4().hex
        req = CallToolRequest(request_id=rid, server=server, name=name, arguments=arguments, **kw)
        reply: ToolResult = await bus.Bus(self.nc, self.settings.subjects).request(
            self.settings.subjects.tools_call, req, CALL_REPLY, timeout=10, service="tools"
        )
        return reply


@contextlib.asynccontextmanager
async def tools_service(
    nats_url: str, namespace: str, resolver: FakeResolver | None = None, **overrides: Any
) -> AsyncIterator[Tools]:
    """The tools service as `chorus up` on 127.0.0.1 runs it (loopback MCP servers allowed,
    unless ``overrides`` say otherwise), with a fake resolver: no test looks up a real name."""
    settings = Settings(nats_url=nats_url, namespace=namespace, **{"allow_loopback": True, **overrides})
    resolver = resolver or FakeResolver({"localhost": ["127.0.0.1"]})
    stop, ready = asyncio.Event(), asyncio.Event()
    nc = await bus.connect(nats_url, "tools-test")
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(run(settings, stop, ready=ready, resolve=resolver))
            try:
                async with asyncio.timeout(5):
                    await ready.wait()
                yield Tools(nc, settings)
            finally:
                stop.set()
    finally:
        await nc.close()


def mcp(url: str, **headers: str) -> McpServer:
    return McpServer(server_label="test", server_url=url, headers=headers)
