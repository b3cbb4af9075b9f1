"""What the SIMULATED engine remembers: every request it saw (for tests), its load, and a block
prefix cache (so ``cached_tokens`` behaves like a real engine's, and its KV cache events can be
published as an engine's are)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from services.common.kv_events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, KvEvent

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
    aborted: bool = False
    abort_requested: bool = False  # SGLang POST /abort_request arrived
    finished: bool = False
    finish_reason: str | None = None
    completion_tokens: int = 0
    prompt_text: str | None = None  # decoded when first read (GET /sim/requests)
    aborted_event: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    done_event: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def _text(self, decode: Callable[[list[int]], str] | None) -> str:
        """The prompt as text, decoded the first time it is asked for."""
        if self.prompt_text is None and decode is not None:
            self.prompt_text = decode(self.prompt_token_ids)
        return self.prompt_text or ""

    def public(self, decode: Callable[[list[int]], str] | None = None) -> dict[str, Any]:
        """The record as ``/sim/requests`` lists it; ``prompt_text`` decoded now (only the tests
        read it: the engine does not decode every prompt it serves)."""
        return {
            "request_id": self.request_id,
            "rid": self.request_id if self.protocol == "sglang" else None,
            "protocol": self.protocol,
            "prompt_tokens": len(self.prompt_token_ids),
            "prompt_token_ids": self.prompt_token_ids,
            "prompt_text": self._text(decode),
            "params": self.params,
            "stream": self.stream,
            "aborted": self.aborted,
            "abort_requested": self.abort_requested,
            "finished": self.finished,
            "finish_reason": self.finish_reason,
            "completion_tokens": self.completion_tokens,
        }


class PrefixCache:
    """The simulated engine's KV cache, as vLLM's prefix cache keeps it: full blocks of
    ``block_size`` tokens, each named by a chain hash of its parent's hash and its tokens (so a
    hash names a whole prefix), at most ``capacity_tokens`` worth of them, least recently used
    evicted first. A request's blocks are touched tail first (as vLLM frees a request's blocks
    in reverse), so a block is always older than its parent: the oldest block is a leaf, and
    every cached block's parent is cached. ``on_events`` hears what an engine would publish:
    ``BlockStored`` per run of newly stored blocks, ``BlockRemoved`` per evicted block,
    ``AllBlocksCleared`` on ``clear()``."""

    def __init__(
        self,
        capacity_tokens: int = 200_000 * PREFIX_BLOCK,
        block_size: int = PREFIX_BLOCK,
        on_events: Callable[[list[KvEvent]], object] | None = None,
    ) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.block_size = block_size
        self.capacity_blocks = max(0, capacity_tokens) // block_size
        self.on_events = on_events
        self._parents: OrderedDict[int, int | None] = OrderedDict()  # hash -> parent, oldest first

    def __len__(self) -> int:
        return len(self._parents)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._parents

    def __iter__(self) -> Iterator[int]:
        """The cached blocks' hashes, least recently used first."""
        return iter(list(self._parents))

    def parent(self, block_hash: int) -> int | None:
        """The parent of a cached block (None: a first block); ``KeyError`` if not cached."""
        return self._parents[block_hash]

    def lookup_and_insert(self, ids: Sequence[int]) -> int:
        """Cached tokens of ``ids`` (whole blocks, at most ``len(ids) - 1``: the last token is
        always computed, as in vLLM), storing its full blocks that were not cached."""
        size, blocks = self.block_size, self._parents
        full = len(ids) // size
        chain: list[int] = []
        parent: int | None = None
        while len(chain) < full:
            h = block_hash(parent, ids[len(chain) * size : (len(chain) + 1) * size])
            if h not in blocks:
                break
            chain.append(h)
            parent = h
        cached_blocks = min(len(chain), max(0, len(ids) - 1) // size)
        matched = len(chain)
        for h in reversed(chain):  # the hit is now the most recent, its tail older than its root
            blocks.move_to_end(h)
        stop = min(full, self.capacity_blocks)
        events: list[KvEvent] = []
        if stop > matched:
            # make room first, as an engine evicts when it allocates: the oldest blocks, never this
            # chain's (matched + new <= capacity, and the chain is the most recent)
            while len(blocks) + stop - matched > self.capacity_blocks:
                evicted, _ = blocks.popitem(last=False)
                events.append(BlockRemoved((evicted,), MEDIUM_GPU))
            for i in range(matched, stop):
                h = block_hash(parent, ids[i * size : (i + 1) * size])
                blocks[h] = parent
                chain.append(h)
                parent = h
            for h in reversed(chain):
                blocks.move_to_end(h)
            events.append(
                BlockStored(
                    block_hashes=tuple(chain[matched:]),
                    parent_block_hash=chain[matched - 1] if matched else None,
                    token_ids=tuple(ids[matched * size : stop * size]),
                    block_size=size,
                    medium=MEDIUM_GPU,
                )
            )
        if events and self.on_events is not None:
            self.on_events(events)
        return cached_blocks * size

    def clear(self) -> None:
        """Drop every block (vLLM's ``reset_prefix_cache``): ``AllBlocksCleared``."""
        self._parents.clear()
        if self.on_events is not None:
            self.on_events([AllBlocksCleared()])


def block_hash(parent: int | None, tokens: Sequence[int]) -> int:
    """A block's chain hash: of its parent's hash and its tokens, an unsigned 64-bit int. Like
    vLLM's (whose hashes are seeded per engine start, so nobody outside can compute them), it
    names a whole prefix; Python's hash of int tuples is the same in every process."""
    return hash((parent, tuple(tokens))) & 0xFFFF_FFFF_FFFF_FFFF


class Recorder:
    """Requests seen, newest last (bounded), with an ``asyncio.Event`` per request so in-process
    tests can await "request X aborted" / "finished" without polling."""

    def __init__(self, keep: int = 2000, prefix_cache: PrefixCache | None = None) -> None:
        self.records: deque[RequestRecord] = deque(maxlen=keep)
        self._latest: dict[str, RequestRecord] = {}
        self._arrived: dict[str, asyncio.Event] = {}
        self.running = 0
        self.prefix_cache = prefix_cache or PrefixCache()
        self.prefill_lock = asyncio.Lock()  # one prefill at a time (with a prefill cost set)

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

    def list(self, decode: Callable[[list[int]], str] | None = None) -> list[dict[str, Any]]:
        return [r.public(decode) for r in self.records]

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
