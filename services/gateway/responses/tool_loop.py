"""The Responses tool loop: what runs between model turns.

MCP servers are listed before the first turn (a disallowed server is a 400 before anything
streams) and approved calls from an earlier response run then. After each turn, the MCP calls
and gpt-oss built-in calls (browser, python) the model made run concurrently; their results
go back to the model on the next turn. Calls that need approval, and calls to the client's own
functions, end the response instead. ``max_tool_calls`` and the server's cap bound the loop."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from contracts.messages.items import (
    ConversationItem,
    FunctionCallItem,
    McpApprovalRequestItem,
    McpApprovalResponseItem,
    McpCallItem,
)
from services.gateway.context import GatewayContext
from services.gateway.errors import invalid
from services.gateway.responses.events import Event, EventWriter
from services.gateway.responses.items import new_id
from services.gateway.responses.mcp import McpTooling, run_builtin
from services.gateway.responses.request import McpToolParam


@dataclass
class ToolLoop:
    ctx: GatewayContext
    response_id: str
    max_tool_calls: int | None
    mcp: McpTooling | None = None
    calls_run: int = 0
    # what an output index contributes to the conversation when it is more than its item
    # (a built-in call and its result), for the next turn's prompt
    history: dict[int, list[ConversationItem]] = field(default_factory=dict)

    @classmethod
    def for_request(
        cls, ctx: GatewayContext, response_id: str, mcp_tools: list[McpToolParam], max_tool_calls: int | None
    ) -> ToolLoop:
        return cls(ctx, response_id, max_tool_calls, McpTooling(ctx, response_id, mcp_tools) if mcp_tools else None)

    @property
    def labels(self) -> list[str]:
        return self.mcp.labels if self.mcp else []

    async def prelude(
        self, writer: EventWriter, context: list[ConversationItem], inputs: list[ConversationItem]
    ) -> list[Event]:
        """List the MCP servers' tools, then run what the caller approved."""
        if self.mcp is None:
            return []
        events: list[Event] = []
        for listing in await self.mcp.list_all():
            events += writer.add_item(listing)
        events += await self._approved(writer, context, inputs)
        return events

    async def relist(self) -> None:
        """The servers' tools again, for a run taken over (its listing items are in its output)."""
        if self.mcp is not None:
            await self.mcp.list_all()

    async def _approved(
        self, writer: EventWriter, context: list[ConversationItem], inputs: list[ConversationItem]
    ) -> list[Event]:
        assert self.mcp is not None
        asked = {i.id: i for i in context if isinstance(i, McpApprovalRequestItem)}
        events: list[Event] = []
        for answer in inputs:
            if not isinstance(answer, McpApprovalResponseItem):
                continue
            request = asked.get(answer.approval_request_id)
            if request is None:
                raise invalid(
                    f"No mcp_approval_request with id '{answer.approval_request_id}' in this conversation.", "input"
                )
            call = McpCallItem(
                id=new_id("mcp"),
                server_label=request.server_label,
                name=request.name,
                arguments=request.arguments,
                approval_request_id=request.id,
            )
            if answer.approve:
                call = await self.mcp.call(call)
                self.calls_run += 1
            else:
                call = call.model_copy(
                    update={
                        "error": "The user declined this tool call." + (f" ({answer.reason})" if answer.reason else "")
                    }
                )
            events += writer.add_item(call)
        return events

    async def after_turn(self, writer: EventWriter) -> tuple[bool, list[Event]]:
        """Run the calls the model just made; (generate again?, events)."""
        builtin_events, ran_builtin = await self._builtins(writer)
        called, writer.called_mcp = writer.called_mcp, []
        if not called or self.mcp is None:
            return ran_builtin, builtin_events
        runnable: list[tuple[int, McpCallItem]] = []
        refused: list[tuple[int, McpCallItem]] = []
        for index, item in called:
            if self.max_tool_calls is not None and self.calls_run + len(runnable) >= self.max_tool_calls:
                refused.append((index, item.model_copy(update={"error": "max_tool_calls reached"})))
            else:
                runnable.append((index, item))
        mcp = self.mcp
        results = await asyncio.gather(*(mcp.call(item) for _, item in runnable))
        self.calls_run += len(runnable)
        events = builtin_events
        for (index, _), done in zip(runnable, results, strict=True):
            events += writer.complete_mcp(index, done)
        for index, done in refused:
            events += writer.complete_mcp(index, done)
        this_turn = writer.out.turn_items()
        waiting = any(isinstance(i, McpApprovalRequestItem) for i in this_turn)
        client_calls = any(
            isinstance(i, FunctionCallItem) and i.namespace not in ("browser", "python", "container") for i in this_turn
        )
        return bool(runnable) and not refused and not waiting and not client_calls, events

    async def _builtins(self, writer: EventWriter) -> tuple[list[Event], bool]:
        """This turn's browser/python calls, on the MCP servers configured for them; their
        results go back to the model as Harmony tool messages."""
        calls, writer.called_builtin = writer.called_builtin, []
        configured = self.ctx.settings.builtin_tools
        runnable = [(i, c) for i, c in calls if c.namespace in configured and c.status != "incomplete"]
        if not runnable:
            return [], False
        results = await asyncio.gather(*(run_builtin(self.ctx, self.response_id, c) for _, c in runnable))
        events: list[Event] = []
        for (index, call), output in zip(runnable, results, strict=True):
            self.history[index] = [call, output]
            events += writer.complete_search(index, ok=True)
        self.calls_run += len(runnable)
        return events, True

    def finish(self, writer: EventWriter) -> list[Event]:
        """Searches that never ran (the response ended first) are closed as failed."""
        events: list[Event] = []
        for index in list(writer.searching):
            events += writer.complete_search(index, ok=False)
        return events
