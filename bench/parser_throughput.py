"""Benchmark (not a test): parser throughput per worker, ParseSession (framing guard + recovery)
versus openai-harmony's plain StreamableParser, on the same tokens.

    python bench/parser_throughput.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openai_harmony import Role, StreamableParser  # noqa: E402

from services.common.harmony import harmony_encoding  # noqa: E402
from services.parser.session import ParseSession  # noqa: E402


def plain(enc, ids: list[int]) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    p = StreamableParser(enc, Role.ASSISTANT, strict=False)
    for t in ids:
        p.process(t)
        p.last_content_delta  # noqa: B018 - reading the delta is part of streaming
    return time.perf_counter() - t0


def session(enc, ids: list[int], batch: int, tools: list[str]) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    s = ParseSession(enc, "bench", tools)
    for i in range(0, len(ids), batch):
        s.feed(ids[i : i + batch])
    s.finish("stop")
    return time.perf_counter() - t0


def main() -> None:
    enc = harmony_encoding()
    words = "The quick brown fox considers the weather in Paris and decides to check it again. "
    texts = {
        "analysis + final (~20k tokens)": (
            f"<|channel|>analysis<|message|>{words * 600}<|end|>"
            f"<|start|>assistant<|channel|>final<|message|>{words * 600}<|return|>", []),
        "analysis + tool call (~10k tokens)": (
            f"<|channel|>analysis<|message|>{words * 600}<|end|><|start|>assistant<|channel|>commentary "
            f'to=functions.get_weather <|constrain|>json<|message|>{{"city": "Paris", "note": "{words * 10}"}}<|call|>',
            ["get_weather"]),
    }
    for name, (text, tools) in texts.items():
        ids = enc.encode(text, allowed_special="all")
        best_plain = min(plain(enc, ids) for _ in range(5))
        print(f"{name}: {len(ids)} tokens")
        print(f"  plain StreamableParser          {len(ids) / best_plain:>10,.0f} tokens/s")
        for batch in (1, 4, 16):
            best = min(session(enc, ids, batch, tools) for _ in range(5))
            overhead = (best / best_plain - 1) * 100
            print(f"  ParseSession, {batch:>2} tokens/batch    {len(ids) / best:>10,.0f} tokens/s  "
                  f"({overhead:+.1f}% time vs plain)")


if __name__ == "__main__":
    main()
