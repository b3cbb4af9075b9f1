"""A write whose connection broke after Redis applied it is retried without applying it twice
where that would add twice (a stream or a list appended to); an idempotent write is simply sent
again. Over the tests' Redis, the lost reply simulated."""

from __future__ import annotations

from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

from contracts.messages.items import MessageItem
from services.common.redis_url import RedisOptions
from services.gateway.redis_conn import Command, RedisLink
from services.gateway.store import RedisResponseStore


class LostReply(RedisLink):
    """The first attempt of a write reaches Redis, then its connection breaks."""

    lost = False

    async def _send(self, commands: Any, wait: bool) -> list[Any]:
        replies = await super()._send(commands, wait)
        if not self.lost:
            self.lost = True
            raise RedisConnectionError("the reply was lost")
        return replies


async def test_a_retried_append_is_not_applied_twice(redis_url: str, namespace: str) -> None:
    client = RedisLink.open(redis_url, RedisOptions(min_replicas=0, failover_s=5)).client

    def losing() -> RedisResponseStore:
        return RedisResponseStore(
            LostReply(client, min_replicas=0, wait_ms=500, failover_s=5, where="test"), namespace, 60
        )

    try:
        await losing().append_events("resp_1", [b"one", b"two"])
        assert [event for _, event in await losing().read_events("resp_1", "0", 0)] == [b"one", b"two"]
        await losing().add_step("resp_1", b"step")
        assert await losing().steps("resp_1") == [b"step"]
        await losing().add_conversation_items("conv_1", [MessageItem(id="msg_1", role="user", content="hi")])
        assert [i.id for i in await losing().conversation_items("conv_1")] == ["msg_1"]
        commands: list[Command] = [("SET", f"{namespace}:x", b"1")]
        assert await losing().link.write(commands) == [b"OK"]  # an idempotent write is sent again
    finally:
        await losing().close()
