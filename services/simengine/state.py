"""What the SIMULATED engine remembers: every request it saw (for tests), its load, and an
approximate prefix cache (so ``cached_tokens`` behaves like a real engine's)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from openai_harmony import HarmonyEncoding

    from services.simengine.settings import Settings

PREFIX_BLOCK = 16


@dataclass
class RequestRecord:
    request_id: str
    protocol: str  # vllm | sglang
    prompt_token_ids: list[int]
    params: dict[str, Any]
    stream: bool
    prompt_text: str = ""
    aborted: bool = False
    abort_requested: bool = False  # SGLang POST /abort_request arrived
    finished: bool = False
    finish_reason: str | None = None
    completion_tokens: int = 0
    aborted_event: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    done_event: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def public(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "rid": self.request_id if self.protocol == "sglang" else None,
            "protocol": self.protocol,
            "prompt_tokens": len(self.prompt_token_ids),
            "prompt_token_ids": self.prompt_token_ids,
            "prompt_text": self.prompt_text,
            "params": self.params,
            "stream": self.stream,
            "aborted": self.aborted,
            "abort_requested": self.abort_requested,
            "finished": self.finished,
            "finish_reason": self.finish_reason,
            "completion_tokens": self.completion_tokens,
        }


class PrefixCache:
    """Block hashes of prompts seen: the longest cached prefix, in whole blocks."""

    def __init__(self, capacity: int = 200_000) -> None:
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self._capacity = capacity

    def lookup_and_insert(self, ids: Sequence[int]) -> int:
        cached, still_matching, h = 0, True, 0
        for start in range(0, len(ids) - PREFIX_BLOCK + 1, PREFIX_BLOCK):
            h = hash((h, tuple(ids[start : start + PREFIX_BLOCK])))
            if still_matching and h in self._blocks:
                cached += PREFIX_BLOCK
                self._blocks.move_to_end(h)
            else:
                still_matching = False
                self._blocks[h] = None
        while len(self._blocks) > self._capacity:
            self._blocks.popitem(last=False)
        return min(cached, max(0, len(ids) - 1))


class Recorder:
    """Requests seen, newest last (bounded), with an ``asyncio.Event`` per request so in-process
    tests can await "request X aborted" / "finished" without polling."""

    def __init__(self, keep: int = 2000) -> None:
        self.records: deque[RequestRecord] = deque(maxlen=keep)
        self._latest: dict[str, RequestRecord] = {}
        self._arrived: dict[str, asyncio.Event] = {}
        self.running = 0
        self.prefix_cache = PrefixCache()

    def add(self, record: RequestRecord) -> RequestRecord:
        if len(self.records) == self.records.maxlen:
            oldest = self.records[0]
            if self._latest.get(oldest.request_id) is oldest:
                del self._latest[oldest.request_id]
                self._arrived.pop(oldest.request_id, None)
        self.records.append(record)
        self._latest[record.request_id] = record
        self._arrived.setdefault(record.request_id, asyncio.Event()).set()
        return record

    def get(self, request_id: str) -> RequestRecord | None:
        return self._latest.get(request_id)

    def list(self) -> list[dict[str, Any]]:
        return [r.public() for r in self.records]

    async def wait_for(self, request_id: str, timeout: float = 5.0) -> RequestRecord:
        """The request once it has arrived (``TimeoutError`` after ``timeout``)."""
        event = self._arrived.setdefault(request_id, asyncio.Event())
        async with asyncio.timeout(timeout):
            await event.wait()
        record = self._latest[request_id]
        return record

    async def wait_aborted(self, request_id: str, timeout: float = 5.0) -> RequestRecord:
        async with asyncio.timeout(timeout):
            record = await self.wait_for(request_id, timeout)
            await record.aborted_event.wait()
        return record

    @staticmethod
    def mark_aborted(record: RequestRecord, *, via_abort_request: bool = False) -> None:
        if via_abort_request:
            record.abort_requested = True
        if not record.finished:
            record.aborted = True
            record.finish_reason = "abort"
            record.aborted_event.set()
            record.done_event.set()

    @staticmethod
    def mark_finished(record: RequestRecord, finish_reason: str, completion_tokens: int) -> None:
        if record.aborted:
            return
        record.finished = True
        record.finish_reason = finish_reason
        record.completion_tokens = completion_tokens
        record.done_event.set()


@dataclass
class SimState:
    """Everything the route handlers share (``app.state.sim``)."""

    settings: Settings
    recorder: Recorder
    encoding: HarmonyEncoding
