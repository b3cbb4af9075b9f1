"""Ordinary text -> o200k token ids in time linear in its length.

BPE tokenizers are quadratic in the length of one pre-token, so a long run without a split
point (300,000 characters of one "word") would take minutes. Production tokenizers split such
runs first; so do we. Text is encoded in pieces cut where o200k's pre-tokenizer always splits
(a word ends at the first character after a letter that cannot continue it; a newline run ends
at the first character that is neither blank nor ``/``): tokens never cross those places, so
the pieces give exactly the tokens of the whole. Only a run with no such place in
``MAX_PIECE`` characters is cut anyway (its tokens may then differ, as in any tokenizer that
bounds its work)."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Iterator

from openai_harmony import HarmonyEncoding

MAX_PIECE = 2048


def _continues_word(ch: str) -> bool:
    """Could ``ch`` belong to the same o200k pre-token as a letter before it?"""
    return ch.isalpha() or ch == "'" or unicodedata.category(ch).startswith("M")


def is_stable_cut(text: str, p: int) -> bool:
    """Does cutting ``text`` before index ``p`` leave every token whole?"""
    before, ch = text[p - 1], text[p]
    if before.isalpha() and not _continues_word(ch):
        return True
    return before in "\r\n" and not ch.isspace() and ch != "/"


def stable_cut(text: str, start: int = 0) -> int:
    """The last index after ``start`` where ``text`` can be cut leaving every token whole,
    whatever follows (0 when there is none)."""
    for p in range(len(text) - 1, start, -1):
        if is_stable_cut(text, p):
            return p
    return 0


def pieces(text: str, max_piece: int = MAX_PIECE) -> Iterator[str]:
    """``text`` in pieces of at most ``max_piece`` characters, cut at stable places."""
    start, n = 0, len(text)
    while n - start > max_piece:
        end = start + max_piece
        cut = next((p for p in range(end, start, -1) if is_stable_cut(text, p)), end)
        yield text[start:cut]
        start = cut
    if start < n:
        yield text[start:]


def encode_text(encoding: HarmonyEncoding, text: str, max_piece: int = MAX_PIECE) -> list[int]:
    """``text`` as ordinary tokens (special-token text stays text), in linear time."""
    if len(text) <= max_piece:
        ids: list[int] = encoding.encode(text, disallowed_special=())
        return ids
    out: list[int] = []
    for piece in pieces(text, max_piece):
        out.extend(encoding.encode(piece, disallowed_special=()))
    return out


TEXT_FIELDS = ("content", "text", "arguments", "output", "summary")


def conversation_chars(items: Iterable[object]) -> int:
    """The characters of text conversation items carry (what their rendering grows with)."""
    size = 0
    for item in items:
        for name in TEXT_FIELDS:
            value = getattr(item, name, None)
            if isinstance(value, str):
                size += len(value)
    return size
