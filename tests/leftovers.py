"""What the tests leave on shared servers and disks, and its removal at the session's end.

Stacks' log directories go under pytest's base temporary directory (pytest keeps the last few
runs' and removes older ones), never straight into /tmp. Redis keys written under a namespace
a test made (``TEST_NAMESPACE``) are removed when the session ends, unless that namespace was
there before it started (someone's own stack)."""

from __future__ import annotations

import re

import nats
import redis

# the namespaces tests make: fixtures' t + 10 hex, e2e/cli/infra stacks + 8 hex, `chorus up`
# stacks named after their port, the benchmarks' (tests/bench run them), and the few fixed ones
TEST_NAMESPACE = re.compile(r"^(t[0-9a-f]{10}|(e2e|cli|infra)[0-9a-f]{8}|(chorus-|bench)\d+|roles)$")


class LOGS:
    """Where stacks write their logs (set once the session has a base temporary directory)."""

    root: str | None = None


def namespaces(client: redis.Redis) -> set[str]:
    return {key.split(b":", 1)[0].decode(errors="replace") for key in client.scan_iter(count=1000)}


def remove_test_keys(client: redis.Redis, existing: set[str]) -> int:
    """Delete the keys of test namespaces that did not exist before; how many."""
    removed = 0
    for namespace in namespaces(client) - existing:
        if TEST_NAMESPACE.match(namespace):
            keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
            for start in range(0, len(keys), 500):
                removed += int(client.delete(*keys[start : start + 500]))
    return removed


async def stream_names(url: str) -> set[str]:
    nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0)
    try:
        return {info.config.name or "" for info in await nc.jetstream().streams_info()}
    finally:
        await nc.close()


async def remove_test_streams(url: str, existing: set[str]) -> None:
    """Delete the JetStream streams (CLAIMS_NAMESPACE: oversized payloads) of test namespaces
    that did not exist before."""
    nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0)
    try:
        js = nc.jetstream()
        for info in await js.streams_info():
            name = info.config.name or ""
            namespace = name.removeprefix("CLAIMS_")
            if name not in existing and (TEST_NAMESPACE.match(namespace) or name.startswith("OBJ_infra-")):
                await js.delete_stream(name)
    finally:
        await nc.close()
