"""Storage is checked without holding up a Responses request: a stored response's ping runs while
the gateway prepares the run (the run awaits it before its first model turn); loading a previous
response is the check itself; a response that is not stored does not touch storage."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from contracts.messages.items import ConversationItem, MessageItem
from services.gateway.context import GatewayContext
from services.gateway.responses.prepare import prepare
from services.gateway.responses.request import ResponsesRequest
from services.gateway.store import ResponseStore


@dataclass
class Store:
    """Records the calls; a ping answers when ``answer`` is set, failing if ``down``."""

    down: bool = False
    answer: asyncio.Event = field(default_factory=asyncio.Event)
    calls: list[str] = field(default_factory=list)

    async def ping(self) -> None:
        self.calls.append("ping")
        await self.answer.wait()
        if self.down:
            raise RedisConnectionError("Redis is down")

    async def history(self, response_id: str) -> list[ConversationItem] | None:
        self.calls.append("history")
        return [MessageItem(role="user", content="earlier")]


@dataclass
class Settings:
    builtin_tools: dict[str, str] = field(default_factory=dict)


class Ctx:
    settings = Settings()

    def check_model(self, model: str) -> None:
        pass


def request(**fields: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", "input": "hi", **fields})


async def prepared(db: Store, **fields: Any) -> Any:
    return await asyncio.wait_for(prepare(cast(GatewayContext, Ctx()), request(**fields), cast(ResponseStore, db)), 1)


async def test_a_stored_response_is_prepared_while_storage_answers_and_waits_for_it_before_the_model() -> None:
    store = Store()
    ready = await prepared(store)  # returns although the ping has not answered
    assert store.calls == ["ping"]
    waiting = asyncio.get_running_loop().create_task(ready.storage_ready())
    await asyncio.sleep(0.01)
    assert not waiting.done()
    store.answer.set()
    await asyncio.wait_for(waiting, 1)


async def test_storage_down_is_raised_before_the_first_model_turn() -> None:
    store = Store(down=True)
    store.answer.set()
    ready = await prepared(store)
    with pytest.raises(RedisConnectionError):
        await ready.storage_ready()


async def test_loading_a_previous_response_is_the_check_and_unstored_responses_do_not_touch_storage() -> None:
    store = Store()
    ready = await prepared(store, previous_response_id="resp_1")
    assert store.calls == ["history"] and ready.storage_check is None
    assert [item.content for item in ready.context] == ["earlier"]
    store.calls.clear()
    ready = await prepared(store, store=False)
    assert store.calls == [] and ready.storage_check is None
    await ready.storage_ready()
