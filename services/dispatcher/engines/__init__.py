"""Engine adapters: one per HTTP protocol (vLLM, SGLang); the stand-in engine speaks vLLM's."""

from __future__ import annotations

from services.dispatcher.engines.base import EngineAdapter
from services.dispatcher.engines.openai_text import OpenAITextAdapter
from services.dispatcher.engines.sglang import Mode, SglangAdapter
from services.dispatcher.engines.vllm import VllmAdapter


def make_adapter(
    kind: str, *, sglang_mode: Mode = "auto", sglang_default_max_tokens: int | None = None
) -> EngineAdapter:
    """The adapter for a worker KIND (``vllm``, ``sglang`` or ``sim``). SGLang requests without
    a client limit ask for ``sglang_default_max_tokens`` new tokens; ``None`` or 0: null, the
    room left in the context."""
    if kind in ("vllm", "sim"):
        return VllmAdapter()
    if kind in ("openai", "openai-chat"):
        return OpenAITextAdapter(chat=kind == "openai-chat")
    if kind == "sglang":
        return SglangAdapter(sglang_mode, sglang_default_max_tokens or None)
    raise ValueError(f"unknown engine kind {kind!r}")
