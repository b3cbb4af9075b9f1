"""Bus handlers: typed request in, the runner's answer out, each in a span that continues the
caller's trace (from the request's NATS headers): ``tools/list`` and ``execute_tool {name}``.
Requests are answered concurrently (``Bus.reply``), from the tools' queue group."""

from __future__ import annotations

from opentelemetry.trace import Span, SpanKind
from pydantic import TypeAdapter

from contracts.errors import BusError
from contracts.messages.tools import CallToolRequest, ListToolsRequest, ToolResult, ToolsListed
from contracts.subjects import TOOLS_QUEUE
from services.common import telemetry
from services.common.bus import Bus
from services.tools.runner import ToolRunner
from services.tools.settings import Settings

LIST: TypeAdapter[ListToolsRequest] = TypeAdapter(ListToolsRequest)
CALL: TypeAdapter[CallToolRequest] = TypeAdapter(CallToolRequest)


async def register(bus: Bus, settings: Settings, runner: ToolRunner) -> None:
    subjects = settings.subjects
    concurrency = max(2, settings.max_concurrency)

    async def list_tools(req: ListToolsRequest, headers: dict[str, str]) -> ToolsListed | BusError:
        span = telemetry.child_span(
            "tools/list",
            headers,
            SpanKind.SERVER,
            **{"mcp.method.name": "tools/list", "chorus.mcp.server": req.server.server_label},
        )
        try:
            listed = await runner.list_tools(req)
            ended(span, listed)
            return listed
        finally:
            span.end()

    async def call_tool(req: CallToolRequest, headers: dict[str, str]) -> ToolResult | BusError:
        span = telemetry.child_span(
            f"execute_tool {req.name}",
            headers,
            SpanKind.SERVER,
            **{
                telemetry.GEN_AI_OPERATION: "execute_tool",
                telemetry.GEN_AI_TOOL_NAME: req.name,
                telemetry.GEN_AI_TOOL_TYPE: "extension",
                "mcp.method.name": "tools/call",
                "chorus.mcp.server": req.server.server_label,
            },
        )
        try:
            result = await runner.call_tool(req)
            ended(span, result)
            return result
        finally:
            span.end()

    await bus.reply(subjects.tools_list, LIST, list_tools, queue=TOOLS_QUEUE, concurrency=concurrency)
    await bus.reply(subjects.tools_call, CALL, call_tool, queue=TOOLS_QUEUE, concurrency=concurrency)


def ended(span: Span, answer: ToolsListed | ToolResult | BusError) -> None:
    """A refused request, an unreachable server or a failed tool marks the span failed."""
    if isinstance(answer, BusError):
        telemetry.failed(span, answer.code.value, answer.message)
    elif answer.error is not None:
        telemetry.failed(span, "tool_error", answer.error)
