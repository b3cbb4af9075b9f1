"""Engines' KV cache events (vLLM ``vllm/distributed/kv_events.py``, SGLang's copy in
``sglang/srt/disaggregation/kv_events.py``): the typed events, a reader for every wire form the
releases have sent, and a writer for the two forms current vLLM releases send.

The wire: ZMQ multipart ``[topic, seq (8 bytes, big-endian), payload]``; the payload is a msgpack
``EventBatch``. The forms, as msgspec encodes each release's structs:

- ``array`` (vLLM up to vllm-project/vllm#42892, and SGLang): the batch is
  ``[ts, events, data_parallel_rank?]`` and each event ``["BlockStored", block_hashes, ...]``,
  its fields by position. msgspec writes every field of an ``array_like`` struct, defaults
  included (``omit_defaults`` does not apply to arrays), so a release's arrays are as long as its
  struct; older releases' are shorter (vLLM 0.9: no ``medium``; no rank before DP support).
- ``map`` (vLLM after #42892): the batch is still an array, each event a map tagged by its class
  name, ``{"type": "BlockStored", "block_hashes": ..., ...}``, fields left out when they hold
  their default. The reader also takes a batch written as a map.

Block hashes are ints (vLLM before vllm-project/vllm#23673, or with
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``; SGLang: signed or unsigned 64-bit) or bytes (vLLM's
sha256 digests since #23673). The reader keeps them as they came."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

BlockHash = int | bytes
WireForm = Literal["map", "array"]
MEDIUM_GPU = "GPU"
# the replay socket's end-of-replay marker (vLLM ``ZmqEventPublisher.END_SEQ``): seq -1, empty payload
END_SEQ = (-1).to_bytes(8, "big", signed=True)


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks an engine now holds: ``block_hashes`` in chain order, the first one's parent
    ``parent_block_hash`` (None: the chain starts at the root), and the tokens of all of them
    (``len(token_ids) == len(block_hashes) * block_size`` for full blocks). ``group_idx``: the KV
    cache group of a hybrid model (gpt-oss: full and sliding-window attention), None before
    vLLM sent it; ``kv_cache_spec_kind`` names that group's kind (``full_attention``, ...)."""

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[BlockHash, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    medium: str | None = None


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: tuple[KvEvent, ...]
    data_parallel_rank: int | None = None


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    """A batch as read: the events this reader knows, and how many it skipped (``unknown``:
    events of a type it does not know, e.g. from a newer engine; ``unknown_tags`` their names)."""

    batch: EventBatch
    unknown: int = 0
    unknown_tags: tuple[str, ...] = ()


class KvDecodeError(ValueError):
    """A payload that is not an event batch: not msgpack, or not the shape of one."""


# -- reading ------------------------------------------------------------------------------------

# keys a map-encoded event may carry its type under: msgspec's default tag field is "type"; a
# publisher may configure another (``tag_field=``)
TAG_FIELDS = ("type", "kind", "event_type", "tag", "event")
_STORED, _REMOVED, _CLEARED = "blockstored", "blockremoved", "allblockscleared"
# positions in an array-encoded event (0 is the tag)
_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
)
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
_REQUIRED_STORED = 4  # block_hashes, parent_block_hash, token_ids, block_size
_DECODER = msgspec.msgpack.Decoder()


def decode_batch(payload: bytes) -> DecodedBatch:
    """The batch in ``payload``, in any form a vLLM or SGLang release sends (see the module's
    docstring). Unknown event types are skipped and counted; unknown fields are ignored; the
    optional fields older releases lack read as None. Raises ``KvDecodeError``, nothing else."""
    try:
        raw = _DECODER.decode(payload)
    except (msgspec.DecodeError, ValueError, TypeError, RecursionError) as exc:
        raise KvDecodeError(f"not msgpack: {exc}") from exc
    if isinstance(raw, list):
        fields = dict(zip(("ts", "events", "data_parallel_rank"), raw, strict=False))
    elif isinstance(raw, dict):
        fields = raw
    else:
        raise KvDecodeError(f"an event batch is an array or a map, not {type(raw).__name__}")
    ts, events = fields.get("ts"), fields.get("events")
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise KvDecodeError(f"batch timestamp {ts!r} is not a number")
    if not isinstance(events, list):
        raise KvDecodeError(f"batch events {type(events).__name__} is not an array")
    rank = _opt_int(fields.get("data_parallel_rank", fields.get("attn_dp_rank")))
    known: list[KvEvent] = []
    unknown: list[str] = []
    for position, item in enumerate(events):
        event = _event(item, position, unknown)
        if event is not None:
            known.append(event)
    return DecodedBatch(EventBatch(float(ts), tuple(known), rank), len(unknown), tuple(dict.fromkeys(unknown)))


def _event(item: object, position: int, unknown: list[str]) -> KvEvent | None:
    if isinstance(item, list):
        if not item or not isinstance(item[0], str):
            raise KvDecodeError(f"event {position}: an array event starts with its type name")
        tag = item[0]
        kind = _normalise(tag)
        names = _STORED_FIELDS if kind == _STORED else _REMOVED_FIELDS if kind == _REMOVED else ()
        if kind == _STORED and len(item) < 1 + _REQUIRED_STORED:
            raise KvDecodeError(f"event {position}: BlockStored with {len(item) - 1} of its 4 fields")
        if kind == _REMOVED and len(item) < 2:
            raise KvDecodeError(f"event {position}: BlockRemoved without its block hashes")
        fields: Mapping[Any, Any] = dict(zip(names, item[1:], strict=False))
    elif isinstance(item, dict):
        found = next((item[k] for k in TAG_FIELDS if isinstance(item.get(k), str)), None)
        if not isinstance(found, str):
            unknown.append("<untagged>")
            return None
        tag, kind, fields = found, _normalise(found), item
    else:
        raise KvDecodeError(f"event {position}: {type(item).__name__} is not an event")
    try:
        if kind == _STORED:
            return _stored(fields)
        if kind == _REMOVED:
            return BlockRemoved(
                _hashes(fields["block_hashes"]), _opt_str(fields.get("medium")), _opt_int(fields.get("group_idx"))
            )
        if kind == _CLEARED:
            return AllBlocksCleared(_opt_str(fields.get("medium")))
    except (KeyError, TypeError, ValueError) as exc:
        raise KvDecodeError(f"event {position} ({tag}): {exc}") from exc
    unknown.append(tag)
    return None


def _stored(fields: Mapping[Any, Any]) -> BlockStored:
    block_size = fields["block_size"]
    tokens = fields["token_ids"]
    if not _is_int(block_size) or block_size <= 0:
        raise ValueError(f"block_size {block_size!r}")
    if not isinstance(tokens, list) or not all(_is_int(t) for t in tokens):
        raise ValueError("token_ids is not an array of ints")
    parent = fields.get("parent_block_hash")
    return BlockStored(
        block_hashes=_hashes(fields["block_hashes"]),
        parent_block_hash=None if parent is None else _hash(parent),
        token_ids=tuple(tokens),
        block_size=block_size,
        lora_id=_opt_int(fields.get("lora_id")),
        medium=_opt_str(fields.get("medium")),
        lora_name=_opt_str(fields.get("lora_name")),  # SGLang's metadata map sits here: ignored
        group_idx=_opt_int(fields.get("group_idx")),
        kv_cache_spec_kind=_opt_str(fields.get("kv_cache_spec_kind")),
        kv_cache_spec_sliding_window=_opt_int(fields.get("kv_cache_spec_sliding_window")),
    )


def _normalise(tag: str) -> str:
    return tag.replace("_", "").lower()


def _hashes(value: object) -> tuple[BlockHash, ...]:
    if not isinstance(value, list):
        raise ValueError("block_hashes is not an array")
    return tuple(_hash(h) for h in value)


def _hash(value: object) -> BlockHash:
    if isinstance(value, bytes) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise ValueError(f"block hash {value!r} is neither an int nor bytes")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _opt_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _opt_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


# -- writing: vLLM's structs, as msgspec encodes them -----------------------------------------


class _Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


def _event_structs(array_like: bool) -> tuple[Any, Any, Any]:
    """BlockStored, BlockRemoved and AllBlocksCleared as vLLM declares them: ``array_like`` as
    on main just before #42892 (every field up to ``kv_cache_spec_sliding_window``), maps after."""
    base = msgspec.defstruct("KVCacheEvent", [], array_like=array_like, omit_defaults=True, gc=False, tag=True)
    hashes, parent = list[int | bytes], int | bytes | None
    stored = msgspec.defstruct(
        "BlockStored",
        [
            ("block_hashes", hashes),
            ("parent_block_hash", parent),
            ("token_ids", list[int]),
            ("block_size", int),
            ("lora_id", int | None),
            ("medium", str | None),
            ("lora_name", str | None),
            ("extra_keys", list[Any] | None, None),
            ("group_idx", int | None, None),
            ("kv_cache_spec_kind", str | None, None),
            ("kv_cache_spec_sliding_window", int | None, None),
        ],
        bases=(base,),
    )
    removed = msgspec.defstruct(
        "BlockRemoved",
        [("block_hashes", hashes), ("medium", str | None), ("group_idx", int | None, None)],
        bases=(base,),
    )
    return stored, removed, msgspec.defstruct("AllBlocksCleared", [], bases=(base,))


_STRUCTS = {"array": _event_structs(True), "map": _event_structs(False)}
_ENCODER = msgspec.msgpack.Encoder()


def encode_batch(batch: EventBatch, form: WireForm = "map") -> bytes:
    """``batch`` as a vLLM release of that ``form`` sends it (the bytes its msgspec encoder
    gives): ``map`` as vLLM does since #42892, ``array`` as just before. ``AllBlocksCleared``
    has no fields on the wire (its ``medium`` is not sent)."""
    stored, removed, cleared = _STRUCTS[form]
    events: list[Any] = []
    for event in batch.events:
        if isinstance(event, BlockStored):
            events.append(
                stored(
                    list(event.block_hashes),
                    event.parent_block_hash,
                    list(event.token_ids),
                    event.block_size,
                    event.lora_id,
                    event.medium,
                    event.lora_name,
                    None,
                    event.group_idx,
                    event.kv_cache_spec_kind,
                    event.kv_cache_spec_sliding_window,
                )
            )
        elif isinstance(event, BlockRemoved):
            events.append(removed(list(event.block_hashes), event.medium, event.group_idx))
        else:
            events.append(cleared())
    return _ENCODER.encode(_Batch(batch.ts, events, batch.data_parallel_rank))
