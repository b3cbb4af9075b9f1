"""Benchmark (not a test): parser throughput per worker (one process, one core), ParseSession
(framing guard, lenient headers, control-text filter, tool-call recovery, typed events) versus
openai-harmony's plain StreamableParser on the same tokens.

    python bench/parser_throughput.py [--rounds N]

(a) plain: ``StreamableParser.process`` per token, reading ``last_content_delta`` (what a
    streaming server without recovery does); (b) ``ParseSession.feed`` on the same tokens in
    engine-like batches of 1, 4 and 16 tokens, then ``finish``. Outputs: a long answer
    (analysis + final, ~20k tokens of varied text: prose, markdown, code with ``<``, CJK, emoji)
    and a tool call (analysis + a ~10k-token JSON argument). Runs are interleaved and the best
    of ``--rounds`` is kept, so a noisy machine hurts both sides alike."""

from __future__ import annotations

import argparse
import functools
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openai_harmony import HarmonyEncoding, Role, StreamableParser

from services.common.harmony import harmony_encoding
from services.parser.session import ParseSession

WORDS = [
    "the",
    "a",
    "weather",
    "city",
    "forecast",
    "considers",
    "temperature",
    "Paris",
    "wind",
    "rain",
    "sunny",
    "check",
    "data",
    "model",
    "parser",
    "token",
    "stream",
    "request",
    "gateway",
    "engine",
    "response",
    "because",
    "however",
    "therefore",
    "result",
    "value",
    "東京",
    "München",
    "café",
    "naïve",
    "👍",
    "🌧️",
]
CODE = [
    "def f(xs: list[int]) -> int:\n    return sum(x for x in xs if x < 10)\n",
    "if (a < b && b > c) { return <T>(x); }\n",
    '<div class="note">Hello</div>\n',
]


def prose(rng: random.Random, n_words: int) -> str:
    out: list[str] = []
    for i in range(n_words):
        out.append(rng.choice(WORDS))
        if i % 17 == 16:
            out.append(
                rng.choice([".", ",", ";", "\n\n- ", "\n\n## Step", "\n```python\n" + rng.choice(CODE) + "```\n"])
            )
    return " ".join(out)


def outputs(enc: HarmonyEncoding) -> dict[str, tuple[list[int], list[str]]]:
    rng = random.Random(7)
    answer = (
        f"<|channel|>analysis<|message|>{prose(rng, 7000)}<|end|>"
        f"<|start|>assistant<|channel|>final<|message|>{prose(rng, 7000)}<|return|>"
    )
    args = json.dumps({"path": "src/app.py", "content": prose(rng, 5500)}, ensure_ascii=False)
    call = (
        f"<|channel|>analysis<|message|>{prose(rng, 2500)}<|end|><|start|>assistant<|channel|>commentary "
        f"to=functions.write_file <|constrain|>json<|message|>{args}<|call|>"
    )
    return {
        "analysis + final": (enc.encode(answer, allowed_special="all"), []),
        "analysis + tool call": (enc.encode(call, allowed_special="all"), ["write_file", "read_file"]),
    }


def plain(enc: HarmonyEncoding, ids: list[int]) -> float:
    t0 = time.perf_counter()
    p = StreamableParser(enc, Role.ASSISTANT, strict=False)
    for t in ids:
        p.process(t)
        p.last_content_delta  # noqa: B018 - reading the delta is part of streaming
    return time.perf_counter() - t0


def session(enc: HarmonyEncoding, ids: list[int], batch: int, tools: list[str]) -> float:
    batches = [ids[i : i + batch] for i in range(0, len(ids), batch)]  # arrive as lists, as from the bus
    t0 = time.perf_counter()
    s = ParseSession(enc, "bench", tools)
    for b in batches:
        s.feed(b)
    s.finish("stop")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    rounds = ap.parse_args().rounds
    enc = harmony_encoding()
    ParseSession(enc, "warm-up", [])  # loads the token byte table once per process
    for name, (ids, tools) in outputs(enc).items():
        runs: dict[str, Callable[[], float]] = {"plain": functools.partial(plain, enc, ids)}
        for batch in (1, 4, 16):
            runs[f"session/{batch}"] = functools.partial(session, enc, ids, batch, tools)
        best = {key: float("inf") for key in runs}
        for _ in range(rounds):
            for key, fn in runs.items():
                best[key] = min(best[key], fn())
        print(f"{name}: {len(ids)} tokens (best of {rounds})")
        print(f"  plain StreamableParser, token by token  {len(ids) / best['plain']:>11,.0f} tokens/s")
        for batch in (1, 4, 16):
            t = best[f"session/{batch}"]
            print(
                f"  ParseSession, {batch:>2} tokens per batch     {len(ids) / t:>11,.0f} tokens/s  "
                f"({(t / best['plain'] - 1) * 100:+.1f}% time vs plain)"
            )


if __name__ == "__main__":
    main()
