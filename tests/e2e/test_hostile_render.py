"""Hostile input that costs work, end to end (issue 9): a render of 300,000 characters without
a space does not starve anyone else, 100 KB of one word keeps the stack healthy, and an answer
too deep to check against its schema fails as the model's fault, never a 500."""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.e2e.conftest import MODEL, RunningStack

DEEP = '{"a":' * 400 + "{}" + "}" * 400
RECURSIVE = {"type": "object", "properties": {"a": {"$ref": "#"}}}


def test_an_answer_too_deep_to_check_fails_as_the_model_s_fault(stack: RunningStack) -> None:
    """A recursive schema and a model answer nested 400 deep (the simulated engine says what it
    is told): Chat's 502 says the answer did not follow the format, Responses' response failed;
    no 500, no stream cut off, no response stored as completed."""
    told = f"[[sim:raw=<|channel|>final<|message|>{DEEP}<|return|>]]"
    with stack.http() as http:
        chat = http.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": told}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "deep", "schema": RECURSIVE}},
            },
        )
        assert chat.status_code == 502 and "nests too deeply" in chat.json()["error"]["message"], chat.text[:300]
        fmt = {"format": {"type": "json_schema", "name": "deep", "schema": RECURSIVE}}
        whole = http.post("/v1/responses", json={"model": MODEL, "input": told, "text": fmt}).json()
        assert whole["status"] == "failed" and "nests too deeply" in whole["error"]["message"]
        streamed = http.post("/v1/responses", json={"model": MODEL, "input": told, "text": fmt, "stream": True})
        assert streamed.text.rstrip().split("\n")[-2] == "event: response.failed", streamed.text[-300:]


# -- a hostile render does not starve anyone else ------------------------------------------------


SMALL = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _p95(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def _one_word(n: int, seed: int) -> str:
    """``n`` characters with no space: BPE is quadratic in a word, so this is the costly render."""
    rnd = random.Random(seed)
    return f"{rnd.choice('abc')}" * (n - 8) + "".join(rnd.choices("abcdefgh", k=8))  # never cached before


def test_a_hostile_render_does_not_starve_other_requests(stack: RunningStack) -> None:
    """While prompts of 300,000 characters without a space render, small chats sent at the same
    time answer within 2 s of how fast they answer alone, and /health stays 200."""
    seed = random.randrange(2**32)
    bigs = [_one_word(300_000, seed), "".join(random.Random(seed).choices("abcdefghijklmnopqrstuvwxyz", k=300_000))]
    with httpx.Client(base_url=stack.base_url, timeout=60, limits=httpx.Limits(max_connections=8)) as http:

        def small() -> float:
            t0 = time.perf_counter()
            resp = http.post("/v1/chat/completions", json=SMALL)
            assert resp.status_code == 200, resp.text
            return time.perf_counter() - t0

        baseline = _p95([small() for _ in range(20)])
        with ThreadPoolExecutor(4) as pool:
            big = pool.submit(
                lambda: [
                    http.post(
                        "/v1/chat/completions",
                        json={"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4},
                    )
                    for text in bigs
                ]
            )

            def meanwhile() -> list[float]:
                out: list[float] = []
                while not big.done():
                    out.append(small())
                return out

            smalls = [pool.submit(meanwhile) for _ in range(2)]
            health: list[int] = []
            while not big.done():
                health.append(http.get("/health").status_code)
            during = [latency for f in smalls for latency in f.result()]
            answers = big.result()
    assert all(r.status_code < 500 for r in answers), [r.text[:200] for r in answers]
    assert len(during) >= 4, f"only {len(during)} small requests while the big ones rendered"
    assert _p95(during) < baseline + 2.0, f"p95 {_p95(during):.2f}s during, {baseline:.2f}s alone"
    assert health and set(health) == {200}, Counter(health)


def test_100kb_of_one_word_keeps_the_stack_healthy(stack: RunningStack) -> None:
    """A prompt of 100 KB without a space: rendered (and quoted back by the simulated engine)
    without any service missing its health checks."""
    text = _one_word(100_000, random.randrange(2**32))
    with httpx.Client(base_url=stack.base_url, timeout=60) as http, ThreadPoolExecutor(1) as pool:
        answer = pool.submit(
            http.post,
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4},
        )
        health = []
        while not answer.done():
            health.append(http.get("/health").status_code)
        assert answer.result().status_code == 200, answer.result().text[:300]
        health.append(http.get("/health").status_code)
    assert set(health) == {200}, Counter(health)
