"""Which engine holds which prompt blocks, by OUR chained block hashes (``blocks.chain_hashes``).

Two ways to know, chosen per engine by how it is fed:

- ``apply(engine, event)``: the engine's own KV cache events. Its block hashes are its own, so
  each stored block's hash is recomputed here from its parent's (the engine-hash -> our-hash map
  kept per engine) and its token ids. A block whose parent is unknown (events were missed) cannot
  be placed: it is counted in ``orphans`` and skipped. LoRA blocks are counted in ``ignored``.
  A block is held while any holder holds it: a storage medium (GPU, CPU, ...) and, for a hybrid
  model such as gpt-oss, a KV cache group (full and sliding-window attention evict apart).
- ``record_sent(engine, hashes)``: for an engine without events, the prompts the stack sent it,
  assumed cached, aged to the engine's capacity (least recently used blocks first; a prompt's
  blocks are refreshed tail first, so an old prompt loses its tail before its head).

An engine is fed by events from its first event on (what ``record_sent`` assumed is dropped then,
and later ``record_sent`` calls are no-ops), until ``reset`` (an engine restart, a fault of its
event stream), after which either may feed it again.

Block sizes: each engine has one (``add_engine(block_size=)``, else the index default; an
engine's events set it). Chains of different sizes never share a hash (the seed depends on the
size), so one table serves all: ``chains(prompt_ids)`` hashes the prompt once per block size in
use, ``cached_tokens(chains)`` answers cached TOKENS per engine, and ``record_sent(engine,
chains[index.block_size(engine)])`` records the choice. ``match(hashes)`` is the underlying
per-chain question, in blocks.

The table is ``our hash -> bitmask of engine slots``: ``match`` walks the chain once, narrowing
the mask, and stops when no engine is left. Not thread-safe (one event loop owns it)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.common.kv_events import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored, KvEvent
from services.dispatcher.routing import blocks as hashing

SNAPSHOT_VERSION = 1
DEFAULT_BLOCK_SIZE = 16
DEFAULT_CAPACITY = 1 << 16  # blocks an engine fed by record_sent is assumed to keep
_HOLDER_BITS = 16  # an event-fed block is stored as (our hash << 16) | the mask of its holders
_HOLDERS_MASK = (1 << _HOLDER_BITS) - 1


@dataclass(eq=False, slots=True)
class _Engine:
    name: str
    bit: int  # 1 << slot
    block_size: int
    capacity: int
    fed: bool = False  # by events; else by record_sent
    # fed: engine hash -> (our hash << 16) | holders mask
    blocks: dict[BlockHash, int] = field(default_factory=dict)
    # fed: our hashes of more than one engine block (same tokens, other engine hashes), beyond one
    extra: dict[int, int] = field(default_factory=dict)
    lru: OrderedDict[int, None] = field(default_factory=OrderedDict)  # sent: least recent first

    @property
    def size(self) -> int:
        return len(self.blocks) if self.fed else len(self.lru)


class PrefixIndex:
    """Up to ``max_engines`` engines (one bit each in the table); see the module docstring."""

    def __init__(
        self, *, max_engines: int = 64, block_size: int = DEFAULT_BLOCK_SIZE, capacity: int = DEFAULT_CAPACITY
    ) -> None:
        self.max_engines = max_engines
        self.default_block_size = block_size
        self.default_capacity = capacity
        self.orphans = 0  # stored blocks whose parent was unknown (skipped)
        self.ignored = 0  # stored blocks with a LoRA, or without their full tokens (skipped)
        self._recent = hashing.RecentChains()  # prompts hashed lately: a next turn hashes its new blocks
        self._clear()

    def _clear(self) -> None:
        self._engines: dict[str, _Engine] = {}
        self._slots: list[_Engine | None] = []
        self._all = 0  # bits of every engine
        self._table: dict[int, int] = {}  # our hash -> bits of the engines holding it
        self._holders: dict[tuple[str | None, int | None], int] = {}  # (medium, group) -> its bit

    # -- engines ---------------------------------------------------------------------------------

    def add_engine(self, engine: str, *, block_size: int | None = None, capacity: int | None = None) -> None:
        """Register (or reconfigure) ``engine``; engines are also registered on first use. A new
        block size drops what it holds (its chains are of the old size)."""
        e = self._engine(engine)
        if block_size is not None and block_size != e.block_size:
            hashing.seed(block_size)  # validates it
            self._drop(e)
            e.block_size = block_size
        if capacity is not None:
            self.set_capacity(engine, capacity)

    def set_capacity(self, engine: str, blocks: int) -> None:
        """How many blocks ``engine`` keeps when fed by ``record_sent`` (the excess goes now)."""
        e = self._engine(engine)
        e.capacity = max(0, blocks)
        self._trim(e)

    def block_size(self, engine: str) -> int:
        e = self._engines.get(engine)
        return e.block_size if e is not None else self.default_block_size

    def engines(self) -> list[str]:
        return list(self._engines)

    def fed_by_events(self, engine: str) -> bool:
        e = self._engines.get(engine)
        return e is not None and e.fed

    def __len__(self) -> int:
        """Distinct blocks held by any engine."""
        return len(self._table)

    def size(self, engine: str) -> int:
        """Blocks ``engine`` holds (0 for an unknown engine)."""
        e = self._engines.get(engine)
        return e.size if e is not None else 0

    def reset(self, engine: str) -> None:
        """Forget what ``engine`` holds and how it was fed (its slot and settings stay)."""
        e = self._engines.get(engine)
        if e is not None:
            self._drop(e)
            e.fed = False

    def remove(self, engine: str) -> None:
        """Forget ``engine`` entirely, freeing its slot."""
        e = self._engines.pop(engine, None)
        if e is not None:
            self._drop(e)
            self._slots[e.bit.bit_length() - 1] = None
            self._all &= ~e.bit

    def _engine(self, engine: str) -> _Engine:
        e = self._engines.get(engine)
        if e is None:
            try:
                slot = self._slots.index(None)
            except ValueError:
                slot = len(self._slots)
                if slot >= self.max_engines:
                    raise ValueError(f"the prefix index is full ({self.max_engines} engines)") from None
                self._slots.append(None)
            e = _Engine(engine, 1 << slot, self.default_block_size, self.default_capacity)
            self._engines[engine] = self._slots[slot] = e
            self._all |= e.bit
        return e

    # -- knowledge -------------------------------------------------------------------------------

    def apply(self, engine: str, event: KvEvent) -> None:
        """One of ``engine``'s KV cache events, in the engine's order. Replaying events already
        applied is harmless (a store of a held block, a removal of an absent one change nothing)."""
        e = self._engine(engine)
        if not e.fed:
            self._drop(e)  # what record_sent assumed gives way to the engine's word
            e.fed = True
        if isinstance(event, BlockStored):
            self._stored(e, event)
        elif isinstance(event, BlockRemoved):
            bits = self._holder_bits(event.medium, event.group_idx)
            for key in event.block_hashes:
                self._unhold(e, key, bits)
        elif isinstance(event, AllBlocksCleared):
            if event.medium is None:
                self._drop(e)
            else:
                bits = self._holder_bits(event.medium, None)
                for key in [k for k, v in e.blocks.items() if v & bits]:
                    self._unhold(e, key, bits)

    def _stored(self, e: _Engine, event: BlockStored) -> None:
        n, size = len(event.block_hashes), event.block_size
        if event.lora_id is not None or size < 1:
            self.ignored += n
            return
        if size != e.block_size:
            self._drop(e)
            e.block_size = size
        if event.parent_block_hash is None:
            parent = hashing.seed(size)
        else:
            packed = e.blocks.get(event.parent_block_hash)
            if packed is None:
                self.orphans += n
                return
            parent = hashing.hash_bytes(packed >> _HOLDER_BITS)
        count = min(n, len(event.token_ids) // size)
        self.ignored += n - count
        try:
            data = hashing.token_bytes(event.token_ids)
        except (OverflowError, TypeError):  # not token ids
            self.ignored += count
            return
        ours = hashing.extend(parent, data, count, size)
        holder = self._holder_bit(event.medium, event.group_idx)
        blocks = e.blocks
        for key, h in zip(event.block_hashes, ours, strict=False):
            packed = blocks.get(key)
            if packed is not None and packed >> _HOLDER_BITS == h:
                blocks[key] = packed | holder
                continue
            if packed is not None:  # the engine reused a hash for other tokens: replace
                self._unref(e, packed >> _HOLDER_BITS)
            blocks[key] = h << _HOLDER_BITS | holder
            self._ref(e, h)

    def record_sent(self, engine: str, hashes: Sequence[int]) -> None:
        """``hashes`` (a chain of ``engine``'s block size) were sent to ``engine``: assume them
        cached there, most recently used. A no-op for an engine fed by events."""
        e = self._engine(engine)
        if e.fed:
            return
        lru, table, bit = e.lru, self._table, e.bit
        for h in reversed(hashes):  # tail first: the head ends up the most recent
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                table[h] = table.get(h, 0) | bit
        self._trim(e)

    def _trim(self, e: _Engine) -> None:
        lru = e.lru
        while len(lru) > e.capacity:
            h, _ = lru.popitem(last=False)
            self._clear_bit(h, e.bit)

    def _holder_bit(self, medium: str | None, group: int | None) -> int:
        bit = self._holders.get((medium, group))
        if bit is None:
            if len(self._holders) >= _HOLDER_BITS:
                raise ValueError(f"more than {_HOLDER_BITS} (medium, KV cache group) pairs")
            bit = self._holders[medium, group] = 1 << len(self._holders)
        return bit

    def _holder_bits(self, medium: str | None, group: int | None) -> int:
        """The holders a removal applies to; None is any medium, any group (an engine that does
        not say: better to forget a block still held than to keep one that is gone)."""
        bits = 0
        for (m, g), bit in self._holders.items():
            if (medium is None or m == medium) and (group is None or g == group):
                bits |= bit
        return bits

    def _unhold(self, e: _Engine, key: BlockHash, holders: int) -> None:
        packed = e.blocks.get(key)
        if packed is None or not packed & holders:
            return
        packed &= ~holders
        if packed & _HOLDERS_MASK:
            e.blocks[key] = packed
        else:
            del e.blocks[key]
            self._unref(e, packed >> _HOLDER_BITS)

    def _ref(self, e: _Engine, h: int) -> None:
        held = self._table.get(h, 0)
        if held & e.bit:
            e.extra[h] = e.extra.get(h, 0) + 1
        else:
            self._table[h] = held | e.bit

    def _unref(self, e: _Engine, h: int) -> None:
        n = e.extra.get(h)
        if n is None:
            self._clear_bit(h, e.bit)
        elif n > 1:
            e.extra[h] = n - 1
        else:
            del e.extra[h]

    def _clear_bit(self, h: int, bit: int) -> None:
        held = self._table.get(h, 0) & ~bit
        if held:
            self._table[h] = held
        else:
            self._table.pop(h, None)

    def _drop(self, e: _Engine) -> None:
        ours = (p >> _HOLDER_BITS for p in e.blocks.values()) if e.fed else iter(e.lru)
        for h in ours:
            self._clear_bit(h, e.bit)
        e.blocks.clear()
        e.extra.clear()
        e.lru.clear()

    # -- questions -------------------------------------------------------------------------------

    def match(self, hashes: Sequence[int], engines: Iterable[str] | None = None) -> dict[str, int]:
        """How many LEADING blocks of the chain ``hashes`` each engine holds (of ``engines``, default
        all); engines holding none are omitted. Engines of another block size hold none."""
        return self._match(hashes, self._bits(engines))

    def chains(self, token_ids: Sequence[int], engines: Iterable[str] | None = None) -> dict[int, list[int]]:
        """The prompt's chain for each block size of ``engines`` (default all)."""
        sizes = {e.block_size for e in self._selected(engines)} or {self.default_block_size}
        return {size: self._recent.hashes(token_ids, size) for size in sorted(sizes)}

    def cached_tokens(
        self, chains: Mapping[int, Sequence[int]], engines: Iterable[str] | None = None
    ) -> dict[str, int]:
        """Leading prompt TOKENS each engine holds, from ``chains`` (by block size, as made by
        ``chains``); engines holding none, or of a size missing from ``chains``, are omitted."""
        by_size: dict[int, int] = {}
        for e in self._selected(engines):
            by_size[e.block_size] = by_size.get(e.block_size, 0) | e.bit
        out: dict[str, int] = {}
        for size, bits in by_size.items():
            chain = chains.get(size)
            if chain is not None:
                out.update((name, n * size) for name, n in self._match(chain, bits).items())
        return out

    def _selected(self, engines: Iterable[str] | None) -> list[_Engine]:
        if engines is None:
            return list(self._engines.values())
        return [e for name in engines if (e := self._engines.get(name)) is not None]

    def _bits(self, engines: Iterable[str] | None) -> int:
        return self._all if engines is None else sum({e.bit for e in self._selected(engines)})

    def _match(self, hashes: Sequence[int], alive: int) -> dict[str, int]:
        out: dict[str, int] = {}
        get = self._table.get
        depth = 0
        for h in hashes:
            held = get(h, 0) & alive
            if held != alive:
                if depth:
                    self._credit(out, alive & ~held, depth)
                alive = held
                if not alive:
                    return out
            depth += 1
        if depth and alive:
            self._credit(out, alive, depth)
        return out

    def _credit(self, out: dict[str, int], bits: int, depth: int) -> None:
        while bits:
            low = bits & -bits
            e = self._slots[low.bit_length() - 1]
            if e is not None:
                out[e.name] = depth
            bits ^= low

    # -- snapshot --------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The whole index as str/int/bool/list/dict/None only (orjson and msgpack take it as is;
        hash arrays are base64 of little-endian uint64). Counters are not included."""
        engines = []
        for e in self._engines.values():
            d: dict[str, Any] = {"id": e.name, "block_size": e.block_size, "capacity": e.capacity, "fed": e.fed}
            if e.fed:
                d["keys"] = hashing.pack_keys(list(e.blocks))
                d["ours"] = hashing.pack_ints("Q", [p >> _HOLDER_BITS for p in e.blocks.values()])
                d["holders"] = hashing.pack_ints("H", [p & _HOLDERS_MASK for p in e.blocks.values()])
            else:
                d["sent"] = hashing.pack_ints("Q", list(e.lru))  # least recent first
            engines.append(d)
        return {
            "v": SNAPSHOT_VERSION,
            "scheme": hashing.SCHEME,
            "holders": [list(k) for k in self._holders],
            "engines": engines,
        }

    def restore(self, snapshot: Mapping[str, Any]) -> None:
        """Replace the whole index with a ``snapshot`` (engines get new slots). ValueError when the
        snapshot is of another version or hash scheme, or malformed (the index is then empty)."""
        if snapshot.get("v") != SNAPSHOT_VERSION or snapshot.get("scheme") != hashing.SCHEME:
            raise ValueError(f"snapshot of version {snapshot.get('v')!r}, scheme {snapshot.get('scheme')!r}")
        self._clear()
        try:
            for medium, group in snapshot["holders"]:
                self._holder_bit(medium, group)
            for d in snapshot["engines"]:
                self.add_engine(d["id"], block_size=int(d["block_size"]), capacity=int(d["capacity"]))
                e = self._engines[d["id"]]
                if d["fed"]:
                    e.fed = True
                    keys = hashing.unpack_keys(d["keys"])
                    ours, holders = hashing.unpack_ints("Q", d["ours"]), hashing.unpack_ints("H", d["holders"])
                    for key, h, m in zip(keys, ours, holders, strict=True):  # ValueError if lengths differ
                        e.blocks[key] = h << _HOLDER_BITS | m
                        self._ref(e, h)
                else:  # least recent first, and record_sent takes the chain tail first
                    self.record_sent(e.name, hashing.unpack_ints("Q", d["sent"])[::-1])
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            self._clear()
            raise ValueError(f"malformed prefix index snapshot: {type(exc).__name__}: {exc}") from exc
