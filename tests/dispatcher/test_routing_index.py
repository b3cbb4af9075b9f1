"""Our chained block hashes, and the prefix index fed by engines' KV events or by what was sent."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.kv_events import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored
from services.dispatcher.routing import PrefixIndex, chain_hashes
from services.dispatcher.routing.blocks import RecentChains

BS = 4
PROMPT = list(range(100, 124))  # 6 blocks of 4
CHAIN = chain_hashes(PROMPT, BS)


def stored(keys: list[BlockHash], parent: BlockHash | None, first: int, **kw: object) -> BlockStored:
    """The engine stored blocks ``first``.. of PROMPT under its own hashes ``keys``."""
    tokens = tuple(PROMPT[first * BS : (first + len(keys)) * BS])
    return BlockStored(tuple(keys), parent, tokens, BS, **kw)  # type: ignore[arg-type]


# -- chain hashes ---------------------------------------------------------------------------------


def test_chain_hashes_are_pinned() -> None:
    # the same in every process and run (a change here breaks snapshots exchanged between peers)
    assert chain_hashes(list(range(40)), 16) == [10852335820235209880, 6896905458845940295]
    assert all(0 <= h < 1 << 64 for h in CHAIN)


def test_only_full_blocks_are_hashed() -> None:
    assert chain_hashes(PROMPT[:7], BS) == CHAIN[:1]
    assert chain_hashes(PROMPT[:3], BS) == []
    assert chain_hashes(PROMPT + [1, 2, 3], BS) == CHAIN
    with pytest.raises(ValueError):
        chain_hashes(PROMPT, 0)


@given(
    base=st.lists(st.integers(0, 201_087), max_size=200),
    more=st.lists(st.lists(st.integers(0, 201_087), max_size=60), max_size=4),
    cut=st.integers(0, 200),
    size=st.sampled_from([1, 4, 16]),
)
def test_recent_chains_hash_as_chain_hashes(base: list[int], more: list[list[int]], cut: int, size: int) -> None:
    """A prompt that extends a recent one (or not), of any block size: the same chain."""
    recent = RecentChains(size=3)
    prompts = [base, *([*base, *extra] for extra in more), base[:cut], [*base[:cut], 7, *base[cut:]]]
    for prompt in prompts:
        assert recent.hashes(prompt, size) == chain_hashes(prompt, size)


def test_hashes_differ_by_token_and_position() -> None:
    changed = list(PROMPT)
    changed[5] += 1  # in block 1
    other = chain_hashes(changed, BS)
    assert other[0] == CHAIN[0] and all(a != b for a, b in zip(other[1:], CHAIN[1:], strict=True))
    # the same block content at another position (after other blocks) hashes differently
    swapped = PROMPT[4:8] + PROMPT[0:4] + PROMPT[8:]
    assert chain_hashes(swapped, BS)[:2] != CHAIN[:2]
    assert chain_hashes([7] * 8, BS)[0] != chain_hashes([7] * 8, BS)[1]
    assert len(set(CHAIN)) == len(CHAIN)
    # other block sizes make other chains, even over the same tokens
    assert not set(chain_hashes(PROMPT, 2 * BS)) & set(CHAIN)


# -- events ---------------------------------------------------------------------------------------


def test_events_build_chains_across_events() -> None:
    index = PrefixIndex()
    index.apply("a", stored([11, 12], None, 0))
    assert index.match(CHAIN) == {"a": 2}
    # the chain goes on in another event, linked to its parent by the engine's hash
    index.apply("a", stored([13, 14, 15], 12, 2))
    assert index.match(CHAIN) == {"a": 5}
    assert index.size("a") == 5 and index.block_size("a") == BS and index.fed_by_events("a")
    # a branch off block 1: another prompt sharing two blocks
    branch = PROMPT[:8] + [9, 9, 9, 9]
    index.apply("a", BlockStored((21,), 12, (9, 9, 9, 9), BS))
    assert index.match(chain_hashes(branch, BS)) == {"a": 3}
    # engines' hashes may be bytes too
    index.apply("b", stored([b"\x01" * 32, b"\x02" * 32], None, 0))
    assert index.match(CHAIN) == {"a": 5, "b": 2}


def test_orphans_and_lora_blocks_are_skipped_and_counted() -> None:
    index = PrefixIndex()
    index.apply("a", stored([13, 14], 12, 2))  # its parent's event was missed
    assert index.orphans == 2 and index.size("a") == 0 and index.match(CHAIN) == {}
    index.apply("a", stored([11], None, 0, lora_id=3))
    assert index.ignored == 1 and index.match(CHAIN) == {}
    # a block without its full tokens cannot be hashed
    index.apply("a", BlockStored((11, 12), None, tuple(PROMPT[:6]), BS))
    assert index.ignored == 2 and index.match(CHAIN) == {"a": 1}
    index.apply("a", BlockStored((12,), 11, (-1, 2, 3, 4), BS))  # not token ids
    index.apply("a", BlockStored((12,), 11, (), 0))
    assert index.ignored == 4 and index.match(CHAIN) == {"a": 1}


def test_removal_is_per_medium() -> None:
    index = PrefixIndex()
    index.apply("a", stored([11, 12, 13], None, 0, medium="GPU"))
    index.apply("a", stored([11, 12], None, 0, medium="CPU"))
    index.apply("a", BlockRemoved((11, 12, 13), medium="GPU"))
    assert index.match(CHAIN) == {"a": 2}  # the CPU copies are still there
    index.apply("a", BlockRemoved((12,), medium="CPU"))
    assert index.match(CHAIN) == {"a": 1}
    index.apply("a", BlockRemoved((11,), medium="DISK"))  # a medium that holds nothing
    assert index.match(CHAIN) == {"a": 1}
    index.apply("a", BlockRemoved((11,)))  # no medium: every medium
    assert index.match(CHAIN) == {} and index.size("a") == 0


def test_kv_cache_groups_hold_blocks_apart() -> None:
    # gpt-oss is hybrid: the sliding-window group evicts a prefix the full-attention group keeps
    index = PrefixIndex()
    index.apply("a", stored([11, 12, 13], None, 0, medium="GPU", group_idx=0))
    index.apply("a", stored([11, 12, 13], None, 0, medium="GPU", group_idx=1))
    index.apply("a", BlockRemoved((11, 12, 13), medium="GPU", group_idx=1))
    assert index.match(CHAIN) == {"a": 3}
    index.apply("a", BlockRemoved((13,), medium="GPU", group_idx=0))
    assert index.match(CHAIN) == {"a": 2}
    index.apply("a", stored([13], 12, 2, medium="GPU", group_idx=1))
    index.apply("a", AllBlocksCleared(medium="GPU"))  # every group
    assert index.match(CHAIN) == {} and index.size("a") == 0


def test_a_gap_stops_the_match() -> None:
    index = PrefixIndex()
    index.apply("a", stored([11, 12, 13, 14], None, 0))
    index.apply("a", BlockRemoved((13,)))
    assert index.match(CHAIN) == {"a": 2}  # block 3 is held, but after a gap


def test_all_blocks_cleared() -> None:
    index = PrefixIndex()
    index.apply("a", stored([11, 12, 13], None, 0, medium="GPU"))
    index.apply("a", stored([11], None, 0, medium="CPU"))
    index.apply("b", stored([11, 12], None, 0, medium="GPU"))
    index.apply("a", AllBlocksCleared(medium="GPU"))
    assert index.match(CHAIN) == {"a": 1, "b": 2}
    index.apply("a", AllBlocksCleared())
    assert index.match(CHAIN) == {"b": 2} and index.size("a") == 0
    index.apply("a", stored([11], None, 0))  # and it fills again
    assert index.match(CHAIN) == {"a": 1, "b": 2}


def test_one_chain_under_two_engine_hashes() -> None:
    # e.g. a cache salt: the engine keeps two blocks of the same tokens
    index = PrefixIndex()
    index.apply("a", stored([11, 12], None, 0))
    index.apply("a", stored([31, 32], None, 0))
    index.apply("a", BlockRemoved((11, 12)))
    assert index.match(CHAIN) == {"a": 2}
    index.apply("a", BlockRemoved((31,)))
    assert index.match(CHAIN) == {}


# -- what was sent --------------------------------------------------------------------------------


def test_sent_prompts_age_by_capacity() -> None:
    a, b = CHAIN[:3], chain_hashes(list(range(500, 512)), BS)
    index = PrefixIndex()
    index.set_capacity("e", 4)
    index.record_sent("e", a)
    index.record_sent("e", b)
    # over capacity: the least recent blocks went, the older prompt's tail first
    assert index.size("e") == 4
    assert index.match(a) == {"e": 1} and index.match(b) == {"e": 3}
    index.record_sent("e", a)  # sent again: refreshed, and b ages
    assert index.match(a) == {"e": 3} and index.match(b) == {"e": 1}
    index.set_capacity("e", 2)
    assert index.match(a) == {"e": 2} and index.match(b) == {}


def test_events_take_over_from_what_was_sent() -> None:
    index = PrefixIndex()
    index.record_sent("a", CHAIN)
    assert index.match(CHAIN) == {"a": 6}
    index.apply("a", stored([11], None, 0))
    assert index.match(CHAIN) == {"a": 1}
    index.record_sent("a", CHAIN)  # the engine's events are the truth now
    assert index.match(CHAIN) == {"a": 1}
    index.reset("a")  # its event stream failed: back to what is sent
    assert index.match(CHAIN) == {} and not index.fed_by_events("a")
    index.record_sent("a", CHAIN[:2])
    assert index.match(CHAIN) == {"a": 2}


def test_match_per_engine_and_filter() -> None:
    index = PrefixIndex()
    index.record_sent("a", CHAIN)
    index.record_sent("b", CHAIN[:2])
    index.record_sent("c", CHAIN[1:])  # not leading
    index.add_engine("d")
    assert index.match(CHAIN) == {"a": 6, "b": 2}
    assert index.match(CHAIN, ["b", "c", "nobody"]) == {"b": 2}
    assert index.match([]) == {}
    index.remove("a")
    assert index.match(CHAIN) == {"b": 2} and "a" not in index.engines()


def test_engines_of_several_block_sizes() -> None:
    index = PrefixIndex()
    index.apply("small", stored([11, 12, 13], None, 0))
    index.add_engine("big", block_size=2 * BS)
    chains = index.chains(PROMPT + [1])
    assert sorted(chains) == [BS, 2 * BS] and chains[BS] == CHAIN
    index.record_sent("big", chains[index.block_size("big")][:2])
    assert index.cached_tokens(chains) == {"small": 3 * BS, "big": 4 * BS}
    assert index.cached_tokens(chains, ["big"]) == {"big": 4 * BS}
    assert index.cached_tokens({BS: CHAIN}) == {"small": 3 * BS}


def test_full_index() -> None:
    index = PrefixIndex(max_engines=2)
    index.add_engine("a")
    index.add_engine("b")
    with pytest.raises(ValueError, match="full"):
        index.add_engine("c")
    index.remove("a")
    index.record_sent("c", CHAIN)  # took a's slot
    assert index.match(CHAIN) == {"c": 6}


# -- snapshots ------------------------------------------------------------------------------------


def test_snapshot_restore_round_trip() -> None:
    index = PrefixIndex()
    index.apply("u64", stored([11, 12, 1 << 63], None, 0, medium="GPU"))
    index.apply("u64", stored([11], None, 0, medium="CPU", group_idx=1))
    index.apply("i64", stored([-5, 6], None, 0))
    index.apply("any", stored([b"\x01" * 32, 1 << 70], None, 0))
    index.set_capacity("sent", 3)
    index.record_sent("sent", CHAIN[:2])
    index.record_sent("sent", chain_hashes(list(range(500, 504)), BS))  # most recent
    index.add_engine("big", block_size=8)

    wire = orjson.dumps(index.snapshot())
    peer = PrefixIndex()
    peer.record_sent("stale", CHAIN)
    peer.restore(orjson.loads(wire))
    assert peer.match(CHAIN) == index.match(CHAIN) == {"u64": 3, "i64": 2, "any": 2, "sent": 2}
    assert {e: peer.size(e) for e in peer.engines()} == {e: index.size(e) for e in index.engines()}
    assert peer.block_size("big") == 8 and peer.fed_by_events("u64") and not peer.fed_by_events("sent")
    assert peer.snapshot() == index.snapshot()
    # events go on from the restored state: children of restored parents, removals by medium
    peer.apply("u64", stored([14], 1 << 63, 3))
    peer.apply("any", stored([77], 1 << 70, 2))
    peer.apply("u64", BlockRemoved((11, 12), medium="GPU"))  # 11 is on the CPU too
    assert peer.match(CHAIN) == {"u64": 1, "i64": 2, "any": 3, "sent": 2}
    # and the LRU order survived: one more block ages the least recent, CHAIN's tail
    peer.record_sent("sent", chain_hashes(list(range(600, 604)), BS))
    assert peer.match(CHAIN, ["sent"]) == {"sent": 1}


def test_restore_refuses_other_versions_and_garbage() -> None:
    index = PrefixIndex()
    index.record_sent("a", CHAIN)
    snap = index.snapshot()
    with pytest.raises(ValueError, match="version"):
        PrefixIndex().restore({**snap, "v": 99})
    peer = PrefixIndex()
    with pytest.raises(ValueError, match="malformed"):
        peer.restore({**snap, "engines": [{"id": "a", "block_size": 4}]})
    assert peer.engines() == [] and peer.match(CHAIN) == {}
