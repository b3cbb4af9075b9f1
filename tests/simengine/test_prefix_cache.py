"""The simulated engine's block prefix cache: cached tokens as vLLM counts them, LRU eviction
within its capacity that keeps every stored chain rooted, and the KV cache events an engine
would publish for it (which, applied in order, give a consumer exactly the cache's blocks)."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from services.simengine.state import PrefixCache, Recorder, block_hash

B = 16


def tokens(first: int, n: int) -> list[int]:
    return [first * 1000 + i for i in range(n)]


def chain(ids: Sequence[int], size: int = B) -> list[int]:
    hashes: list[int] = []
    for start in range(0, len(ids) - size + 1, size):
        hashes.append(block_hash(hashes[-1] if hashes else None, ids[start : start + size]))
    return hashes


class Heard:
    def __init__(self) -> None:
        self.events: list[KvEvent] = []

    def __call__(self, events: list[KvEvent]) -> None:
        self.events.extend(events)

    def take(self) -> list[KvEvent]:
        taken, self.events = self.events, []
        return taken


def test_the_hash_is_a_chain_hash() -> None:
    """A block's hash names its whole prefix: it depends on its parent's hash and its tokens,
    and is an unsigned 64-bit int, as an engine's are."""
    ids = tokens(1, B)
    first = block_hash(None, ids)
    assert first == block_hash(None, list(ids)) and 0 <= first < 1 << 64
    assert block_hash(first, ids) != first and block_hash(first, ids) == block_hash(first, tuple(ids))
    assert block_hash(None, tokens(2, B)) != first


def test_cached_tokens_are_whole_blocks_short_of_the_last_token() -> None:
    cache = PrefixCache()
    prompt = tokens(1, 40)  # two full blocks and 8 tokens
    assert cache.lookup_and_insert(prompt) == 0
    assert cache.lookup_and_insert(prompt) == 32
    assert cache.lookup_and_insert(prompt[:32]) == 16  # all cached, yet the last token is computed
    assert cache.lookup_and_insert(prompt + tokens(2, 30)) == 32
    assert cache.lookup_and_insert(tokens(3, 40)) == 0
    assert cache.lookup_and_insert([7]) == 0 and cache.lookup_and_insert([]) == 0
    assert len(cache) == 2 + 2 + 2  # prompt's, its extension's, the other prompt's


def test_stored_chains_name_their_parent() -> None:
    heard = Heard()
    cache = PrefixCache(on_events=heard)
    prompt = tokens(1, 70)
    h = chain(prompt)
    cache.lookup_and_insert(prompt[:40])
    assert heard.take() == [BlockStored((h[0], h[1]), None, tuple(prompt[:32]), B, medium="GPU")]
    cache.lookup_and_insert(prompt[:40])
    assert heard.take() == []  # nothing new: nothing said
    cache.lookup_and_insert(prompt)
    assert heard.take() == [BlockStored((h[2], h[3]), h[1], tuple(prompt[32:64]), B, medium="GPU")]
    assert cache.parent(h[2]) == h[1] and cache.parent(h[0]) is None


def test_least_recently_used_blocks_go_first_tail_first() -> None:
    heard = Heard()
    cache = PrefixCache(capacity_tokens=4 * B + 5, on_events=heard)  # 4 blocks
    a, b, c = tokens(1, 2 * B), tokens(2, 2 * B), tokens(3, 2 * B)
    cache.lookup_and_insert(a)
    cache.lookup_and_insert(b)
    cache.lookup_and_insert(a)  # a is used again: b is now the least recent
    heard.take()
    cache.lookup_and_insert(c)
    hb, hc = chain(b), chain(c)
    assert heard.take() == [
        BlockRemoved((hb[1],), "GPU"),  # the tail before its parent
        BlockRemoved((hb[0],), "GPU"),
        BlockStored(tuple(hc), None, tuple(c), B, medium="GPU"),
    ]
    assert set(cache) == set(chain(a)) | set(hc)
    assert cache.lookup_and_insert(a) == B  # still there (whole blocks short of the last token)
    assert cache.lookup_and_insert(b) == 0


def test_a_shared_prefix_outlives_its_branches() -> None:
    cache = PrefixCache(capacity_tokens=4 * B)
    root = tokens(1, B)
    cache.lookup_and_insert(root + tokens(2, B))
    cache.lookup_and_insert(root + tokens(3, B))
    cache.lookup_and_insert(tokens(4, 2 * B))  # needs two blocks: the oldest leaves go, not the root
    assert block_hash(None, root) in cache
    assert block_hash(block_hash(None, root), tokens(3, B)) in cache
    assert len(cache) == 4


def test_a_prompt_longer_than_the_cache_keeps_its_head() -> None:
    heard = Heard()
    cache = PrefixCache(capacity_tokens=3 * B, on_events=heard)
    prompt = tokens(1, 10 * B)
    cache.lookup_and_insert(prompt)
    assert list(cache)[::-1] == chain(prompt)[:3]  # root most recent
    (event,) = heard.take()
    assert isinstance(event, BlockStored) and list(event.block_hashes) == chain(prompt)[:3]
    assert cache.lookup_and_insert(prompt) == 3 * B
    assert PrefixCache(capacity_tokens=B - 1).lookup_and_insert(prompt) == 0


def test_clear_says_all_blocks_cleared() -> None:
    heard = Heard()
    cache = PrefixCache(on_events=heard)
    cache.lookup_and_insert(tokens(1, 3 * B))
    heard.take()
    cache.clear()
    assert heard.take() == [AllBlocksCleared()]
    assert len(cache) == 0 and cache.lookup_and_insert(tokens(1, 3 * B)) == 0


def test_other_block_sizes_and_the_recorder_default() -> None:
    cache = PrefixCache(capacity_tokens=100, block_size=4)
    assert cache.capacity_blocks == 25
    cache.lookup_and_insert(list(range(10)))
    assert cache.lookup_and_insert(list(range(10))) == 8
    assert Recorder().prefix_cache.block_size == B


# prompts from a few shared heads and tails, so chains share prefixes, branch and get evicted
prompts = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(0, 6 * B)).map(
        lambda t: tokens(t[0], B * (t[1] % 3)) + tokens(10 + t[1], t[2])
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(prompts, st.integers(0, 12))
def test_the_events_rebuild_the_cache(batch: list[list[int]], capacity_blocks: int) -> None:
    """A consumer applying the events in order holds exactly the cached blocks; every stored
    run hangs off a block it holds (or the root); every cached block's parent is cached."""
    mirror: dict[int, int | None] = {}

    def apply(events: list[KvEvent]) -> None:
        for event in events:
            if isinstance(event, BlockStored):
                assert event.parent_block_hash is None or event.parent_block_hash in mirror
                assert len(event.token_ids) == len(event.block_hashes) * B
                parent = event.parent_block_hash
                for h in event.block_hashes:
                    assert isinstance(h, int)
                    mirror[h], parent = parent, h
            elif isinstance(event, BlockRemoved):
                for h in event.block_hashes:
                    assert isinstance(h, int)
                    assert h in mirror and h not in mirror.values()  # a leaf
                    del mirror[h]
            else:
                mirror.clear()

    cache = PrefixCache(capacity_tokens=capacity_blocks * B, on_events=apply)
    for ids in batch:
        hit = cache.lookup_and_insert(ids)
        assert hit % B == 0 and hit <= max(0, len(ids) - 1)
        assert len(cache) <= capacity_blocks
        assert {h: cache.parent(h) for h in cache} == mirror
        assert all(parent is None or parent in mirror for parent in mirror.values())
