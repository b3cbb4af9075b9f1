"""Bus handlers: typed request in, the runner's answer out, each in a span that continues the
caller's trace (from the request's NATS headers): ``tools/list`` and ``execute_tool {name}``."""

from __future__ import annotations

from faststream.nats import NatsBroker
from faststream.nats.annotations import NatsMessage
from opentelemetry.trace import Span, SpanKind

from contracts.errors import BusError
from contracts.messages.tools import CallToolRequest, ListToolsRequest, ToolResult, ToolsListed
from contracts.subjects import TOOLS_QUEUE
from services.common import telemetry
from services.tools.runner import ToolRunner
from services.tools.settings import Settings


def register(broker: NatsBroker, settings: Settings, runner: ToolRunner) -> None:
    subjects = settings.subjects
    workers = max(2, settings.max_concurrency)

    @broker.subscriber(subjects.tools_list, queue=TOOLS_QUEUE, max_workers=workers)
    async def list_tools(req: ListToolsRequest, msg: NatsMessage) -> ToolsListed | BusError:
        span = telemetry.child_span(
            "tools/list",
            msg.headers,
            SpanKind.SERVER,
            **{"mcp.method.name": "tools/list", "chorus.mcp.server": req.server.server_label},
        )
        try:
            listed = await runner.list_tools(req)
            ended(span, listed)
            return listed
        finally:
            span.end()

    @broker.subscriber(subjects.tools_call, queue=TOOLS_QUEUE, max_workers=workers)
    async def call_tool(req: CallToolRequest, msg: NatsMessage) -> ToolResult | BusError:
        span = telemetry.child_span(
            f"execute_tool {req.name}",
            msg.headers,
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


def ended(span: Span, answer: ToolsListed | ToolResult | BusError) -> None:
    """A refused request, an unreachable server or a failed tool marks the span failed."""
    if isinstance(answer, BusError):
        telemetry.failed(span, answer.code.value, answer.message)
    elif answer.error is not None:
        telemetry.failed(span, "tool_error", answer.error)
