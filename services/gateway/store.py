"""Responses and conversations in Redis, behind small Protocols (one per kind of state).

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
round trip (a Lua script), then their items fetched at once: linear in the chain's length.

Every call goes through a ``RedisLink`` (``redis_conn.py``): each write is one transaction that
is acknowledged only once ``CHORUS_REDIS_MIN_REPLICAS`` replicas have it, and every call is
retried through a failover (a Sentinel URL: ``services/common/redis_url.py``). Leases (``claim``,
``renew``) are not waited for: they only coordinate gateways and lapse on their own."""

from __future__ import annotations

import json
from typing import Any, Protocol

from pydantic import BaseModel, Field, TypeAdapter

from contracts.messages.items import ConversationItem
from services.common.redis_url import RedisOptions, close_redis
from services.gateway.redis_conn import Applied, Command, RedisLink, redis_options
from services.gateway.responses.response import ResponseBody
from services.gateway.settings import Settings

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

    response: ResponseBody
    previous_response_id: str | None = None
    item_ids: list[str] = Field(default_factory=list)  # inputs first, then output (with tool results)
    input_count: int = 0
    owner: str | None = None  # the API key (its hash) that created it

    @property
    def input_ids(self) -> list[str]:
        return self.item_ids[: self.input_count]


class _Link(BaseModel):
    """What a chain's walk reads of each record (its response object is left unread)."""

    item_ids: list[str] = Field(default_factory=list)


class Responses(Protocol):
    """Stored responses and their items: saved when a run ends; read to continue, show, list."""

    async def save_response(self, record: StoredResponse, items: list[ConversationItem]) -> None: ...
    async def get_response(self, response_id: str) -> StoredResponse | None: ...
    async def delete_response(self, response_id: str) -> bool: ...
    async def history(self, response_id: str) -> list[ConversationItem] | None: ...
    async def items(self, item_ids: list[str]) -> list[ConversationItem]: ...
    async def get_item(self, item_id: str) -> ConversationItem | None: ...


class EventLog(Protocol):
    """A response's stream events, kept for replays (background and streamed responses)."""

    async def append_events(self, response_id: str, events: list[bytes]) -> None: ...
    async def read_events(self, response_id: str, after: str, block_ms: int) -> list[tuple[str, bytes]]: ...
    async def last_event(self, response_id: str) -> bytes | None: ...


class Conversations(Protocol):
    """Conversation objects and the list of their items."""

    async def create_conversation(self, conv: dict[str, Any], items: list[ConversationItem]) -> None: ...
    async def get_conversation(self, conv_id: str) -> dict[str, Any] | None: ...
    async def update_conversation(self, conv: dict[str, Any]) -> None: ...
    async def delete_conversation(self, conv_id: str) -> bool: ...
    async def add_conversation_items(self, conv_id: str, items: list[ConversationItem]) -> None: ...
    async def conversation_items(self, conv_id: str) -> list[ConversationItem]: ...


class Jobs(Protocol):
    """Background responses: the job, its lease, its checkpoints and steps, a cancel asked for."""

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
    async def request_cancel(self, response_id: str) -> None: ...
    async def cancel_requested(self, response_id: str) -> bool: ...


class ResponseStore(Responses, EventLog, Conversations, Jobs, Protocol):
    """All of it, as one tenant sees it: what the gateway's context and a run hold (a run
    saves its response, logs its events, extends its conversation and, in the background,
    keeps its job)."""

    tenant: str | None

    def scoped(self, tenant: str | None) -> ResponseStore: ...
    async def ping(self) -> None: ...


class RedisResponseStore:
    def __init__(self, link: RedisLink, namespace: str, ttl_s: int, tenant: str | None = None) -> None:
        self.link = link
        self.r = link.client
        self.ns = namespace
        self.ttl = ttl_s
        self.tenant = tenant
        self.prefix = f"{namespace}:t:{tenant}" if tenant else namespace
        self._walk = self.r.register_script(_WALK)
        self._renew = self.r.register_script(_RENEW)

    def scoped(self, tenant: str | None) -> RedisResponseStore:
        """The same store, seen by one tenant."""
        if tenant == self.tenant:
            return self
        return RedisResponseStore(self.link, self.ns, self.ttl, tenant)

    @classmethod
    def from_settings(cls, settings: Settings) -> RedisResponseStore:
        return cls.from_url(
            settings.redis_url,
            namespace=settings.namespace,
            ttl_s=settings.response_ttl_s,
            options=redis_options(settings),
        )

    @classmethod
    def from_url(
        cls, url: str, *, namespace: str, ttl_s: int, options: RedisOptions | None = None
    ) -> RedisResponseStore:
        """The store at ``url`` (its forms: ``services/common/redis_url.py``), checked first
        (``RedisLink.open``). Without ``options`` they are read from the environment (the
        gateway's settings)."""
        return cls(RedisLink.open(url, options or redis_options(Settings())), namespace, ttl_s)

    def _k(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def _global(self, *parts: str) -> str:
        return ":".join((self.ns, *parts))

    async def ping(self) -> None:
        await self.link.read(self.r.ping)

    async def close(self) -> None:
        await close_redis(self.r)

    # what a retried write checks before appending again (see redis_conn.Applied) -------------
    def _appended(self, key: str, values: list[str] | list[bytes]) -> Applied:
        """The list at ``key`` ends with ``values``."""

        async def check() -> bool:
            tail = await self.r.lrange(key, -len(values), -1)
            return [v.encode() if isinstance(v, str) else v for v in values] == list(tail)

        return Applied(check, (("EXPIRE", key, self.ttl),))

    def _streamed(self, key: str, last: bytes) -> Applied:
        """The stream at ``key`` ends with the event ``last``."""

        async def check() -> bool:
            got: Any = await self.r.xrevrange(key, count=1)
            return bool(got) and bytes(got[0][1][b"e"]) == last

        return Applied(check, (("EXPIRE", key, self.ttl),))

    # items ------------------------------------------------------------------------------
    def _put_items(self, items: list[ConversationItem]) -> list[Command]:
        return [
            ("SET", self._k("item", item.id), item.model_dump_json(), "EX", self.ttl, "NX") for item in items if item.id
        ]

    async def get_item(self, item_id: str) -> ConversationItem | None:
        raw = await self.link.read(self.r.get, self._k("item", item_id))
        return _ITEM.validate_json(raw) if raw else None

    async def items(self, item_ids: list[str]) -> list[ConversationItem]:
        """The items with these ids, in order (expired ones left out)."""
        if not item_ids:
            return []
        raws = await self.link.read(self.r.mget, [self._k("item", i) for i in item_ids])
        return [_ITEM.validate_json(raw) for raw in raws if raw]

    # responses --------------------------------------------------------------------------
    async def save_response(self, record: StoredResponse, items: list[ConversationItem]) -> None:
        """The record and the items it adds, in one transaction."""
        rid = record.response.id
        await self.link.write(
            [*self._put_items(items), ("SET", self._k("resp", rid), record.model_dump_json(), "EX", self.ttl)]
        )

    async def get_response(self, response_id: str) -> StoredResponse | None:
        raw = await self.link.read(self.r.get, self._k("resp", response_id))
        return StoredResponse.model_validate_json(raw) if raw else None

    async def history(self, response_id: str) -> list[ConversationItem] | None:
        """Everything a continuation of ``response_id`` builds on (None: no such response)."""
        raws: list[bytes] = await self.link.read(
            self._walk, keys=[self._k("resp", response_id)], args=[self._k("resp", ""), MAX_CHAIN]
        )
        if not raws:
            return None
        ids: list[str] = []
        for raw in reversed(raws):
            ids += _Link.model_validate_json(raw).item_ids
        return await self.items(ids)

    async def delete_response(self, response_id: str) -> bool:
        got = await self.link.write([("DEL", self._k("resp", response_id), self._k("resp", response_id, "events"))])
        return bool(got and got[0])

    async def append_events(self, response_id: str, events: list[bytes]) -> None:
        if not events:
            return
        key = self._k("resp", response_id, "events")
        adds: list[Command] = [("XADD", key, "*", "e", event) for event in events]
        await self.link.write([*adds, ("EXPIRE", key, self.ttl)], applied=self._streamed(key, events[-1]))

    async def read_events(self, response_id: str, after: str, block_ms: int) -> list[tuple[str, bytes]]:
        """Events after stream id ``after`` ("0" for all), waiting up to ``block_ms`` for new ones."""
        key = self._k("resp", response_id, "events")
        got: Any = await self.link.read(self.r.xread, {key: after}, block=block_ms or None, count=1000)
        out: list[tuple[str, bytes]] = []
        for _, entries in got or []:
            for entry_id, fields in entries:
                out.append((entry_id.decode(), fields[b"e"]))
        return out

    async def request_cancel(self, response_id: str) -> None:
        await self.link.write([("SET", self._k("resp", response_id, "cancel"), b"1", "EX", self.ttl)])

    async def cancel_requested(self, response_id: str) -> bool:
        return bool(await self.link.read(self.r.exists, self._k("resp", response_id, "cancel")))

    # conversations ----------------------------------------------------------------------
    async def create_conversation(self, conv: dict[str, Any], items: list[ConversationItem]) -> None:
        commands: list[Command] = [("SET", self._k("conv", conv["id"]), json.dumps(conv), "EX", self.ttl)]
        commands += self._put_items(items)
        applied = None
        if items:
            key = self._k("conv", conv["id"], "items")
            ids = [i.id or "" for i in items]
            commands += [("RPUSH", key, *ids), ("EXPIRE", key, self.ttl)]
            applied = self._appended(key, ids)
        await self.link.write(commands, applied=applied)

    async def get_conversation(self, conv_id: str) -> dict[str, Any] | None:
        raw = await self.link.read(self.r.get, self._k("conv", conv_id))
        return json.loads(raw) if raw else None

    async def update_conversation(self, conv: dict[str, Any]) -> None:
        await self.link.write([("SET", self._k("conv", conv["id"]), json.dumps(conv), "EX", self.ttl)])

    async def delete_conversation(self, conv_id: str) -> bool:
        got = await self.link.write([("DEL", self._k("conv", conv_id), self._k("conv", conv_id, "items"))])
        return bool(got and got[0])

    async def add_conversation_items(self, conv_id: str, items: list[ConversationItem]) -> None:
        if not items:
            return
        key = self._k("conv", conv_id, "items")
        ids = [i.id or "" for i in items]
        await self.link.write(
            [
                *self._put_items(items),
                ("RPUSH", key, *ids),
                ("EXPIRE", key, self.ttl),
                ("EXPIRE", self._k("conv", conv_id), self.ttl),
            ],
            applied=self._appended(key, ids),
        )

    async def conversation_items(self, conv_id: str) -> list[ConversationItem]:
        ids = await self.link.read(self.r.lrange, self._k("conv", conv_id, "items"), 0, -1)
        return await self.items([i.decode() if isinstance(i, bytes) else i for i in ids])

    # background responses -----------------------------------------------------------------
    async def put_job(self, response_id: str, job: bytes, items: list[ConversationItem]) -> None:
        await self.link.write(
            [
                *self._put_items(items),
                ("SET", self._k("bg", response_id), job, "EX", self.ttl),
                ("SADD", self._global("bg", "running"), f"{self.tenant or ''}|{response_id}"),
            ]
        )

    async def get_job(self, response_id: str) -> bytes | None:
        raw = await self.link.read(self.r.get, self._k("bg", response_id))
        return raw.encode() if isinstance(raw, str) else raw

    async def claim(self, response_id: str, owner: str, lease_ms: int) -> bool:
        key = self._k("bg", response_id, "lease")
        return bool(await self.link.read(self.r.set, key, owner, px=lease_ms, nx=True))

    async def renew(self, response_id: str, owner: str, lease_ms: int) -> bool:
        key = self._k("bg", response_id, "lease")
        return bool(await self.link.read(self._renew, keys=[key], args=[owner, lease_ms]))

    async def running(self) -> list[tuple[str | None, str]]:
        """Every tenant's background responses that are not finished: (tenant, response id)."""
        members = await self.link.read(self.r.smembers, self._global("bg", "running"))
        out: list[tuple[str | None, str]] = []
        for member in sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members):
            tenant, _, rid = member.partition("|")
            out.append((tenant or None, rid))
        return out

    async def unclaimed(self, jobs: list[tuple[str | None, str]]) -> list[tuple[str | None, str]]:
        """Which of these background responses nobody holds a lease on."""
        if not jobs:
            return []
        held = await self.link.read(self.r.mget, [self.scoped(t)._k("bg", rid, "lease") for t, rid in jobs])
        return [job for job, owner in zip(jobs, held, strict=True) if owner is None]

    async def done_running(self, response_id: str) -> None:
        bg = self._k("bg", response_id)
        await self.link.write(
            [
                ("SREM", self._global("bg", "running"), f"{self.tenant or ''}|{response_id}"),
                ("DEL", bg, f"{bg}:lease", f"{bg}:checkpoint", f"{bg}:steps"),
            ]
        )

    async def put_checkpoint(self, response_id: str, checkpoint: bytes) -> None:
        """A run's state before a model turn; the steps of earlier turns are not needed any more."""
        await self.link.write(
            [
                ("SET", self._k("bg", response_id, "checkpoint"), checkpoint, "EX", self.ttl),
                ("DEL", self._k("bg", response_id, "steps")),
            ]
        )

    async def get_checkpoint(self, response_id: str) -> bytes | None:
        raw = await self.link.read(self.r.get, self._k("bg", response_id, "checkpoint"))
        return raw.encode() if isinstance(raw, str) else raw

    async def add_step(self, response_id: str, step: bytes) -> None:
        key = self._k("bg", response_id, "steps")
        await self.link.write([("RPUSH", key, step), ("EXPIRE", key, self.ttl)], applied=self._appended(key, [step]))

    async def steps(self, response_id: str) -> list[bytes]:
        raw = await self.link.read(self.r.lrange, self._k("bg", response_id, "steps"), 0, -1)
        return [r if isinstance(r, bytes) else str(r).encode() for r in raw]

    async def last_event(self, response_id: str) -> bytes | None:
        got: Any = await self.link.read(self.r.xrevrange, self._k("resp", response_id, "events"), count=1)
        return bytes(got[0][1][b"e"]) if got else None

    async def shared_secret(self, name: str, candidate: bytes) -> bytes:
        """A secret every replica shares: ``candidate`` if it is the first, else the one stored."""
        key = self._global("secret", name)
        got = await self.link.write([("SET", key, candidate, "NX"), ("GET", key)])
        stored = got[1]
        if stored is None:
            raise RuntimeError(f"the shared secret {name!r} could not be read back from Redis")
        return stored.encode() if isinstance(stored, str) else stored
