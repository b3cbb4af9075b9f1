"""Sealed content: what Chorus hands a client to bring back later, unreadable and unforgeable
(reasoning as ``encrypted_content``, compaction items, MCP credentials a background job holds).

Authenticated encryption (Fernet: AES-128-CBC + HMAC-SHA256) under a server key. Keys come
from ``CHORUS_SEALING_KEYS`` (comma-separated, the first seals, all open: rotate by putting a
new key first), or one is generated once and kept in Redis for every replica. A blob that was
tampered with, or sealed by another server, does not open: the caller gets a 400."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from services.gateway.errors import invalid

log = logging.getLogger("chorus.gateway.sealing")
PREFIX = "chorus1."  # blobs carry a version, so the scheme can change without misreading


class Sealer:
    def __init__(self, keys: list[bytes]) -> None:
        if not keys:
            raise ValueError("at least one sealing key is needed")
        self._fernet = MultiFernet([Fernet(k) for k in keys])

    @classmethod
    async def from_settings(cls, keys: list[str], shared: Callable[[str, bytes], Awaitable[bytes]]) -> Sealer:
        """The configured keys, else the stack's generated key (made once, shared in Redis)."""
        if keys:
            return cls([k.encode() for k in keys])
        log.info("sealing with the key generated for this stack (set CHORUS_SEALING_KEYS to manage keys)")
        return cls([await shared("sealing-key", Fernet.generate_key())])

    def seal(self, text: str) -> str:
        return PREFIX + self._fernet.encrypt(text.encode()).decode()

    def open(self, blob: str, param: str) -> str:
        """The plaintext of ``blob``; a 400 naming ``param`` for a blob that is not ours."""
        if not blob.startswith(PREFIX):
            raise invalid("This encrypted content was not produced by this server.", param)
        try:
            return self._fernet.decrypt(blob[len(PREFIX) :].encode()).decode()
        except (InvalidToken, UnicodeDecodeError):
            raise invalid(
                "This encrypted content is not valid: it was altered, or sealed with a key this server does not have.",
                param,
            ) from None

    def rotate(self, blob: str) -> str:
        """``blob`` sealed again under the current key."""
        return PREFIX + self._fernet.rotate(blob[len(PREFIX) :].encode()).decode()
