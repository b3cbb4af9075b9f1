"""Responses and conversations in Redis, behind a small Protocol.

Every item is stored once; a response is a record of references. With API keys configured
every key below lives under its tenant (``{ns}:t:{tenant}:...``), so one API key never sees
another's responses, items or conversations: they are simply not found. Keys (all under the
namespace, all expiring after the configured TTL):

  {ns}:item:{id}          one conversation item (JSON), written when first stored
  {ns}:resp:{id}          a response record: the Response JSON, its previous response, the ids
                          of the items it added (its inputs first, then its output) and whose it is
  {ns}:resp:{id}:events   a Redis stream of the response's SSE events (background / streamed)
  {ns}:resp:{id}:cancel   set when a cancel was asked for
  {ns}:conv:{id}          a conversation object; {ns}:conv:{id}:items the list of its item ids

A chain's history is the records from the first response to the last, walked server-side in one
round trip (a Lua script), then their items fetched at once: linear in the chain's length."""

from __future__ import annotations

import json
from typing import Any, Protocol

import redis.asyncio as aioredis
from pydantic import BaseModel, Field, TypeAdapter

from contracts.messages.items import ConversationItem

_ITEM: TypeAdapter[ConversationItem] = TypeAdapter(ConversationItem)
MAX_CHAIN = 10_000

# KEYS[1]: a lease; ARGV[1]: its owner; ARGV[2]: milliseconds. Extends it if still ours.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# KEYS[1]: the newest record's key; ARGV[1]: the key prefix of records; ARGV[2]: max length.
# Returns the records from the newest to the oldest reachable one.
_WALK = """
local out = {}
local key = KEYS[1]
for i = 1, tonumber(ARGV[2]) do
  local raw = redis.call('GET', key)
  if not raw then break end
  out[#out + 1] = raw
  local previous = cjson.decode(raw)['previous_response_id']
  if previous == nil or previous == cjson.null then break end
  key = ARGV[1] .. previous
end
return out
"""


class StoredResponse(BaseModel):
    """A response record: the object, where it continues from, and the items it added."""

    response: dict[str, Any]
    previous_response_id: str | None = None
    item_ids: list[str] = Field(default_factory=list)  # inputs first, then output (with tool results)
    input_count: int = 0
    owner: str | None = None  # the API key (its hash) that created it

    @property
    def input_ids(self) -> list[str]:
        return self.item_ids[: self.input_count]


class ResponseStore(Protocol):
    tenant: str | None

    def scoped(self, tenant: str | None) -> ResponseStore: ...
    async def ping(self) -> None: ...
    async def close(self) -> None: ...
    async def save_response(self, record: StoredResponse, items: list[ConversationItem]) -> None: ...
    async def get_response(self, response_id: str) -> StoredResponse | None: ...
    async def history(self, response_id: str) -> list[ConversationItem] | None: ...
    async def items(self, item_ids: list[str]) -> list[ConversationItem]: ...
    async def delete_response(self, response_id: str) -> bool: ...
    async def append_events(self, response_id: str, events: list[bytes]) -> None: ...
    async def read_events(self, response_id: str, after: str, block_ms: int) -> list[tuple[str, bytes]]: ...
    async def request_cancel(self, response_id: str) -> None: ...
    async def cancel_requested(self, response_id: str) -> bool: ...
    async def get_item(self, item_id: str) -> ConversationItem | None: ...
    async def create_conversation(self, conv: dict[str, Any], items: list[ConversationItem]) -> None: ...
    async def get_conversation(self, conv_id: str) -> dict[str, Any] | None: ...
    async def update_conversation(self, conv: dict[str, Any]) -> None: ...
    async def delete_conversation(self, conv_id: str) -> bool: ...
    async def add_conversation_items(self, conv_id: str, items: list[ConversationItem]) -> None: ...
    async def conversation_items(self, conv_id: str) -> list[ConversationItem]: ...
    # background responses: the job, its lease, its checkpoints and steps
    async def shared_secret(self, name: str, candidate: bytes) -> bytes: ...
    async def put_job(self, response_id: str, job: bytes, items: list[ConversationItem]) -> None: ...
    async def get_job(self, response_id: str) -> bytes | None: ...
    async def claim(self, response_id: str, owner: str, lease_ms: int) -> bool: ...
    async def renew(self, response_id: str, owner: str, lease_ms: int) -> bool: ...
    async def running(self) -> list[tuple[str | None, str]]: ...
    async def unclaimed(self, jobs: list[tuple[str | None, str]]) -> list[tuple[str | None, str]]: ...
    async def done_running(self, response_id: str) -> None: ...
    async def put_checkpoint(self, response_id: str, checkpoint: bytes) -> None: ...
    async def get_checkpoint(self, response_id: str) -> bytes | None: ...
    async def add_step(self, response_id: str, step: bytes) -> None: ...
    async def steps(self, response_id: str) -> list[bytes]: ...
    async def last_event(self, response_id: str) -> bytes | None: ...


class RedisResponseStore:
    def __init__(self, client: aioredis.Redis, namespace: str, ttl_s: int, tenant: str | None = None) -> None:
        self.r = client
        self.ns = namespace
        self.ttl = ttl_s
        self.tenant = tenant
        self.prefix = f"{namespace}:t:{tenant}" if tenant else namespace
        self._walk = client.register_script(_WALK)
        self._renew = client.register_script(_RENEW)

    def scoped(self, tenant: str | None) -> RedisResponseStore:
        """The same store, seen by one tenant."""
        if tenant == self.tenant:
            return self
        return RedisResponseStore(self.r, self.ns, self.ttl, tenant)

    @classmethod
    def from_url(cls, url: str, *, namespace: str, ttl_s: int) -> RedisResponseStore:
        return cls(
            aioredis.from_url(
                url,
                decode_responses=False,
                health_check_interval=5,
                socket_connect_timeout=2,
                socket_timeout=5,
                retry_on_timeout=True,
            ),
            namespace,
            ttl_s,
        )

    def _k(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def _global(self, *parts: str) -> str:
        return ":".join((self.ns, *parts))

    async def ping(self) -> None:
        await self.r.ping()

    async def close(self) -> None:
        await self.r.aclose()

    # items ------------------------------------------------------------------------------
    def _put_items(self, pipe: Any, items: list[ConversationItem]) -> None:
        for item in items:
            if item.id:
                pipe.set(self._k("item", item.id), item.model_dump_json(), ex=self.ttl, nx=True)

    async def get_item(self, item_id: str) -> ConversationItem | None:
        raw = await self.r.get(self._k("item", item_id))
        return _ITEM.validate_json(raw) if raw else None

    async def items(self, item_ids: list[str]) -> list[ConversationItem]:
        """The items with these ids, in order (expired ones left out)."""
        if not item_ids:
            return []
        raws = await self.r.mget([self._k("item", i) for i in item_ids])
        return [_ITEM.validate_json(raw) for raw in raws if raw]

    # responses --------------------------------------------------------------------------
    async def save_response(self, record: StoredResponse, items: list[ConversationItem]) -> None:
        """The record and the items it adds, in one transaction."""
        rid = record.response["id"]
        async with self.r.pipeline(transaction=True) as pipe:
            self._put_items(pipe, items)
            pipe.set(self._k("resp", rid), record.model_dump_json(), ex=self.ttl)
            await pipe.execute()

    async def get_response(self, response_id: str) -> StoredResponse | None:
        raw = await self.r.get(self._k("resp", response_id))
        return StoredResponse.model_validate_json(raw) if raw else None

    async def history(self, response_id: str) -> list[ConversationItem] | None:
        """Everything a continuation of ``response_id`` builds on (None: no such response)."""
        raws: list[bytes] = await self._walk(keys=[self._k("resp", response_id)], args=[self._k("resp", ""), MAX_CHAIN])
        if not raws:
            return None
        ids: list[str] = []
        for raw in reversed(raws):
            ids += StoredResponse.model_validate_json(raw).item_ids
        return await self.items(ids)

    async def delete_response(self, response_id: str) -> bool:
        n = await self.r.delete(self._k("resp", response_id), self._k("resp", response_id, "events"))
        return bool(n)

    async def append_events(self, response_id: str, events: list[bytes]) -> None:
        if not events:
            return
        key = self._k("resp", response_id, "events")
        async with self.r.pipeline(transaction=False) as pipe:
            for event in events:
                pipe.xadd(key, {"e": event})
            pipe.expire(key, self.ttl)
            await pipe.execute()

    async def read_events(self, response_id: str, after: str, block_ms: int) -> list[tuple[str, bytes]]:
        """Events after stream id ``after`` ("0" for all), waiting up to ``block_ms`` for new ones."""
        key = self._k("resp", response_id, "events")
        got: Any = await self.r.xread({key: after}, block=block_ms or None, count=1000)
        out: list[tuple[str, bytes]] = []
        for _, entries in got or []:
            for entry_id, fields in entries:
                out.append((entry_id.decode(), fields[b"e"]))
        return out

    async def request_cancel(self, response_id: str) -> None:
        await self.r.set(self._k("resp", response_id, "cancel"), b"1", ex=self.ttl)

    async def cancel_requested(self, response_id: str) -> bool:
        return bool(await self.r.exists(self._k("resp", response_id, "cancel")))

    # conversations ----------------------------------------------------------------------
    async def create_conversation(self, conv: dict[str, Any], items: list[ConversationItem]) -> None:
        async with self.r.pipeline(transaction=True) as pipe:
            pipe.set(self._k("conv", conv["id"]), json.dumps(conv), ex=self.ttl)
            self._put_items(pipe, items)
            if items:
                pipe.rpush(self._k("conv", conv["id"], "items"), *[i.id or "" for i in items])
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
            self._put_items(pipe, items)
            pipe.rpush(key, *[i.id or "" for i in items])
            pipe.expire(key, self.ttl)
            pipe.expire(self._k("conv", conv_id), self.ttl)
            await pipe.execute()

    async def conversation_items(self, conv_id: str) -> list[ConversationItem]:
        ids = await self.r.lrange(self._k("conv", conv_id, "items"), 0, -1)
        return await self.items([i.decode() if isinstance(i, bytes) else i for i in ids])

    # background responses -----------------------------------------------------------------
    async def put_job(self, response_id: str, job: bytes, items: list[ConversationItem]) -> None:
        async with self.r.pipeline(transaction=True) as pipe:
            self._put_items(pipe, items)
            pipe.set(self._k("bg", response_id), job, ex=self.ttl)
            pipe.sadd(self._global("bg", "running"), f"{self.tenant or ''}|{response_id}")
            await pipe.execute()

    async def get_job(self, response_id: str) -> bytes | None:
        raw = await self.r.get(self._k("bg", response_id))
        return raw.encode() if isinstance(raw, str) else raw

    async def claim(self, response_id: str, owner: str, lease_ms: int) -> bool:
        return bool(await self.r.set(self._k("bg", response_id, "lease"), owner, px=lease_ms, nx=True))

    async def renew(self, response_id: str, owner: str, lease_ms: int) -> bool:
        return bool(await self._renew(keys=[self._k("bg", response_id, "lease")], args=[owner, lease_ms]))

    async def running(self) -> list[tuple[str | None, str]]:
        """Every tenant's background responses that are not finished: (tenant, response id)."""
        members = await self.r.smembers(self._global("bg", "running"))
        out: list[tuple[str | None, str]] = []
        for member in sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members):
            tenant, _, rid = member.partition("|")
            out.append((tenant or None, rid))
        return out

    async def unclaimed(self, jobs: list[tuple[str | None, str]]) -> list[tuple[str | None, str]]:
        """Which of these background responses nobody holds a lease on."""
        if not jobs:
            return []
        held = await self.r.mget([self.scoped(t)._k("bg", rid, "lease") for t, rid in jobs])
        return [job for job, owner in zip(jobs, held, strict=True) if owner is None]

    async def done_running(self, response_id: str) -> None:
        async with self.r.pipeline(transaction=True) as pipe:
            pipe.srem(self._global("bg", "running"), f"{self.tenant or ''}|{response_id}")
            pipe.delete(
                self._k("bg", response_id),
                self._k("bg", response_id, "lease"),
                self._k("bg", response_id, "checkpoint"),
                self._k("bg", response_id, "steps"),
            )
            await pipe.execute()

    async def put_checkpoint(self, response_id: str, checkpoint: bytes) -> None:
        """A run's state before a model turn; the steps of earlier turns are not needed any more."""
        async with self.r.pipeline(transaction=True) as pipe:
            pipe.set(self._k("bg", response_id, "checkpoint"), checkpoint, ex=self.ttl)
            pipe.delete(self._k("bg", response_id, "steps"))
            await pipe.execute()

    async def get_checkpoint(self, response_id: str) -> bytes | None:
        raw = await self.r.get(self._k("bg", response_id, "checkpoint"))
        return raw.encode() if isinstance(raw, str) else raw

    async def add_step(self, response_id: str, step: bytes) -> None:
        key = self._k("bg", response_id, "steps")
        async with self.r.pipeline(transaction=False) as pipe:
            pipe.rpush(key, step)
            pipe.expire(key, self.ttl)
            await pipe.execute()

    async def steps(self, response_id: str) -> list[bytes]:
        raw = await self.r.lrange(self._k("bg", response_id, "steps"), 0, -1)
        return [r if isinstance(r, bytes) else str(r).encode() for r in raw]

    async def last_event(self, response_id: str) -> bytes | None:
        got: Any = await self.r.xrevrange(self._k("resp", response_id, "events"), count=1)
        return bytes(got[0][1][b"e"]) if got else None

    async def shared_secret(self, name: str, candidate: bytes) -> bytes:
        """A secret every replica shares: ``candidate`` if it is the first, else the one stored."""
        key = self._global("secret", name)
        await self.r.set(key, candidate, nx=True)
        stored = await self.r.get(key)
        if stored is None:
            raise RuntimeError(f"the shared secret {name!r} could not be read back from Redis")
        return stored.encode() if isinstance(stored, str) else stored
