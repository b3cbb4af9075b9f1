"""The simulator's scripted failures over HTTP, as each engine reports them: an error mid-stream,
an abort of the engine's own, an HTTP status before streaming."""

from __future__ import annotations

import httpx
import pytest

from services.simengine.app import RunningSim
from tests.simengine.prompts import user_prompt
from tests.simengine.wire import events, sglang_body, vllm_body


async def test_vllm_error_mid_stream(http: httpx.AsyncClient, sim: RunningSim) -> None:
    chunks = await events(http, "/v1/completions", vllm_body(user_prompt("x [[sim:error_after=4]]"), "v4"))
    assert "error" in chunks[-1] and chunks[-1]["error"]["code"] == 500
    assert sum(len(c["choices"][0]["token_ids"]) for c in chunks[:-1]) == 4
    record = sim.recorder.get("v4")
    assert record is not None and record.finish_reason == "error"


async def test_an_engine_abort_ends_the_stream_as_the_engines_do(http: httpx.AsyncClient, sim: RunningSim) -> None:
    """``abort_after``: the tokens so far, then vLLM's finish reason ``abort`` (usage still
    follows) or SGLang's ``{"type": "abort"}``: a request the engine gave up on itself."""
    chunks = await events(http, "/v1/completions", vllm_body(user_prompt("x [[sim:abort_after=3]]"), "va"))
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "abort" and set(finishes[:-1]) <= {None}
    assert sum(len(c["choices"][0]["token_ids"]) for c in chunks if c["choices"]) == 3
    assert chunks[-1]["usage"]["completion_tokens"] == 3
    record = sim.recorder.get("va")
    assert record is not None and record.finish_reason == "abort"
    chunks = await events(http, "/generate", sglang_body(user_prompt("x [[sim:abort_after=2]]"), "sa"))
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(chunks[-1]["output_ids"]) == 2


@pytest.mark.parametrize(("directive", "status"), [("[[sim:status=503]]", 503), ("[[sim:status=429]]", 429)])
async def test_status_directive(http: httpx.AsyncClient, directive: str, status: int) -> None:
    resp = await http.post("/v1/completions", json=vllm_body(user_prompt(f"x {directive}"), "v5"))
    assert resp.status_code == status and resp.json()["error"]["message"]
    resp = await http.post("/generate", json=sglang_body(user_prompt(f"x {directive}"), "s5"))
    assert resp.status_code == status and resp.json()["error"]["message"]


async def test_sglang_error_mid_stream_is_an_abort_finish(http: httpx.AsyncClient) -> None:
    chunks = await events(http, "/generate", sglang_body(user_prompt("x [[sim:error_after=2]]"), "s6"))
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(chunks[-1]["output_ids"]) == 2
