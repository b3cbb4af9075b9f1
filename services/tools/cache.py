"""Keys that tell callers apart, and a small TTL cache for tool listings.

A listing (and a pooled MCP session) is keyed by the server URL *and* a digest of the headers
sent with it: what a server shows may depend on who asks (an API key, a user token), so one
caller's headers never serve another caller. The digest keeps header values out of the key,
so keys can be logged and compared without holding secrets in plain sight.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, NamedTuple, TypeVar

V = TypeVar("V")


class ServerKey(NamedTuple):
    server_url: str
    headers_digest: str

    def __str__(self) -> str:
        return f"{self.server_url}#{self.headers_digest[:12]}"


def server_key(server_url: str, headers: dict[str, str]) -> ServerKey:
    """The identity of (server, caller): header names are case-insensitive, order is not
    significant, values are exact."""
    canonical = sorted((name.lower(), value) for name, value in headers.items())
    digest = hashlib.sha256(json.dumps(canonical, ensure_ascii=False).encode()).hexdigest()
    return ServerKey(server_url, digest)


class TtlCache(Generic[V]):
    """Entries expire ``ttl_s`` after they were put; at most ``max_entries``, oldest out."""

    def __init__(self, ttl_s: float, max_entries: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[ServerKey, tuple[float, V]] = OrderedDict()

    def get(self, key: ServerKey) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires, value = entry
        if self._clock() >= expires:
            del self._entries[key]
            return None
        return value

    def put(self, key: ServerKey, value: V) -> None:
        if self._ttl_s <= 0 or self._max_entries <= 0:
            return
        self._entries.pop(key, None)
        self._entries[key] = (self._clock() + self._ttl_s, value)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
