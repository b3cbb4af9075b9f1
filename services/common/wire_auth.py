"""How a ``Wire`` proves who it is in its CONNECT: user and password, a token, an nkey (the
server's INFO ``nonce`` signed with the user's ed25519 seed) or a creds file (a user JWT and the
seed that signs the nonce), as nats-server accepts them.

NATS keys are written as base32 (no padding): a prefix byte naming the kind of key (``U``: user,
``A``: account, ``O``: operator; a seed starts ``S`` then the kind), the 32 key bytes, and a
CRC16 (XMODEM) of them, little-endian. ``cryptography`` does the ed25519 part."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.common.wire_servers import Server

if TYPE_CHECKING:  # imported when a key is used: most connections never load it (7 MB)
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

PREFIX_SEED = 18 << 3  # "S"
PREFIXES = {"operator": 14 << 3, "account": 0, "user": 20 << 3, "server": 13 << 3, "cluster": 2 << 3}
CREDS_BLOCK = re.compile(rb"-{3,}[^\n]*-{3,}\r?\n\s*([\w\-.=]+)\s*\r?\n-{3,}[^\n]*-{3,}")


def crc16(data: bytes) -> int:
    """CRC16/XMODEM (polynomial 0x1021, initial 0), the checksum of NATS keys."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021 if crc & 0x8000 else crc << 1) & 0xFFFF
    return crc


def _b32decode(text: str) -> bytes:
    text = text.strip()
    return base64.b32decode(text + "=" * (-len(text) % 8))


def _encode(raw: bytes) -> str:
    return base64.b32encode(raw + crc16(raw).to_bytes(2, "little")).decode().rstrip("=")


def _checked(text: str) -> bytes:
    """A key's bytes, its checksum verified and cut off."""
    try:
        raw = _b32decode(text)
    except ValueError as exc:
        raise ValueError("not a NATS key: not base32") from exc
    if len(raw) < 4 or crc16(raw[:-2]) != int.from_bytes(raw[-2:], "little"):
        raise ValueError("not a NATS key: bad checksum")
    return raw[:-2]


def decode_seed(seed: str) -> tuple[int, bytes]:
    """The kind (prefix byte) and the 32-byte ed25519 seed of an ``S…`` nkey seed."""
    raw = _checked(seed)
    if len(raw) != 34 or raw[0] & 0xF8 != PREFIX_SEED:
        raise ValueError("not a NATS nkey seed (it starts with S)")
    kind = ((raw[0] & 0x07) << 5) | ((raw[1] & 0xF8) >> 3)
    if kind not in PREFIXES.values():
        raise ValueError("a NATS seed of an unknown kind")
    return kind, raw[2:]


def encode_seed(kind: int, seed: bytes) -> str:
    """An ``S…`` seed from its kind and 32 bytes (the inverse of ``decode_seed``)."""
    return _encode(bytes([PREFIX_SEED | kind >> 5, (kind & 31) << 3]) + seed)


def public_key(kind: int, key: bytes) -> str:
    """The ``U…``/``A…``/``O…`` public key from a kind and 32 public key bytes."""
    return _encode(bytes([kind]) + key)


def decode_public_key(text: str) -> tuple[int, bytes]:
    raw = _checked(text)
    if len(raw) != 33 or raw[0] not in PREFIXES.values():
        raise ValueError("not a NATS public key")
    return raw[0], raw[1:]


@dataclass(frozen=True)
class KeyPair:
    """An nkey: its seed's private key and its public key string."""

    private: Ed25519PrivateKey
    public: str

    @classmethod
    def from_seed(cls, seed: str) -> KeyPair:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        kind, raw = decode_seed(seed)
        private = Ed25519PrivateKey.from_private_bytes(raw)
        return cls(private, public_key(kind, private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)))

    def sign(self, data: bytes) -> str:
        """The signature as nats-server reads it (base64 URL-safe, unpadded)."""
        return base64.urlsafe_b64encode(self.private.sign(data)).decode().rstrip("=")


def read_creds(text: str) -> tuple[str, str]:
    """The user JWT and the seed in a creds file (the blocks between ``-----BEGIN NATS USER
    JWT-----`` and ``-----BEGIN USER NKEY SEED-----`` lines and their ends)."""
    blocks = [m.decode() for m in CREDS_BLOCK.findall(text.encode())]
    if len(blocks) < 2:
        raise ValueError("not a NATS creds file: a user JWT block and a seed block expected")
    jwt, seed = blocks[0], blocks[1]
    if jwt.count(".") != 2:
        raise ValueError("not a NATS creds file: its first block is not a JWT")
    decode_seed(seed)
    return jwt, seed


@dataclass(frozen=True)
class Auth:
    """What a ``Wire`` was given to log in with (the seed and creds files are read at each
    connection, so a rotated file is picked up on the next reconnect)."""

    user: str | None = None
    password: str | None = None
    token: str | None = None
    nkeys_seed: str | Path | None = None  # a file holding an nkey seed
    nkeys_seed_str: str | None = None  # the seed itself
    user_credentials: str | Path | None = None  # a creds file

    def check(self) -> None:
        """Fails now (``ValueError``, ``OSError``) on a seed or creds file that cannot be used."""
        self._signer()

    def _signer(self) -> tuple[KeyPair, str | None] | None:
        """The key pair that signs the nonce, and the JWT that goes with it (creds), if any."""
        if self.user_credentials is not None:
            jwt, seed = read_creds(Path(self.user_credentials).read_text())
            return KeyPair.from_seed(seed), jwt
        if self.nkeys_seed is not None:
            return KeyPair.from_seed(Path(self.nkeys_seed).read_text().strip()), None
        if self.nkeys_seed_str is not None:
            return KeyPair.from_seed(self.nkeys_seed_str.strip()), None
        return None

    def describe(self, server: Server) -> str:
        """How this connection logs in to ``server`` (for a refusal's message; no secrets)."""
        if self.user_credentials is not None:
            return f"creds file {self.user_credentials}"
        if self.nkeys_seed is not None or self.nkeys_seed_str is not None:
            signer = self._signer()
            return f"nkey {signer[0].public}" if signer else "nkey"
        user = server.user or self.user
        if user:
            return f"user {user!r}"
        if server.token or self.token:
            return "a token"
        return "no credentials"

    def connect_fields(self, server: Server, info: dict[str, Any]) -> dict[str, Any]:
        """The CONNECT fields that log in to ``server`` (whose INFO is ``info``); credentials in
        the server's URL come before the options'."""
        fields: dict[str, Any] = {}
        if server.user is not None:
            fields.update(user=server.user, **{"pass": server.password or ""})
        elif self.user:
            fields.update(user=self.user, **{"pass": self.password or ""})
        token = server.token or self.token
        if token:
            fields["auth_token"] = token
        nonce = info.get("nonce")  # a server taking nkeys or JWTs sends one to sign
        signer = self._signer() if nonce else None
        if signer is not None:
            pair, jwt = signer
            fields["sig"] = pair.sign(str(nonce).encode())
            if jwt is not None:
                fields["jwt"] = jwt
            else:
                fields["nkey"] = pair.public
        return fields
