"""What a Responses request continues: the items of a previous response or of a conversation,
and the stored items its input refers to by id. Shared by create (``prepare``) and compact."""

from __future__ import annotations

from typing import Protocol

from contracts.messages.items import ConversationItem
from services.gateway.errors import not_found
from services.gateway.responses.inputs import InputItem, ItemReferenceInput, Text
from services.gateway.store import Conversations, Responses


class Continuations(Responses, Conversations, Protocol):
    """Where a request's earlier turns are: a previous response's chain, a conversation."""


async def load_context(
    store: Continuations, previous_response_id: str | None, conversation_id: str | None = None
) -> list[ConversationItem]:
    """The conversation so far; a 404 naming the parameter when what it names is gone."""
    if previous_response_id:
        history = await store.history(previous_response_id)
        if history is None:
            raise not_found(
                f"Previous response with id '{previous_response_id}' not found (it may have "
                "been deleted, expired, or created with store: false).",
                "previous_response_id",
            )
        return history
    if conversation_id:
        if await store.get_conversation(conversation_id) is None:
            raise not_found(f"Conversation with id '{conversation_id}' not found.", "conversation")
        return await store.conversation_items(conversation_id)
    return []


async def referenced(store: Responses, given: Text | list[InputItem] | None) -> dict[str, ConversationItem]:
    """The stored items that ``item_reference`` inputs name (unknown ids are left out)."""
    found: dict[str, ConversationItem] = {}
    if isinstance(given, list):
        for entry in given:
            if isinstance(entry, ItemReferenceInput):
                item = await store.get_item(entry.id)
                if item is not None:
                    found[entry.id] = item
    return found
