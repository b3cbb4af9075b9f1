"""/v1/conversations: create, read, update metadata, delete, and list / add items."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import Field

from contracts.messages.items import ConversationItem
from services.gateway.context import get_ctx
from services.gateway.errors import not_found
from services.gateway.listing import page
from services.gateway.request_base import ApiRequest
from services.gateway.responses.inputs import InputItem
from services.gateway.responses.items import input_item, input_items, new_id
from services.gateway.store import Conversations
from services.gateway.validation import parse_body

router = APIRouter()
Metadata = dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]]


class CreateConversation(ApiRequest):
    items: list[InputItem] | None = Field(default=None, max_length=1000)
    metadata: Metadata | None = Field(default=None, max_length=16)


class UpdateConversation(ApiRequest):
    metadata: Metadata | None = Field(default=None, max_length=16)


class AddItems(ApiRequest):
    items: list[InputItem] = Field(max_length=1000)


def _shown(items: list[ConversationItem]) -> list[dict[str, Any]]:
    return [input_item(i).model_dump(by_alias=True, exclude_unset=True) for i in items]


async def _conversation(store: Conversations, conv_id: str) -> dict[str, Any]:
    conv = await store.get_conversation(conv_id)
    if conv is None:
        raise not_found(f"Conversation with id '{conv_id}' not found.", "conversation_id")
    return conv


@router.post("/v1/conversations")
async def create_conversation(request: Request) -> Any:
    store = get_ctx(request).store_for(request)
    body = parse_body(await request.body() or b"{}", CreateConversation)
    items = input_items(body.items, {})
    conv = {
        "id": new_id("conv"),
        "object": "conversation",
        "created_at": int(time.time()),
        "metadata": body.metadata or {},
    }
    await store.create_conversation(conv, items)
    return conv


@router.get("/v1/conversations/{conv_id}")
async def get_conversation(conv_id: str, request: Request) -> Any:
    return await _conversation(get_ctx(request).store_for(request), conv_id)


@router.post("/v1/conversations/{conv_id}")
async def update_conversation(conv_id: str, request: Request) -> Any:
    store = get_ctx(request).store_for(request)
    conv = await _conversation(store, conv_id)
    body = parse_body(await request.body() or b"{}", UpdateConversation)
    conv["metadata"] = body.metadata or {}
    await store.update_conversation(conv)
    return conv


@router.delete("/v1/conversations/{conv_id}")
async def delete_conversation(conv_id: str, request: Request) -> Any:
    store = get_ctx(request).store_for(request)
    await _conversation(store, conv_id)
    await store.delete_conversation(conv_id)
    return {"id": conv_id, "object": "conversation.deleted", "deleted": True}


@router.get("/v1/conversations/{conv_id}/items")
async def list_conversation_items(
    conv_id: str, request: Request, limit: int = 20, order: str = "desc", after: str | None = None
) -> Any:
    store = get_ctx(request).store_for(request)
    await _conversation(store, conv_id)
    return page(_shown(await store.conversation_items(conv_id)), limit, order, after, None)


@router.post("/v1/conversations/{conv_id}/items")
async def add_conversation_items(conv_id: str, request: Request) -> Any:
    store = get_ctx(request).store_for(request)
    await _conversation(store, conv_id)
    items = input_items(parse_body(await request.body(), AddItems).items, {})
    await store.add_conversation_items(conv_id, items)
    data = _shown(items)
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": False,
    }
