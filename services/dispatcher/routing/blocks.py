"""Our hashes of a prompt's token blocks, chained: block i's hash names the whole prefix up to its
end, so two prompts share block i's hash only when they share their first ``(i + 1) * block_size``
tokens. Only FULL blocks are hashed (an engine caches only full blocks).

The hash of a block is the first 8 bytes of BLAKE2b over ``previous hash (8 bytes) || the block's
token ids (uint32, little-endian)``, the previous hash of block 0 being a seed made from the block
size (so chains of different block sizes never meet), read as an unsigned 64-bit int. It is the
same in every process, run, platform and Python (unlike ``hash()`` of bytes, which is salted, or
of tuples, an implementation detail), and a block can be hashed from its parent's hash alone,
which is how the index places an engine's ``BlockStored`` events.

Speed (bench/bench_routing.py): one BLAKE2b per block through a copied template (no keyword
parsing per call) was the fastest of the variants tried: a fresh ``blake2b(prev + block,
digest_size=8)``, one running object updated per block with ``.copy().digest()`` (which could
not hash from a parent's hash either), and MD5. CPython's tuple hash of the ints is nearly twice
as fast but is not a stable format."""

from __future__ import annotations

import base64
import hashlib
import sys
from array import array
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from services.common.kv_events import BlockHash

SCHEME = "chorus-prefix-v1"  # changes whenever the hash does (snapshots carry it)

_TEMPLATE = hashlib.blake2b(digest_size=8)
_BIG_ENDIAN = sys.byteorder == "big"
_SEEDS: dict[int, bytes] = {}

if array("I").itemsize != 4 or array("Q").itemsize != 8:  # pragma: no cover (no such platform in use)
    raise ImportError("routing.blocks needs 4-byte array('I') and 8-byte array('Q')")


def seed(block_size: int) -> bytes:
    """The 8 bytes standing for the parent of a chain's first block."""
    s = _SEEDS.get(block_size)
    if s is None:
        if block_size < 1:
            raise ValueError(f"block_size must be positive, not {block_size}")
        s = _SEEDS[block_size] = hashlib.blake2b(f"{SCHEME}/{block_size}".encode(), digest_size=8).digest()
    return s


def token_bytes(token_ids: Sequence[int]) -> bytes:
    """Token ids as uint32 little-endian bytes (ids are below 2**32)."""
    if isinstance(token_ids, list):
        a = array("I")
        a.fromlist(token_ids)  # a third faster than array("I", a_list)
    else:
        a = array("I", token_ids)
    if _BIG_ENDIAN:  # pragma: no cover
        a.byteswap()
    return a.tobytes()


def extend(parent: bytes, data: bytes, count: int, block_size: int) -> list[int]:
    """The hashes of the first ``count`` blocks of ``data`` (from ``token_bytes``) chained after
    ``parent`` (``seed(block_size)`` or ``hash_bytes`` of the parent block's hash)."""
    width = 4 * block_size
    copy = _TEMPLATE.copy
    digests: list[bytes] = []
    append = digests.append
    prev = parent
    for start in range(0, count * width, width):
        h = copy()
        h.update(prev)
        h.update(data[start : start + width])
        prev = h.digest()
        append(prev)
    out = array("Q", b"".join(digests))
    if _BIG_ENDIAN:  # pragma: no cover
        out.byteswap()
    return out.tolist()


def hash_bytes(block_hash: int) -> bytes:
    """A block's hash as the 8 bytes its children are hashed after."""
    return block_hash.to_bytes(8, "little")


def chain_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """One chained 64-bit hash per full block of ``token_ids`` (a trailing partial block has none)."""
    parent = seed(block_size)  # validates block_size
    count = len(token_ids) // block_size
    return extend(parent, token_bytes(token_ids), count, block_size) if count else []


class RecentChains:
    """The chains of the last ``size`` prompts hashed, so that a prompt that starts with one of
    them whole (a conversation's next turn: the previous prompt, then the answer and what
    followed) hashes only its new blocks. A memcmp per remembered prompt, stopping at the first
    byte that differs, against a BLAKE2b per block."""

    def __init__(self, size: int = 16) -> None:
        # (block size, full blocks' bytes, chain), the oldest dropped past ``size``
        self._recent: deque[tuple[int, bytes, list[int]]] = deque(maxlen=size)

    def hashes(self, token_ids: Sequence[int], block_size: int) -> list[int]:
        parent = seed(block_size)
        count = len(token_ids) // block_size
        if not count:
            return []
        data = token_bytes(token_ids)[: count * 4 * block_size]
        known: list[int] = []
        for size, prefix, chain in reversed(self._recent):
            if size == block_size and len(chain) > len(known) and data.startswith(prefix):
                known = chain
                if len(chain) == count:
                    break
        if known:
            parent = hash_bytes(known[-1])
        rest = data[len(known) * 4 * block_size :]
        chain = known + extend(parent, rest, count - len(known), block_size) if count > len(known) else known
        self._recent.append((block_size, data, chain))
        return chain


# -- snapshots: hashes as compact text (JSON and msgpack take str) --


def pack_ints(typecode: str, values: list[int]) -> str:
    """Ints as base64 of a little-endian array (``typecode`` "Q": uint64, "H": uint16, ...)."""
    a = array(typecode, values)
    if _BIG_ENDIAN:  # pragma: no cover
        a.byteswap()
    return base64.b64encode(a.tobytes()).decode("ascii")


def unpack_ints(typecode: str, text: str) -> list[int]:
    a = array(typecode)
    a.frombytes(base64.b64decode(text, validate=True))
    if _BIG_ENDIAN:  # pragma: no cover
        a.byteswap()
    return a.tolist()


def pack_keys(keys: list[BlockHash]) -> dict[str, Any]:
    """Engine block hashes: packed when all are 64-bit ints (unsigned or signed), else a list of
    ints and strings ("b" + base64 for bytes, "i" + decimal for a wider int)."""
    for code, name in (("Q", "u64"), ("q", "i64")):
        try:
            return {name: pack_ints(code, keys)}  # type: ignore[arg-type]
        except (TypeError, OverflowError):
            pass
    return {"any": [_tag(k) for k in keys]}


def _tag(key: BlockHash) -> int | str:
    if isinstance(key, bytes):
        return "b" + base64.b64encode(key).decode("ascii")
    return key if -(1 << 63) <= key < 1 << 64 else f"i{key}"


def unpack_keys(packed: Mapping[str, Any]) -> list[BlockHash]:
    if "u64" in packed:
        return list(unpack_ints("Q", packed["u64"]))
    if "i64" in packed:
        return list(unpack_ints("q", packed["i64"]))
    keys: list[BlockHash] = []
    for k in packed["any"]:
        if isinstance(k, int):
            keys.append(k)
        elif k[:1] == "b":
            keys.append(base64.b64decode(k[1:], validate=True))
        elif k[:1] == "i":
            keys.append(int(k[1:]))
        else:
            raise ValueError(f"bad engine block hash {k!r}")
    return keys
