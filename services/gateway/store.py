"""Responses and conversations in Redis, behind a small Protocol.

Keys (all under the namespace, all with the configured TTL):
  {ns}:resp:{id}          one JSON record per response, written with a single SET (atomic)
  {ns}:resp:{id}:events   a Redis stream of the response's SSE events (background/streamed)
  {ns}:resp:{id}:cancel   set when a cancel was asked for
  {ns}:conv:{id}          conversation object; {ns}:conv:{id}:items a list of item JSON
  {ns}:item:{id}          every stored item by id (for item_reference)"""

from __future__ import annotations

import json
from typing import Any, Protocol

import redis.asyncio as aioredis
from pydantic import BaseModel, Field, TypeAdapter

from contracts.messages.items import ConversationItem

_ITEMS: TypeAdapter[list[ConversationItem]] = TypeAdapter(list[ConversationItem])
_ITEM: TypeAdapter[ConversationItem] = TypeAdapter(ConversationItem)


class StoredResponse(BaseModel):
    response: dict[str, Any]
    input_items: list[ConversationItem] = Field(default_factory=list)
    # everything the next turn of a previous_response_id chain builds on: the earlier context,
    # this response's input and its output items
    history: list[ConversationItem] = Field(default_factory=list)


class ResponseStore(Protocol):
    async def ping(self) -> None: ...
    async def close(self) -> None: ...
    async def save_response(self, record: StoredResponse) -> None: ...
    async def get_response(self, response_id: str) -> StoredResponse | None: ...
    async def delete_response(self, response_id: str) -> bool: ...
    async def append_events(self, response_id: str, events: list[dict[str, Any]]) -> None: ...
    async def read_events(self, response_id: str, after: str, block_ms: int) -> list[tuple[str, dict[str, Any]]]: ...
    async def request_cancel(self, response_id: str) -> None: ...
    async def cancel_requested(self, response_id: str) -> bool: ...
    async def get_item(self, item_id: str) -> ConversationItem | None: ...
    async def create_conversation(self, conv: dict[str, Any], items: list[ConversationItem]) -> None: ...
    async def get_conversation(self, conv_id: str) -> dict[str, Any] | None: ...
    async def update_conversation(self, conv: dict[str, Any]) -> None: ...
    async def delete_conversation(self, conv_id: str) -> bool: ...
    async def add_conversation_items(self, conv_id: str, items: list[ConversationItem]) -> None: ...
    async def conversation_items(self, conv_id: str) -> list[ConversationItem]: ...


class RedisResponseStore:
    def __init__(self, client: aioredis.Redis, namespace: str, ttl_s: int) -> None:
        self.r = client
        self.ns = namespace
        self.ttl = ttl_s

    @classmethod
    def from_url(cls, url: str, *, namespace: str, ttl_s: int) -> RedisResponseStore:
        return cls(aioredis.from_url(url, decode_responses=False), namespace, ttl_s)

    def _k(self, *parts: str) -> str:
        return ":".join((self.ns, *parts))

    async def ping(self) -> None:
        await self.r.ping()

    async def close(self) -> None:
        await self.r.aclose()

    # responses -------------------------------------------------------------------------
    async def save_response(self, record: StoredResponse) -> None:
        rid = record.response["id"]
        async with self.r.pipeline(transaction=True) as pipe:
            pipe.set(self._k("resp", rid), record.model_dump_json(), ex=self.ttl)
            for item in [*record.input_items, *record.history]:
                item_id = getattr(item, "id", None)
                if item_id:
                    pipe.set(self._k("item", item_id), item.model_dump_json(), ex=self.ttl)
            await pipe.execute()

    async def get_response(self, response_id: str) -> StoredResponse | None:
        raw = await self.r.get(self._k("resp", response_id))
        return StoredResponse.model_validate_json(raw) if raw else None

    async def delete_response(self, response_id: str) -> bool:
        n = await self.r.delete(self._k("resp", response_id), self._k("resp", response_id, "events"))
        return bool(n)

    async def append_events(self, response_id: str, events: list[dict[str, Any]]) -> None:
        if not events:
            return
        key = self._k("resp", response_id, "events")
        async with self.r.pipeline(transaction=False) as pipe:
            for event in events:
                pipe.xadd(key, {"e": json.dumps(event, separators=(",", ":"))})
            pipe.expire(key, self.ttl)
            await pipe.execute()

    async def read_events(self, response_id: str, after: str, block_ms: int) -> list[tuple[str, dict[str, Any]]]:
        """Events after stream id ``after`` ("0" for all), waiting up to ``block_ms`` for new ones."""
        key = self._k("resp", response_id, "events")
        got: Any = await self.r.xread({key: after}, block=block_ms or None, count=1000)
        out: list[tuple[str, dict[str, Any]]] = []
        for _, entries in got or []:
            for entry_id, fields in entries:
                out.append((entry_id.decode(), json.loads(fields[b"e"])))
        return out

    async def request_cancel(self, response_id: str) -> None:
        await self.r.set(self._k("resp", response_id, "cancel"), b"1", ex=self.ttl)

    async def cancel_requested(self, response_id: str) -> bool:
        return bool(await self.r.exists(self._k("resp", response_id, "cancel")))

    async def get_item(self, item_id: str) -> ConversationItem | None:
        raw = await self.r.get(self._k("item", item_id))
        return _ITEM.validate_json(raw) if raw else None

    # conversations -----------------------------------------------------------------------
    async def create_conversation(self, conv: dict[str, Any], items: list[ConversationItem]) -> None:
        async with self.r.pipeline(transaction=True) as pipe:
            pipe.set(self._k("conv", conv["id"]), json.dumps(conv), ex=self.ttl)
            if items:
                pipe.rpush(self._k("conv", conv["id"], "items"), *[i.model_dump_json() for i in items])
                pipe.expire(self._k("conv", conv["id"], "items"), self.ttl)
            await pipe.execute()

    async def get_conversation(self, conv_id: str) -> dict[str, Any] | None:
        raw = await self.r.get(self._k("conv", conv_id))
        return json.loads(raw) if raw else None

    async def update_conversation(self, conv: dict[str, Any]) -> None:
        await self.r.set(self._k("conv", conv["id"]), json.dumps(conv), ex=self.ttl)

    async def delete_conversation(self, conv_id: str) -> bool:
        return bool(await self.r.delete(self._k("conv", conv_id), self._k("conv", conv_id, "items")))

    async def add_conversation_items(self, conv_id: str, items: list[ConversationItem]) -> None:
        if not items:
            return
        key = self._k("conv", conv_id, "items")
        async with self.r.pipeline(transaction=True) as pipe:
            pipe.rpush(key, *[i.model_dump_json() for i in items])
            pipe.expire(key, self.ttl)
            pipe.expire(self._k("conv", conv_id), self.ttl)
            await pipe.execute()

    async def conversation_items(self, conv_id: str) -> list[ConversationItem]:
        raw = await self.r.lrange(self._k("conv", conv_id, "items"), 0, -1)
        return [_ITEM.validate_json(r) for r in raw]
