"""Bus handlers: typed request in, the runner's answer out."""

from __future__ import annotations

from faststream.nats import NatsBroker

from contracts.errors import BusError
from contracts.messages.tools import CallToolRequest, ListToolsRequest, ToolResult, ToolsListed
from contracts.subjects import TOOLS_QUEUE
from services.tools.runner import ToolRunner
from services.tools.settings import Settings


def register(broker: NatsBroker, settings: Settings, runner: ToolRunner) -> None:
    subjects = settings.subjects
    workers = max(2, settings.max_concurrency)

    @broker.subscriber(subjects.tools_list, queue=TOOLS_QUEUE, max_workers=workers)
    async def list_tools(req: ListToolsRequest) -> ToolsListed | BusError:
        return await runner.list_tools(req)

    @broker.subscriber(subjects.tools_call, queue=TOOLS_QUEUE, max_workers=workers)
    async def call_tool(req: CallToolRequest) -> ToolResult | BusError:
        return await runner.call_tool(req)
