"""``decode_batch`` reads every form vLLM and SGLang releases have sent, and ``encode_batch``
writes what vLLM's own msgspec encoder writes.

The payloads below were produced once with msgspec 0.22 from struct definitions copied from each
release's ``kv_events.py`` (the ``EventBatch``, ``KVCacheEvent`` and event classes, their struct
options and fields exactly as there), and frozen as bytes: the reader is tested against the
bytes, not against a second copy of the structs."""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodedBatch,
    EventBatch,
    KvDecodeError,
    KvEvent,
    WireForm,
    decode_batch,
    encode_batch,
)

TS = 1757500000.25
# token ids of every msgpack int width (fixint, uint8, uint16, uint32), harmony's specials first
TOKENS_A = (200006, 17360, 200008, 3575, 553, 17554, 2360, 25, 167, 40, 65535, 65536, 0, 1, 127, 128)
TOKENS_B = tuple(range(1000, 1016))
H1 = hashlib.sha256(b"chorus-fixture-1").digest()  # vLLM's hashes: sha256 digests since vllm#23673
H2 = hashlib.sha256(b"chorus-fixture-2").digest()
BIG = 15760518052499183552  # an unsigned 64-bit hash, as vLLM 0.26 sent (volcano-sh/kthena#1535)

# vLLM 0.9.0, the first release with KV events (vllm-project/vllm#16750; the file at
# vllm-project/vllm@b4e69e0): EventBatch(array_like, omit_defaults)[ts, events];
# KVCacheEvent(array_like, omit_defaults, tag=True); BlockStored(block_hashes: list[int],
# parent_block_hash: Optional[int], token_ids, block_size, lora_id: Optional[int]);
# BlockRemoved(block_hashes); AllBlocksCleared. Hashes from Python's hash(): signed.
VLLM_0_9_0 = bytes.fromhex(
    "92cb41da3054981000009496ab426c6f636b53746f72656491d3c6326563d464edeac0dc0010ce00030d46cd43d0ce00030d"
    "48cd0df7cd0229cd4492cd093819cca728cdffffce0001000000017fcc8010c096ab426c6f636b53746f72656491cf614f91"
    "a82241d72bd3c6326563d464edeadc0010cd03e8cd03e9cd03eacd03ebcd03eccd03edcd03eecd03efcd03f0cd03f1cd03f2"
    "cd03f3cd03f4cd03f5cd03f6cd03f710c092ac426c6f636b52656d6f76656491cf614f91a82241d72b91b0416c6c426c6f63"
    "6b73436c6561726564"
)
# vLLM after DP support, before `medium`: EventBatch gained `data_parallel_rank: Optional[int]
# = None` (written: array_like ignores omit_defaults); events as 0.9.0.
VLLM_DP_RANK = bytes.fromhex(
    "93cb41da3054981000009296ab426c6f636b53746f726564926566c0dc0020ce00030d46cd43d0ce00030d48cd0df7cd0229"
    "cd4492cd093819cca728cdffffce0001000000017fcc80cd03e8cd03e9cd03eacd03ebcd03eccd03edcd03eecd03efcd03f0"
    "cd03f1cd03f2cd03f3cd03f4cd03f5cd03f6cd03f710c092ac426c6f636b52656d6f766564916601"
)
# vLLM after #19737: `medium: Optional[str]` (no default) on BlockStored and BlockRemoved, int
# hashes (an unsigned 64-bit one here); as examples/online_serving/kv_events_subscriber.py
# copies them at vllm-project/vllm@0ef0f42, plus the batch's rank.
VLLM_MEDIUM = bytes.fromhex(
    "93cb41da3054981000009397ab426c6f636b53746f72656491cffffffffffffffffbc0dc0010ce00030d46cd43d0ce00030d"
    "48cd0df7cd0229cd4492cd093819cca728cdffffce0001000000017fcc8010c0a347505593ac426c6f636b52656d6f766564"
    "91cffffffffffffffffba343505591b0416c6c426c6f636b73436c656172656400"
)
# vLLM main just before #42892 (the last array form): hashes `ExternalBlockHash = bytes | int`
# (sha256 digests), then `lora_name` (#27577), `extra_keys = None` (#33304), `group_idx = None`
# (#37688), `kv_cache_spec_kind = None`, `kv_cache_spec_sliding_window = None` (#40984); every
# field written, defaults included. A second group's (sliding-window) store and removal.
VLLM_ARRAY_BYTES = bytes.fromhex(
    "93cb41da305498100000949cab426c6f636b53746f72656491c420c42ebb0e55eae726462d7ace3444d30708f74779610eb5"
    "61a266103bb5c8d3cec0dc0010ce00030d46cd43d0ce00030d48cd0df7cd0229cd4492cd093819cca728cdffffce00010000"
    "00017fcc8010c0a3475055c091c000ae66756c6c5f617474656e74696f6ec09cab426c6f636b53746f72656491c42062f57f"
    "ccdf79dd7c4d37001e62137dbda4c57f258930f9d5c690e4f065ec3f23c420c42ebb0e55eae726462d7ace3444d30708f747"
    "79610eb561a266103bb5c8d3cedc0010cd03e8cd03e9cd03eacd03ebcd03eccd03edcd03eecd03efcd03f0cd03f1cd03f2cd"
    "03f3cd03f4cd03f5cd03f6cd03f710c0a3475055a761646170746572c001ae736c6964696e675f77696e646f77cc8094ac42"
    "6c6f636b52656d6f76656491c42062f57fccdf79dd7c4d37001e62137dbda4c57f258930f9d5c690e4f065ec3f23a3475055"
    "0191b0416c6c426c6f636b73436c656172656400"
)
# vLLM after #42892 (structs of v0.28.0): KVCacheEvent without array_like, so each event is a
# map tagged {"type": "BlockStored"}, defaults left out; EventBatch still array_like; BlockStored
# also has `locality = None` (set here), BlockRemoved `locality = None`.
VLLM_MAP = bytes.fromhex(
    "93cb41da305498100000948ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cfdab89baa7b58"
    "57c0b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc0010ce00030d46cd43d0ce00030d48cd0df7"
    "cd0229cd4492cd093819cca728cdffffce0001000000017fcc80aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d65"
    "6469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797391c0a967726f75705f69647800b26b765f636163"
    "68655f737065635f6b696e64ae66756c6c5f617474656e74696f6e8ba474797065ab426c6f636b53746f726564ac626c6f63"
    "6b5f686173686573912ab1706172656e745f626c6f636b5f68617368cfdab89baa7b5857c0a9746f6b656e5f696473dc0010"
    "cd03e8cd03e9cd03eacd03ebcd03eccd03edcd03eecd03efcd03f0cd03f1cd03f2cd03f3cd03f4cd03f5cd03f6cd03f7aa62"
    "6c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0a967726f75705f6964"
    "7800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6ea86c6f63616c697479a54c4f4341"
    "4c84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f686173686573912aa66d656469756da3475055a967726f"
    "75705f6964780081a474797065b0416c6c426c6f636b73436c656172656400"
)
# vllm-project/vllm@0181ea3: EventBatch without array_like too, so the batch is a map
# {"ts", "events", "data_parallel_rank"}; events as after #42892 (no locality).
VLLM_MAP_BATCH = bytes.fromhex(
    "83a27473cb41da305498100000a66576656e74739288a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368"
    "657391c420c42ebb0e55eae726462d7ace3444d30708f74779610eb561a266103bb5c8d3ceb1706172656e745f626c6f636b"
    "5f68617368c0a9746f6b656e5f696473dc0010ce00030d46cd43d0ce00030d48cd0df7cd0229cd4492cd093819cca728cdff"
    "ffce0001000000017fcc80aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e"
    "616d65c083a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391c420c42ebb0e55eae726462d7a"
    "ce3444d30708f74779610eb561a266103bb5c8d3cea66d656469756da3475055b2646174615f706172616c6c656c5f72616e"
    "6b02"
)
# SGLang's first python/sglang/srt/disaggregation/kv_events.py (sgl-project/sglang@006d053):
# vLLM 0.9.0's structs.
SGLANG_FIRST = bytes.fromhex(
    "92cb41da3054981000009396ab426c6f636b53746f72656492f909c094ce00030d46cd43d0cd03e8cd03e902c092ac426c6f"
    "636b52656d6f766564910991b0416c6c426c6f636b73436c6561726564"
)
# SGLang at sgl-project/sglang@612d579: EventBatch gained `attn_dp_rank: Optional[int] = None`.
SGLANG_DP = bytes.fromhex(
    "93cb41da3054981000009296ab426c6f636b53746f726564910b0a92cd03e8cd03e902c092ac426c6f636b52656d6f766564910b03"
)
# SGLang's newest: no omit_defaults; `medium: Optional[str] = None` on BlockStored and
# BlockRemoved; BlockStoredWithMetadata(BlockStored, tag="BlockStored", kw_only=True) appends
# `metadata: BlockStoredMetadata(cache_salt: str)`, a map, where vLLM has `lora_name`.
SGLANG_NEW = bytes.fromhex(
    "93cb41da3054981000009497ab426c6f636b53746f7265649115c092ce00030d46cd43d002c0c098ab426c6f636b53746f72"
    "656491161592cd03e8cd03e902c0aa4350555f50494e4e454481aa63616368655f73616c74a874656e616e742d6193ac426c"
    "6f636b52656d6f7665649116a347505591b0416c6c426c6f636b73436c656172656400"
)
# What ``encode_batch`` must write, byte for byte: the structs of VLLM_ARRAY_BYTES ("array")
# and of VLLM_MAP ("map") encoding events the simulator sends (no extra_keys, no locality).
VLLM_ARRAY_PLAIN = bytes.fromhex(
    "93cb41da305498100000939cab426c6f636b53746f72656492c420c42ebb0e55eae726462d7ace3444d30708f74779610eb5"
    "61a266103bb5c8d3cec42062f57fccdf79dd7c4d37001e62137dbda4c57f258930f9d5c690e4f065ec3f23c0dc0020ce0003"
    "0d46cd43d0ce00030d48cd0df7cd0229cd4492cd093819cca728cdffffce0001000000017fcc80cd03e8cd03e9cd03eacd03"
    "ebcd03eccd03edcd03eecd03efcd03f0cd03f1cd03f2cd03f3cd03f4cd03f5cd03f6cd03f710c0a3475055c0c0c0c0c094ac"
    "426c6f636b52656d6f76656491c42062f57fccdf79dd7c4d37001e62137dbda4c57f258930f9d5c690e4f065ec3f23a34750"
    "55c091b0416c6c426c6f636b73436c656172656400"
)
VLLM_MAP_PLAIN = bytes.fromhex(
    "93cb41da305498100000938aa474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cfdab89baa7b58"
    "57c02ab1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc0020ce00030d46cd43d0ce00030d48cd0d"
    "f7cd0229cd4492cd093819cca728cdffffce0001000000017fcc80cd03e8cd03e9cd03eacd03ebcd03eccd03edcd03eecd03"
    "efcd03f0cd03f1cd03f2cd03f3cd03f4cd03f5cd03f6cd03f7aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d6564"
    "69756da3475055a96c6f72615f6e616d65c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66"
    "756c6c5f617474656e74696f6e84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f686173686573912aa66d65"
    "6469756da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656400"
)


def stored(
    hashes: tuple[int | bytes, ...], parent: int | bytes | None, tokens: tuple[int, ...], **kw: Any
) -> BlockStored:
    return BlockStored(hashes, parent, tokens, kw.pop("block_size", 16), **kw)


GPU_FULL: dict[str, Any] = {"medium": "GPU", "group_idx": 0, "kv_cache_spec_kind": "full_attention"}
SLIDING: dict[str, Any] = {"group_idx": 1, "kv_cache_spec_kind": "sliding_window", "kv_cache_spec_sliding_window": 128}
# name: (payload, its data_parallel_rank, its events)
CASES: dict[str, tuple[bytes, int | None, tuple[KvEvent, ...]]] = {
    "vllm-0.9.0": (
        VLLM_0_9_0,
        None,
        (
            stored((-4165155225924735510,), None, TOKENS_A),
            stored((7011983296154425131,), -4165155225924735510, TOKENS_B),
            BlockRemoved((7011983296154425131,)),
            AllBlocksCleared(),
        ),
    ),
    "vllm-dp-rank": (VLLM_DP_RANK, 1, (stored((101, 102), None, TOKENS_A + TOKENS_B), BlockRemoved((102,)))),
    "vllm-medium": (
        VLLM_MEDIUM,
        0,
        (stored((2**64 - 5,), None, TOKENS_A, medium="GPU"), BlockRemoved((2**64 - 5,), "CPU"), AllBlocksCleared()),
    ),
    "vllm-array-bytes": (
        VLLM_ARRAY_BYTES,
        0,
        (
            stored((H1,), None, TOKENS_A, **GPU_FULL),
            stored((H2,), H1, TOKENS_B, medium="GPU", lora_name="adapter", **SLIDING),
            BlockRemoved((H2,), "GPU", 1),
            AllBlocksCleared(),
        ),
    ),
    "vllm-map": (
        VLLM_MAP,
        0,
        (
            stored((BIG,), None, TOKENS_A, **GPU_FULL),
            stored((42,), BIG, TOKENS_B, **GPU_FULL),
            BlockRemoved((42,), "GPU", 0),
            AllBlocksCleared(),
        ),
    ),
    "vllm-map-batch": (VLLM_MAP_BATCH, 2, (stored((H1,), None, TOKENS_A, medium="GPU"), BlockRemoved((H1,), "GPU"))),
    "sglang-first": (
        SGLANG_FIRST,
        None,
        (stored((-7, 9), None, TOKENS_A[:2] + TOKENS_B[:2], block_size=2), BlockRemoved((9,)), AllBlocksCleared()),
    ),
    "sglang-dp": (SGLANG_DP, 3, (stored((11,), 10, TOKENS_B[:2], block_size=2), BlockRemoved((11,)))),
    "sglang-new": (
        SGLANG_NEW,
        0,
        (
            stored((21,), None, TOKENS_A[:2], block_size=2),
            stored((22,), 21, TOKENS_B[:2], block_size=2, medium="CPU_PINNED"),
            BlockRemoved((22,), "GPU"),
            AllBlocksCleared(),
        ),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_release_form_decodes(name: str) -> None:
    payload, rank, events = CASES[name]
    assert decode_batch(payload) == DecodedBatch(EventBatch(TS, events, rank), 0)


@pytest.mark.parametrize(
    ("payload", "form", "events"),
    [
        (
            VLLM_ARRAY_PLAIN,
            "array",
            (stored((H1, H2), None, TOKENS_A + TOKENS_B, medium="GPU"), BlockRemoved((H2,), "GPU")),
        ),
        (
            VLLM_MAP_PLAIN,
            "map",
            (stored((BIG, 42), None, TOKENS_A + TOKENS_B, **GPU_FULL), BlockRemoved((42,), "GPU", 0)),
        ),
    ],
)
def test_encode_writes_the_bytes_vllm_writes(payload: bytes, form: WireForm, events: tuple[KvEvent, ...]) -> None:
    batch = EventBatch(TS, (*events, AllBlocksCleared()), 0)
    assert decode_batch(payload).batch == batch
    assert encode_batch(batch, form) == payload


hashes = st.one_of(st.integers(-(2**63), 2**64 - 1), st.binary(min_size=1, max_size=32))
small = st.none() | st.integers(0, 2**31)
text = st.none() | st.text(max_size=8)
events: st.SearchStrategy[KvEvent] = st.one_of(
    st.builds(
        BlockStored,
        st.lists(hashes, max_size=4).map(tuple),
        st.none() | hashes,
        st.lists(st.integers(0, 2**32 - 1), max_size=40).map(tuple),
        st.integers(1, 64),
        small,
        text,
        text,
        small,
        text,
        small,
    ),
    st.builds(BlockRemoved, st.lists(hashes, max_size=4).map(tuple), text, small),
    st.just(AllBlocksCleared()),
)


@settings(max_examples=200, deadline=None)
@given(
    st.builds(EventBatch, st.floats(allow_nan=False), st.lists(events, max_size=5).map(tuple), small),
    st.sampled_from(["map", "array"]),
)
def test_round_trip(batch: EventBatch, form: WireForm) -> None:
    assert decode_batch(encode_batch(batch, form)) == DecodedBatch(batch, 0)


def pack(value: object) -> bytes:
    return msgspec.msgpack.encode(value)


STORE = ["BlockStored", [1], None, [5, 6], 2, None, "GPU"]
GARBAGE = {
    "empty": b"",
    "reserved byte": b"\xc1",
    "trailing bytes": VLLM_MEDIUM + b"\x00",
    "nesting": b"\x91" * 100_000,
    "huge length": b"\xdd\xff\xff\xff\xff",
    "an int": pack(5),
    "a string": pack("EventBatch"),
    "timestamp not a number": pack(["now", []]),
    "timestamp a bool": pack([True, []]),
    "events not an array": pack([1.0, {}]),
    "no events": pack({"ts": 1.0}),
    "event an int": pack([1.0, [5]]),
    "array event without a name": pack([1.0, [[7, [1]]]]),
    "empty array event": pack([1.0, [[]]]),
    "store missing fields": pack([1.0, [["BlockStored", [1], None]]]),
    "removal without hashes": pack([1.0, [["BlockRemoved"]]]),
    "hash a string": pack([1.0, [["BlockStored", ["ab"], None, [], 16]]]),
    "hash a bool": pack([1.0, [["BlockRemoved", [True]]]]),
    "hashes not an array": pack([1.0, [{"type": "BlockRemoved", "block_hashes": 3}]]),
    "parent a float": pack([1.0, [["BlockStored", [1], 2.5, [], 16]]]),
    "token a bool": pack([1.0, [["BlockStored", [1], None, [True], 16]]]),
    "block size zero": pack([1.0, [["BlockStored", [1], None, [], 0]]]),
    "map store missing block_size": pack([1.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": []}]]),
    "an ext type": b"\x92\xcb" + bytes(8) + b"\x91\xd4\x05\x00",
}


@pytest.mark.parametrize("name", list(GARBAGE))
def test_garbage_is_a_decode_error(name: str) -> None:
    with pytest.raises(KvDecodeError):
        decode_batch(GARBAGE[name])


@pytest.mark.parametrize("name", ["vllm-0.9.0", "vllm-map", "sglang-new"])
def test_every_truncation_is_a_decode_error(name: str) -> None:
    payload = CASES[name][0]
    for end in range(len(payload)):
        with pytest.raises(KvDecodeError):
            decode_batch(payload[:end])


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A recorded payload with one byte changed."""
    payload = draw(st.sampled_from([case[0] for case in CASES.values()]))
    at = draw(st.integers(0, len(payload) - 1))
    return payload[:at] + bytes([draw(st.integers(0, 255))]) + payload[at + 1 :]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64) | mutated())
def test_only_decode_errors_escape(payload: bytes) -> None:
    with contextlib.suppress(KvDecodeError):
        decode_batch(payload)


def test_unknown_types_are_skipped_and_counted() -> None:
    payload = pack(
        [
            1.0,
            [
                ["BlockTransferred", [1], "CPU", "DISK"],
                STORE,
                {"type": "FutureEvent", "detail": "x"},
                {"block_hashes": [1]},  # a map with no type at all
                ["BlockRemoved", [1]],
            ],
        ]
    )
    decoded = decode_batch(payload)
    assert decoded.batch.events == (stored((1,), None, (5, 6), block_size=2, medium="GPU"), BlockRemoved((1,)))
    assert decoded.unknown == 3
    assert decoded.unknown_tags == ("BlockTransferred", "FutureEvent", "<untagged>")


def test_extra_fields_are_ignored() -> None:
    longer = [*STORE, None, [None], 0, "full_attention", None, "LOCAL", "owner", "session", {"future": 1}]
    mapped = {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU", "remaining_copy_counts": [0], "z": {}}
    decoded = decode_batch(pack([1.0, [longer, mapped], 4, "a future batch field"]))
    assert decoded.batch == EventBatch(
        1.0,
        (
            stored((1,), None, (5, 6), block_size=2, medium="GPU", group_idx=0, kv_cache_spec_kind="full_attention"),
            BlockRemoved((1,), "GPU"),
        ),
        4,
    )
    as_map = decode_batch(pack({"ts": 2, "events": [], "attn_dp_rank": 1, "epoch": "e"}))
    assert as_map == DecodedBatch(EventBatch(2.0, (), 1))


def test_tag_spellings() -> None:
    """Another tag field name (msgspec's ``tag_field=``) or a snake-cased tag still reads."""
    events = [{"kind": "BlockRemoved", "block_hashes": [1]}, ["block_removed", [2]], {"type": "all_blocks_cleared"}]
    assert decode_batch(pack([1.0, events])).batch.events == (
        BlockRemoved((1,)),
        BlockRemoved((2,)),
        AllBlocksCleared(),
    )


def test_optional_fields_of_another_type_read_as_none() -> None:
    """SGLang puts its metadata map where vLLM has ``lora_name``; a rank or medium of a strange
    type is not worth losing the batch over."""
    decoded = decode_batch(pack([1.0, [["BlockStored", [1], None, [], 16, "x", 7, {"cache_salt": "t"}]], "r"]))
    assert decoded.batch == EventBatch(1.0, (stored((1,), None, ()),), None)
