"""The store's connection to Redis: writes acknowledged only once replicas have them, and every
operation carried through a failover.

A write is one round trip: ``MULTI``, its commands, ``EXEC``, then ``WAIT min_replicas wait_ms``
on the same connection (``WAIT`` counts the replicas that have this connection's last write; it
cannot go inside the transaction, where it would not wait). Fewer replicas in time: the write
raises ``ReplicasBehind`` (storage unavailable) and the client is never told it is stored, though
the primary may keep it.

An operation whose connection breaks (the primary died; with Sentinel the next connection asks
the sentinels where the primary is now), whose server was demoted (``READONLY``) or that finds no
primary is retried with backoff until ``failover_s`` after its first failure, then raises
``StorageUnavailable``. A write that may have been applied before its connection broke is not
sent twice when that would add twice (a list or stream appended to): its ``Applied`` check asks
the new primary first, and if the write is there only its replication is waited for (a small
write, then ``WAIT``). Both errors are ``RedisError``s: the gateway answers them as 503
``storage_unavailable`` (a stream in flight ends with response.failed)."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import (
    AuthenticationError,
    ConnectionError,
    MasterDownError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TimeoutError,
)

from services.common.metrics import STORAGE_RETRIES
from services.common.redis_url import RedisConfigError, RedisOptions, check_redis, parse_redis_url, redis_client
from services.gateway.settings import Settings

log = logging.getLogger("chorus.gateway.storage")

P = ParamSpec("P")
T = TypeVar("T")
Command = tuple[str | bytes | int | float, ...]

FIRST_BACKOFF_S = 0.05
MAX_BACKOFF_S = 0.5  # a new primary is found within this of the sentinels naming it
TRANSIENT_REPLIES = ("NOREPLICAS", "LOADING", "MASTERDOWN", "TRYAGAIN")


class StorageUnavailable(RedisError):
    """Redis could not take the operation (the failover window ran out, or too few replicas)."""


class ReplicasBehind(StorageUnavailable):
    """A write fewer replicas acknowledged in time than the acknowledgement needs."""


@dataclass(frozen=True)
class Applied:
    """How to tell whether a write that adds (a list or a stream appended to) was applied before
    its connection broke: ``check`` asks; ``confirm`` is a small write (of a key the write
    made) after which ``WAIT`` covers what the first attempt wrote."""

    check: Callable[[], Awaitable[bool]]
    confirm: tuple[Command, ...]


def redis_options(settings: Settings) -> RedisOptions:
    return RedisOptions(
        password=settings.redis_password,
        sentinel_password=settings.redis_sentinel_password,
        min_replicas=settings.redis_min_replicas,
        wait_ms=settings.redis_wait_ms,
        failover_s=settings.redis_failover_s,
    )


def retryable(exc: BaseException) -> bool:
    """A failure that a failover explains: worth trying again against the (new) primary."""
    if isinstance(exc, AuthenticationError):  # a ConnectionError, but no failover mends it
        return False
    if isinstance(exc, ConnectionError | TimeoutError | ReadOnlyError | MasterDownError):
        return True
    return isinstance(exc, ResponseError) and str(exc).startswith(TRANSIENT_REPLIES)


class RedisLink:
    """``client`` with the durability and failover rules above; ``where`` names the target in
    messages (no password)."""

    def __init__(
        self, client: aioredis.Redis, *, min_replicas: int, wait_ms: int, failover_s: float, where: str
    ) -> None:
        self.client = client
        self.min_replicas = min_replicas
        self.wait_ms = wait_ms
        self.failover_s = failover_s
        self.where = where
        self._primary: Any = None  # the Sentinel pool's last primary address
        self._failing_since: float | None = None  # this process's view: since when Redis fails

    @classmethod
    def open(cls, url: str, options: RedisOptions) -> RedisLink:
        """The link to ``url``, checked first (``check_redis``): a configuration that cannot
        work (no sentinel answers, none knows the service, a refused password) is logged as one
        line and raised (``RedisConfigError``), within a few seconds; what may mend itself (the
        primary not answering yet, too few replicas) is logged as a warning."""
        try:
            target = parse_redis_url(url)
            warnings = check_redis(url, options)
        except RedisConfigError as exc:
            log.error("%s", exc)  # one line saying which part is wrong and what failed
            raise
        for warning in warnings:
            log.warning("Redis: %s", warning)
        return cls(
            redis_client(url, options),
            min_replicas=options.replicas_for(target),
            wait_ms=options.wait_ms,
            failover_s=options.failover_for(target),
            where=target.where(),
        )

    async def read(self, fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` (a client call), retried through a failover."""
        return await self._retrying(lambda: fn(*args, **kwargs))

    async def write(
        self, commands: Sequence[Command], *, applied: Applied | None = None, wait: bool = True
    ) -> list[Any]:
        """``commands`` in one transaction, acknowledged once ``min_replicas`` replicas have them
        (``wait``); their replies (raw), or ``[]`` when a retry found them already applied."""
        attempts = 0

        async def attempt() -> list[Any]:
            nonlocal attempts
            attempts += 1
            if attempts > 1 and applied is not None and await applied.check():
                await self._send(applied.confirm, wait)
                return []
            return await self._send(commands, wait)

        return await self._retrying(attempt)

    async def _send(self, commands: Sequence[Command], wait: bool) -> list[Any]:
        replicas = self.min_replicas if wait else 0
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.execute_command("MULTI")
            for command in commands:
                pipe.execute_command(*command)
            pipe.execute_command("EXEC")
            if replicas:
                pipe.execute_command("WAIT", replicas, self.wait_ms)
            replies = await pipe.execute(raise_on_error=False)
        for reply in replies:  # a refused command (then EXECABORT), WAIT on a replica, ...
            if isinstance(reply, Exception):
                raise reply
        results: list[Any] = replies[len(commands) + 1]
        for result in results:
            if isinstance(result, Exception):
                raise result
        if replicas and int(replies[-1]) < replicas:
            STORAGE_RETRIES.labels(outcome="replicas_behind").inc()
            raise ReplicasBehind(
                f"Redis ({self.where}): {replies[-1]} of the {replicas} replica(s) a write needs "
                f"(CHORUS_REDIS_MIN_REPLICAS) acknowledged it within {self.wait_ms} ms"
            )
        return results

    async def _retrying(self, attempt: Callable[[], Awaitable[T]]) -> T:
        deadline: float | None = None
        backoff = FIRST_BACKOFF_S
        while True:
            try:
                result = await attempt()
            except Exception as exc:
                if not retryable(exc):
                    self._answered()  # Redis answered (with a refusal)
                    raise
                if self.failover_s <= 0:
                    raise
                now = time.monotonic()
                deadline = deadline or now + self.failover_s
                self._failing(now, exc)
                if now >= deadline:
                    STORAGE_RETRIES.labels(outcome="gave_up").inc()
                    raise StorageUnavailable(
                        f"Redis ({self.where}) did not take the operation within "
                        f"{self.failover_s:g} s (CHORUS_REDIS_FAILOVER_S): {exc}"
                    ) from exc
                STORAGE_RETRIES.labels(outcome="retried").inc()
                await asyncio.sleep(min(backoff * random.uniform(0.5, 1.0), deadline - now))
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            if deadline is not None:
                STORAGE_RETRIES.labels(outcome="recovered").inc()
            self._answered()
            return result

    def _failing(self, now: float, exc: BaseException) -> None:
        if self._failing_since is None:
            self._failing_since = now
            log.warning(
                "Redis (%s) failed: %s; retrying for up to %g s (a failover?)", self.where, exc, self.failover_s
            )

    def _answered(self) -> None:
        primary = getattr(self.client.connection_pool, "master_address", None)
        if primary is not None and primary != self._primary:
            if self._primary is not None:
                STORAGE_RETRIES.labels(outcome="failover").inc()
                log.warning("Redis (%s): a new primary at %s (was %s)", self.where, primary, self._primary)
            self._primary = primary
        if self._failing_since is not None:
            log.warning("Redis (%s) answers again, after %.1f s", self.where, time.monotonic() - self._failing_since)
            self._failing_since = None
