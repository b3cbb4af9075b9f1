"""One Responses API request, from conversation assembly to the final response object.

``ResponseRun.events()`` yields lists of stream events (one list per parser batch); the same
run serves streamed, non-streamed and background requests. It loops over model turns so a tool
loop (MCP) can feed tool results back and generate again; usage and ``max_output_tokens`` are
accounted over the whole response, not per turn."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from contracts.messages.encode import EncodeRequest, FunctionTool, NamedToolChoice
from contracts.messages.generate import SamplingParams
from contracts.messages.items import (
    ConversationItem,
    FunctionCallItem,
    McpApprovalRequestItem,
    McpApprovalResponseItem,
    McpCallItem,
)
from contracts.messages.parse import Failed, Finished, Usage
from services.gateway.context import GatewayContext
from services.gateway.errors import ApiError, not_found
from services.gateway.responses import convert
from services.gateway.responses.events import Event, EventWriter
from services.gateway.responses.mcp import McpTooling
from services.gateway.responses.models import NamedFunction, ResponsesRequest
from services.gateway.store import StoredResponse


@dataclass
class Prepared:
    request: ResponsesRequest
    response_id: str
    created_at: int
    context: list[ConversationItem]  # what earlier turns left: previous response or conversation
    input_items: list[ConversationItem]


async def prepare(ctx: GatewayContext, req: ResponsesRequest) -> Prepared:
    ctx.check_model(req.model)
    req.parsed_tools()  # validate tools up front: a bad tool is a 400 before anything runs
    store = ctx.store
    context: list[ConversationItem] = []
    if req.previous_response_id:
        previous = await store.get_response(req.previous_response_id)
        if previous is None:
            raise not_found(f"Previous response with id '{req.previous_response_id}' not found "
                            "(it may have been deleted, expired, or created with store: false).",
                            "previous_response_id")
        context = list(previous.history)
    elif req.conversation_id:
        if await store.get_conversation(req.conversation_id) is None:
            raise not_found(f"Conversation with id '{req.conversation_id}' not found.", "conversation")
        context = await store.conversation_items(req.conversation_id)
    references: dict[str, ConversationItem] = {}
    if isinstance(req.input, list):
        for entry in req.input:
            if isinstance(entry, dict) and entry.get("type") == "item_reference" and entry.get("id"):
                item = await store.get_item(entry["id"])
                if item is not None:
                    references[entry["id"]] = item
    return Prepared(req, convert.new_id("resp"), int(time.time()), context,
                    convert.input_items(req.input, references))


@dataclass
class ResponseRun:
    ctx: GatewayContext
    p: Prepared
    writer: EventWriter = field(default_factory=EventWriter)
    usage: Usage = field(default_factory=Usage)
    status: str = "in_progress"
    error: dict[str, Any] | None = None
    incomplete_reason: str | None = None
    tooling: McpTooling | None = None
    tool_calls_run: int = 0
    # built-in tool calls the model made, as it made them, with their results (by output_index)
    tool_history: dict[int, list[ConversationItem]] = field(default_factory=dict)

    @property
    def request(self) -> ResponsesRequest:
        return self.p.request

    # -- the response object -------------------------------------------------------------
    def response(self, status: str | None = None) -> dict[str, Any]:
        req, p = self.request, self.p
        tool_choice: Any = req.tool_choice or "auto"
        if isinstance(tool_choice, NamedFunction):
            tool_choice = tool_choice.model_dump()
        status = status or self.status
        terminal = status in ("completed", "incomplete", "failed", "cancelled")
        u = self.usage
        return {
            "id": p.response_id,
            "object": "response",
            "created_at": p.created_at,
            "completed_at": int(time.time()) if status == "completed" else None,
            "status": status,
            "background": bool(req.background),
            "model": req.model,
            "output": [convert.output_json(i) for i in self.writer.output] if terminal else [],
            "parallel_tool_calls": req.parallel_tool_calls if req.parallel_tool_calls is not None else True,
            "tool_choice": tool_choice,
            "tools": req.tools or [],
            "instructions": req.instructions,
            "metadata": req.metadata or {},
            "temperature": req.temperature,
            "top_p": req.top_p,
            "max_output_tokens": req.max_output_tokens,
            "max_tool_calls": req.max_tool_calls,
            "previous_response_id": req.previous_response_id,
            "conversation": {"id": req.conversation_id} if req.conversation_id else None,
            "reasoning": {"effort": (req.reasoning.effort if req.reasoning else None) or "medium", "summary": None},
            "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "truncation": "disabled",
            "store": req.store is not False,
            "user": req.user,
            "error": self.error,
            "incomplete_details": {"reason": self.incomplete_reason} if status == "incomplete" else None,
            "usage": {
                "input_tokens": u.prompt_tokens,
                "input_tokens_details": {"cached_tokens": u.cached_tokens or 0},
                "output_tokens": u.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
                "total_tokens": u.prompt_tokens + u.completion_tokens,
            } if terminal else None,
        }

    # -- generation -----------------------------------------------------------------------
    def _encode(self, items: list[ConversationItem]) -> EncodeRequest:
        req = self.request
        choice: Any = req.tool_choice or "auto"
        if isinstance(choice, NamedFunction):
            choice = NamedToolChoice(name=choice.name)
        return EncodeRequest(
            request_id=self.p.response_id,
            model=req.model,
            items=items,
            instructions=req.instructions,
            tools=[FunctionTool(name=t.name, description=t.description, parameters=t.parameters)
                   for t in req.function_tools()],
            tool_choice=choice,
            namespaces=self.tooling.namespaces() if self.tooling else [],
            builtin_tools=self.request.builtin_tools(),  # type: ignore[arg-type]
            reasoning_effort=(req.reasoning.effort if req.reasoning else None) or "medium",
        )

    def _sampling(self) -> SamplingParams | None:
        req = self.request
        limit = req.max_output_tokens
        if limit is not None:
            limit -= self.usage.completion_tokens
            if limit <= 0:
                return None
        return SamplingParams(max_tokens=limit or self.ctx.settings.default_max_tokens,
                              temperature=req.temperature, top_p=req.top_p, seed=req.seed)

    def _add_usage(self, u: Usage) -> None:
        a = self.usage
        cached = None if a.cached_tokens is None and u.cached_tokens is None else (a.cached_tokens or 0) + (u.cached_tokens or 0)
        self.usage = Usage(prompt_tokens=a.prompt_tokens + u.prompt_tokens,
                           completion_tokens=a.completion_tokens + u.completion_tokens,
                           reasoning_tokens=a.reasoning_tokens + u.reasoning_tokens, cached_tokens=cached)

    def conversation_so_far(self) -> list[ConversationItem]:
        out: list[ConversationItem] = [*self.p.context, *self.p.input_items]
        for index, item in self.writer.indexed_output():
            out.extend(self.tool_history.get(index, [item]))
        return out

    async def events(self) -> AsyncIterator[list[Event]]:
        """The whole response as event batches. Failures before the first token raise (so the
        HTTP layer can answer with a status code); later ones end the stream as failed."""
        w = self.writer
        tools = self.request.function_tools()
        names = [t.name for t in tools]
        schemas = {t.name: t.parameters or {} for t in tools}
        if self.request.tool_choice == "none":
            names, schemas = [], {}
        prelude: list[Event] = []
        missing = [b for b in self.request.builtin_tools() if b not in self.ctx.settings.builtin_tools]
        if missing:
            from services.gateway.errors import invalid

            kind = "web_search" if missing[0] == "browser" else "code_interpreter"
            raise invalid(f"The {kind} tool is not configured on this server (start Chorus with "
                          f"--builtin-tool {missing[0]}=URL of an MCP server).", "tools")
        mcp_params = self.request.mcp_tools()
        if mcp_params:
            # listing happens before anything is streamed: a disallowed server is a 400
            self.tooling = McpTooling(self.ctx, self.p.response_id, mcp_params)
            listings = await self.tooling.list_all()
            w.mcp_labels = frozenset(self.tooling.labels)
            w.needs_approval = self.tooling.needs_approval
            for listing in listings:
                prelude += w.add_item(listing)
            prelude += await self._approved_calls()
            w.next_turn()
        max_turns = self.ctx.settings.max_tool_iterations
        for turn in range(max_turns):
            sampling = self._sampling()
            if sampling is None:
                self.status, self.incomplete_reason = "incomplete", "max_output_tokens"
                break
            namespaces = self.tooling.labels if self.tooling else []
            start = self.ctx.pipeline.start(self.p.response_id, self._encode(self.conversation_so_far()),
                                            sampling, tool_names=names, tool_schemas=schemas,
                                            namespaces=namespaces, turn=turn)
            if turn == 0:
                async with start as generation:
                    created = [w.event("response.created", response=self.response("in_progress")),
                               w.event("response.in_progress", response=self.response("in_progress"))]
                    # sequence numbers: created/in_progress come first, then the listings
                    yield _renumber(created + prelude)
                    async for batch in self._turn(generation):
                        yield batch
            else:
                try:
                    async with start as generation:
                        async for batch in self._turn(generation):
                            yield batch
                except Exception as exc:  # noqa: BLE001 - a later turn failing fails the response
                    self._fail(getattr(getattr(exc, "error", None), "message", str(exc)))
            if self.status != "in_progress":
                break
            again, events = await self._tool_turn()
            if events:
                yield events
            if not again:
                break
            w.next_turn()
        leftovers: list[Event] = []
        for index in list(w.pending_search):
            leftovers += w.complete_search(index, ok=False)
        if leftovers:
            yield leftovers
        if self.status == "in_progress":
            self.status = "completed"
        yield self._final()

    async def _turn(self, generation: Any) -> AsyncIterator[list[Event]]:
        w = self.writer
        async for batch in generation.batches():
            out: list[Event] = []
            for event in batch:
                if isinstance(event, Finished):
                    self._add_usage(event.usage)
                    out += w.close_open()
                    if event.finish_reason == "length":
                        self.status, self.incomplete_reason = "incomplete", "max_output_tokens"
                    elif event.finish_reason == "abort":
                        cancelled = await self.ctx.store.cancel_requested(self.p.response_id)
                        if cancelled:
                            self.status = "cancelled"
                        else:
                            self.status, self.incomplete_reason = "incomplete", "interrupted"
                elif isinstance(event, Failed):
                    self._add_usage(event.usage)
                    out += w.close_open()
                    self._fail(event.error.message)
                else:
                    out += w.handle(event)
            if out:
                yield out

    def _fail(self, message: str) -> None:
        self.status = "failed"
        self.error = {"code": "server_error", "message": message}

    async def _tool_turn(self) -> tuple[bool, list[Event]]:
        """Run the MCP tools the model just called (concurrently); (generate again?, events).
        Calls that need approval, or a client function call, end the response instead."""
        w = self.writer
        builtin_events, ran_builtin = await self._run_builtins()
        pending, w.pending_mcp = w.pending_mcp, []
        if not pending or self.tooling is None:
            return ran_builtin, builtin_events
        limit = self.request.max_tool_calls
        runnable: list[tuple[int, McpCallItem]] = []
        refused: list[tuple[int, McpCallItem]] = []
        for index, item in pending:
            if limit is not None and self.tool_calls_run + len(runnable) >= limit:
                refused.append((index, item.model_copy(update={"error": "max_tool_calls reached"})))
            else:
                runnable.append((index, item))
        results = await asyncio.gather(*(self.tooling.call(item) for _, item in runnable))
        self.tool_calls_run += len(runnable)
        events: list[Event] = []
        for (index, _), done in zip(runnable, results, strict=True):
            events += w.complete_mcp(index, done)
        for index, done in refused:
            events += w.complete_mcp(index, done)
        events = builtin_events + events
        this_turn = w.turn_items()
        waiting = any(isinstance(i, McpApprovalRequestItem) for i in this_turn)
        client_calls = any(isinstance(i, FunctionCallItem) and i.namespace == "functions" for i in this_turn)
        return bool(runnable) and not refused and not waiting and not client_calls, events

    async def _run_builtins(self) -> tuple[list[Event], bool]:
        """Run this turn's browser/python calls on the configured MCP servers; their results go
        back to the model as Harmony tool messages."""
        w = self.writer
        calls, w.builtin_calls = w.builtin_calls, []
        configured = self.ctx.settings.builtin_tools
        runnable = [(i, c) for i, c in calls if c.namespace in configured and c.status != "incomplete"]
        if not runnable:
            return [], False
        from services.gateway.responses.mcp import run_builtin

        results = await asyncio.gather(*(run_builtin(self.ctx, self.p.response_id, c) for _, c in runnable))
        events: list[Event] = []
        for (index, call), output in zip(runnable, results, strict=True):
            self.tool_history[index] = [call, output]
            events += w.complete_search(index, ok=True)
        self.tool_calls_run += len(runnable)
        return events, True

    async def _approved_calls(self) -> list[Event]:
        """mcp_approval_response input items: run what was approved, decline the rest."""
        assert self.tooling is not None
        requests = {i.id: i for i in self.p.context if isinstance(i, McpApprovalRequestItem)}
        events: list[Event] = []
        for answer in self.p.input_items:
            if not isinstance(answer, McpApprovalResponseItem):
                continue
            asked = requests.get(answer.approval_request_id)
            if asked is None:
                from services.gateway.errors import invalid

                raise invalid(f"No mcp_approval_request with id '{answer.approval_request_id}' in this "
                              "conversation.", "input")
            call = McpCallItem(id=convert.new_id("mcp"), server_label=asked.server_label, name=asked.name,
                               arguments=asked.arguments, approval_request_id=asked.id)
            if answer.approve:
                call = await self.tooling.call(call)
                self.tool_calls_run += 1
            else:
                call = call.model_copy(update={"error": "The user declined this tool call."
                                               + (f" ({answer.reason})" if answer.reason else "")})
            events += self.writer.add_item(call)
        return events

    def _final(self) -> list[Event]:
        # the stream protocol has no "cancelled" event: a cancelled response ends with
        # response.failed whose response.status says "cancelled"
        kind = {"completed": "response.completed", "incomplete": "response.incomplete",
                "failed": "response.failed", "cancelled": "response.failed"}[self.status]
        return [self.writer.event(kind, response=self.response())]

    def stored(self) -> StoredResponse:
        return StoredResponse(response=self.response(), input_items=self.p.input_items,
                              history=self.conversation_so_far())

    def function_calls(self) -> list[FunctionCallItem]:
        return [i for i in self.writer.output if isinstance(i, FunctionCallItem)]


def _renumber(events: list[Event]) -> list[Event]:
    """Give events built out of order consecutive sequence numbers, in list order."""
    start = min(e["sequence_number"] for e in events)
    for i, e in enumerate(events):
        e["sequence_number"] = start + i
    return events


__all__ = ["ApiError", "Prepared", "ResponseRun", "prepare"]
