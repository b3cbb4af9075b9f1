"""The first step of a Responses request: check what it asks for (the model, the built-in
tools), make sure storage answers when the request needs it, and load what earlier turns left
(a previous response, a conversation) beside the request's own input items.

Storage is checked without holding up the request: loading a previous response or a
conversation is itself the check (it fails with a 503 when Redis is down); otherwise a stored
response starts a ping here that the run awaits before its first model turn (a 503 before any
engine work, and the gateway's own preparation meanwhile)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from contracts.messages.items import ConversationItem
from services.gateway.context import GatewayContext
from services.gateway.errors import invalid
from services.gateway.responses.history import load_context, referenced
from services.gateway.responses.items import Unseal, input_items, new_id
from services.gateway.responses.request import ResponsesRequest
from services.gateway.store import ResponseStore

log = logging.getLogger("chorus.gateway.responses")


@dataclass
class Prepared:
    """A validated request with what earlier turns left (a previous response, a conversation)."""

    request: ResponsesRequest
    response_id: str
    created_at: int
    context: list[ConversationItem]
    inputs: list[ConversationItem]
    store: ResponseStore  # as the caller's API key sees it
    storage_check: asyncio.Task[None] | None = None  # a ping still under way (see the module's doc)

    async def storage_ready(self) -> None:
        """Until storage has answered, if the response needs it; a ``RedisError`` if not."""
        if self.storage_check is not None:
            await self.storage_check


async def prepare(
    ctx: GatewayContext,
    req: ResponsesRequest,
    store: ResponseStore,
    *,
    unseal: Unseal | None = None,
    context: list[ConversationItem] | None = None,
) -> Prepared:
    """Check the model and tools, load the context. ``context`` given: the caller has it
    (a WebSocket continuing a chain it holds)."""
    ctx.check_model(req.model)
    missing = [b for b in req.builtin_tools() if b not in ctx.settings.builtin_tools]
    if "python" in missing:
        raise invalid(
            "The code_interpreter tool is not configured on this server (start Chorus with "
            "--builtin-tool python=URL of an MCP server).",
            "tools",
        )
    if "browser" in missing:  # clients (Codex) send it by default: left out, not refused
        log.warning(
            "a web_search tool was requested but no browser is configured "
            "(--builtin-tool browser=URL): the model is not offered one"
        )
    loads = context is None and bool(req.previous_response_id or req.conversation_id)
    check = None
    if (req.stored or req.background) and not loads:
        check = asyncio.get_running_loop().create_task(store.ping())
        check.add_done_callback(_retrieved)  # a request that fails first never awaits it
    try:
        if context is None:
            context = await load_context(store, req.previous_response_id, req.conversation_id)
        inputs = input_items(req.input, await referenced(store, req.input), unseal)
    except BaseException:
        if check is not None:
            check.cancel()
        raise
    return Prepared(req, new_id("resp"), int(time.time()), context, inputs, store, check)


def _retrieved(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()
