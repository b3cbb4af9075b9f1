"""The simulator over HTTP, in this event loop: vLLM and SGLang wire formats, aborts, errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from services.common.harmony import CALL, RETURN, harmony_encoding
from services.simengine.app import RunningSim, serving
from services.simengine.script import limit, plan
from services.simengine.settings import Settings
from tests.simengine.prompts import WEATHER, user_prompt
from tests.simengine.wire import STOPS, events, sglang_body, vllm_body

ENC = harmony_encoding()


@pytest.fixture(scope="module")
async def sim_incremental() -> AsyncIterator[RunningSim]:
    async with serving(Settings(protocol="sglang", sglang_incremental=True, tokens_per_chunk=3)) as running:
        yield running


async def test_vllm_stream_matches_the_script(http: httpx.AsyncClient) -> None:
    prompt = user_prompt("Say hello")
    chunks = await events(http, "/v1/completions", vllm_body(prompt, "v1"))
    *token_chunks, usage = chunks
    ids = [t for c in token_chunks for t in c["choices"][0]["token_ids"]]
    assert ids == plan(prompt, ENC).output_ids
    assert token_chunks[0]["choices"][0]["prompt_token_ids"] == prompt
    assert all("prompt_token_ids" not in c["choices"][0] for c in token_chunks[1:])
    assert [c["choices"][0]["finish_reason"] for c in token_chunks].count("stop") == 1
    last = token_chunks[-1]["choices"][0]
    assert (last["finish_reason"], last["stop_reason"], last["token_ids"][-1]) == ("stop", None, RETURN)
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(ids)
    assert usage["usage"]["prompt_tokens"] == len(prompt)
    assert "".join(c["choices"][0]["text"] for c in token_chunks) == ENC.decode_utf8(ids)


async def test_vllm_tool_call_reports_call_as_stop_reason(http: httpx.AsyncClient) -> None:
    prompt = user_prompt("Weather in Paris?", [WEATHER])
    chunks = await events(http, "/v1/completions", vllm_body(prompt, "v2"))
    last = chunks[-2]["choices"][0]
    assert (last["finish_reason"], last["stop_reason"], last["token_ids"][-1]) == ("stop", CALL, CALL)


async def test_vllm_max_tokens_and_non_stream(http: httpx.AsyncClient) -> None:
    prompt = user_prompt("Tell me a story")
    resp = await http.post("/v1/completions", json=vllm_body(prompt, "v3", stream=False, max_tokens=5))
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "length" and choice["stop_reason"] is None
    assert choice["token_ids"] == plan(prompt, ENC).output_ids[:5]
    assert resp.json()["usage"]["completion_tokens"] == 5
    # without max_tokens, /v1/completions defaults to 16 like vLLM
    body = vllm_body(prompt, "v3b", stream=False)
    del body["max_tokens"]
    assert len((await http.post("/v1/completions", json=body)).json()["choices"][0]["token_ids"]) == 16


async def test_bad_requests_are_400(http: httpx.AsyncClient) -> None:
    resp = await http.post("/v1/completions", json={"prompt": [1, 10**7], "stream": True})
    assert resp.status_code == 400 and "vocabulary" in resp.json()["error"]["message"]
    resp = await http.post("/v1/completions", json={"stream": True})
    assert resp.status_code == 400
    long = vllm_body(user_prompt("hi"), "v6", max_tokens=10**6)
    resp = await http.post("/v1/completions", json=long)
    assert resp.status_code == 400 and "maximum context length" in resp.json()["error"]["message"]


async def test_vllm_client_disconnect_is_recorded_as_abort(http: httpx.AsyncClient, sim: RunningSim) -> None:
    body = vllm_body(user_prompt("forever [[sim:tokens=5000]] [[sim:delay_ms=5]]"), "v7")
    async with http.stream("POST", "/v1/completions", json=body) as resp:
        async for line in resp.aiter_lines():
            if line.startswith("data: {"):
                break
    record = await sim.recorder.wait_aborted("v7", timeout=5)
    assert record.aborted and not record.finished
    (listed,) = (await http.get("/sim/requests", params={"request_id": "v7"})).json()
    assert listed["aborted"] is True and listed["finished"] is False


async def test_prefix_cache_reports_cached_tokens(http: httpx.AsyncClient) -> None:
    prompt = user_prompt("cache me " * 40)
    first = await events(http, "/v1/completions", vllm_body(prompt, "v8a"))
    again = await events(http, "/v1/completions", vllm_body(prompt, "v8b"))
    assert first[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] < len(prompt) // 2
    assert again[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] >= len(prompt) - 16


async def test_sglang_cumulative_stream(http: httpx.AsyncClient) -> None:
    prompt = user_prompt("Say hello")
    chunks = await events(http, "/generate", sglang_body(prompt, "s1"))
    expected = plan(prompt, ENC).output_ids
    assert chunks[-1]["output_ids"] == expected
    for i, c in enumerate(chunks):  # each chunk repeats everything so far
        assert c["output_ids"] == expected[: i + 1]
        assert c["meta_info"]["completion_tokens"] == i + 1
        assert c["meta_info"]["prompt_tokens"] == len(prompt) and c["meta_info"]["id"] == "s1"
    assert [c["meta_info"]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": RETURN}
    assert chunks[-1]["text"] == ENC.decode_utf8(expected)


async def test_sglang_length_default_and_stop_trim(http: httpx.AsyncClient) -> None:
    prompt = user_prompt("long [[sim:tokens=400]]")
    body = sglang_body(prompt, "s2")
    del body["sampling_params"]["max_new_tokens"]  # SGLang's default: 128
    chunks = await events(http, "/generate", body)
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 128}
    assert len(chunks[-1]["output_ids"]) == 128
    chunks = await events(http, "/generate", sglang_body(user_prompt("hi"), "s3", no_stop_trim=False))
    assert chunks[-1]["output_ids"][-1] != RETURN  # trimmed, yet counted
    assert chunks[-1]["meta_info"]["completion_tokens"] == len(chunks[-1]["output_ids"]) + 1


async def test_sglang_incremental_stream(sim_incremental: RunningSim) -> None:
    prompt = user_prompt("Weather in Paris?", [WEATHER])
    async with httpx.AsyncClient(base_url=sim_incremental.url, timeout=10) as http:
        chunks = await events(http, "/generate", sglang_body(prompt, "i1"))
        assert (await http.post("/v1/completions", json={})).status_code == 404  # sglang only
    ids = [t for c in chunks for t in c["output_ids"]]
    assert ids == plan(prompt, ENC).output_ids
    assert all(len(c["output_ids"]) <= 3 for c in chunks)
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": CALL}
    assert chunks[-1]["meta_info"]["completion_tokens"] == len(ids)


async def test_sglang_abort_request(http: httpx.AsyncClient, sim: RunningSim) -> None:
    body = sglang_body(user_prompt("forever [[sim:tokens=5000]] [[sim:delay_ms=5]]"), "s4")
    async with http.stream("POST", "/generate", json=body) as resp:
        lines = resp.aiter_lines()
        async for line in lines:
            if line.startswith("data: {"):
                break
        assert (await http.post("/abort_request", json={"rid": "s4"})).status_code == 200
        rest = [line async for line in lines if line]
    assert rest[-1] == "data: [DONE]"
    assert json.loads(rest[-2][6:])["meta_info"]["finish_reason"]["type"] == "abort"
    record = await sim.recorder.wait_aborted("s4", timeout=1)
    assert record.abort_requested


async def test_health_models_load(http: httpx.AsyncClient) -> None:
    assert (await http.get("/health")).status_code == 200
    models = (await http.get("/v1/models")).json()["data"]
    assert models[0]["owned_by"] == "chorus-simulator"
    assert (await http.get("/load")).json() == {"server_load": 0}
    assert (await http.get("/get_load")).json()[0]["num_reqs"] == 0


async def test_many_concurrent_streams_at_zero_delay(http: httpx.AsyncClient) -> None:
    prompt = user_prompt("bench [[sim:tokens=500]]")
    expected = limit(plan(prompt, ENC).output_ids, None, STOPS, [RETURN]).token_ids

    async def one(i: int) -> list[int]:
        chunks = await events(http, "/v1/completions", vllm_body(prompt, f"c{i}"))
        return [t for c in chunks[:-1] for t in c["choices"][0]["token_ids"]]

    async with asyncio.timeout(20):
        results = await asyncio.gather(*(one(i) for i in range(64)))
    assert all(r == expected for r in results)


async def test_raw_output_passes_endoftext_through(http: httpx.AsyncClient) -> None:
    raw = "<|channel|>analysis<|message|>Hmm.<|endoftext|><|start|>assistant<|channel|>final<|message|>Done.<|return|>"
    chunks = await events(http, "/v1/completions", vllm_body(user_prompt(f"[[sim:raw={raw}]]"), "raw1"))
    ids = [t for c in chunks[:-1] for t in c["choices"][0]["token_ids"]]
    assert ids == ENC.encode(raw, allowed_special="all")


async def test_sglang_non_stream_and_stop_token_ids(http: httpx.AsyncClient) -> None:
    prompt = user_prompt("Say hello")
    body = {**sglang_body(prompt, "s7"), "stream": False}
    whole = (await http.post("/generate", json=body)).json()
    assert whole["output_ids"] == plan(prompt, ENC).output_ids
    assert whole["meta_info"]["finish_reason"] == {"type": "stop", "matched": RETURN}
    # the first listed stop id emitted ends the generation (here <|message|>, third token)
    body["sampling_params"] = {**body["sampling_params"], "stop_token_ids": [200008]}
    cut = (await http.post("/generate", json={**body, "rid": "s8"})).json()
    assert cut["output_ids"] == plan(prompt, ENC).output_ids[:3]
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": 200008}


# limits, as vLLM and SGLang enforce them -----------------------------------------------------
@pytest.fixture(scope="module")
async def small() -> AsyncIterator[RunningSim]:
    """A 256-token context: the limits are easy to reach."""
    async with serving(Settings(protocol="both", max_model_len=256)) as running:
        yield running


async def test_vllm_max_tokens_limits(small: RunningSim) -> None:
    """Absent: 16; null: the room left; prompt + max_tokens over max_model_len: 400 with
    vLLM's message (and ``param``); a prompt filling the context: 400."""
    prompt = user_prompt("long [[sim:tokens=400]]")
    n = len(prompt)
    async with httpx.AsyncClient(base_url=small.url, timeout=10) as http:
        body = vllm_body(prompt, "vl1", stream=False)
        del body["max_tokens"]
        assert len((await http.post("/v1/completions", json=body)).json()["choices"][0]["token_ids"]) == 16
        room = (await http.post("/v1/completions", json=vllm_body(prompt, "vl2", stream=False))).json()
        assert room["choices"][0]["finish_reason"] == "length"
        assert room["usage"]["completion_tokens"] == 256 - n
        exact = await http.post("/v1/completions", json=vllm_body(prompt, "vl3", stream=False, max_tokens=256 - n))
        assert exact.status_code == 200
        over = await http.post("/v1/completions", json=vllm_body(prompt, "vl4", max_tokens=257 - n))
        assert over.status_code == 400
        error = over.json()["error"]
        assert error["message"] == (
            f"'max_tokens' or 'max_completion_tokens' is too large: {257 - n}. This model's maximum "
            f"context length is 256 tokens and your request has {n} input tokens ({257 - n} > 256 - {n})."
            f" (parameter=max_tokens, value={257 - n})"
        )
        assert (error["param"], error["code"], error["type"]) == ("max_tokens", 400, "BadRequestError")
        full = await http.post("/v1/completions", json=vllm_body(list(range(1000, 1256)), "vl5"))
        assert full.status_code == 400 and full.json()["error"]["message"].startswith(
            "This model's maximum context length is 256 tokens. However, your request has 256 input tokens."
        )
        zero = await http.post("/v1/completions", json=vllm_body(prompt, "vl6", max_tokens=0))
        assert zero.status_code == 400 and "max_tokens must be at least 1, got 0." in zero.json()["error"]["message"]


async def refused_stream(http: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    """SGLang streams a refused request as HTTP 200 and one event before [DONE]."""
    (event,) = await events(http, "/generate", body)
    return event


async def test_sglang_max_new_tokens_limits(small: RunningSim) -> None:
    """TokenizerManager._validate_one_request: max_new_tokens + input >= context_len and
    input >= context_len are refused (streamed: HTTP 200 + an error event; else 400); absent is
    128; null is clipped by the scheduler to the room left."""
    prompt = user_prompt("long [[sim:tokens=400]]")
    n = len(prompt)
    async with httpx.AsyncClient(base_url=small.url, timeout=10) as http:
        at_limit = sglang_body(prompt, "sl1", max_new_tokens=256 - n)
        event = await refused_stream(http, at_limit)
        assert event == {
            "error": {
                "message": (
                    "Requested token count exceeds the model's maximum context length of 256 tokens. You "
                    f"requested a total of 256 tokens: {n} tokens from the input messages and {256 - n} tokens "
                    "for the completion. Please reduce the number of tokens in the input messages or the "
                    "completion to fit within the limit."
                )
            }
        }
        whole = await http.post("/generate", json={**at_limit, "stream": False, "rid": "sl2"})
        assert whole.status_code == 400 and whole.json()["error"]["message"].startswith("Requested token count")
        long = await refused_stream(http, sglang_body(list(range(1000, 1256)), "sl3", max_new_tokens=None))
        assert (
            long["error"]["message"] == "The input (256 tokens) is longer than the model's context length (256 tokens)."
        )
        fits = await events(http, "/generate", sglang_body(prompt, "sl4", max_new_tokens=255 - n))
        assert fits[-1]["meta_info"]["finish_reason"]["type"] == "length"
        null = await events(http, "/generate", sglang_body(prompt, "sl5", max_new_tokens=None))
        assert null[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 254 - n}
        body = sglang_body(prompt, "sl6")
        del body["sampling_params"]["max_new_tokens"]
        assert (await events(http, "/generate", body))[-1]["meta_info"]["completion_tokens"] == 128


# grammars: checked like the engines (obeyed: test_obeying.py) ----------------------------------
async def test_vllm_refuses_bad_structured_outputs(http: httpx.AsyncClient) -> None:
    """StructuredOutputsParams: one kind of constraint, a string structural tag that xgrammar
    compiles (backend_xgrammar.validate_xgrammar_grammar), a JSON schema that is one."""
    prompt = user_prompt("hi")
    cases = [
        ({"json": {"type": "object"}, "regex": "a+"}, "You can only use one kind of structured outputs constraint"),
        ({"disable_any_whitespace": True}, "You must use one kind of structured outputs constraint"),
        (
            {"structural_tag": {"type": "structural_tag"}},
            "structured_outputs.structural_tag: Input should be a valid string",
        ),
        (
            {"structural_tag": '{"type": "structural_tag", "format": {"type": "any_text", "excludes": "x"}}'},
            "Invalid structural tag specification.",
        ),
        ({"structural_tag": "{"}, "Invalid structural tag specification."),
        ({"json": "{not json"}, "Invalid JSON grammar specification."),
        ({"json": {"type": "frob"}}, "Failed to transform json schema into a grammar"),
    ]
    for i, (params, message) in enumerate(cases):
        resp = await http.post("/v1/completions", json=vllm_body(prompt, f"so{i}", structured_outputs=params))
        assert resp.status_code == 400, params
        assert message in resp.json()["error"]["message"], resp.json()


async def test_sglang_aborts_a_grammar_it_cannot_compile(http: httpx.AsyncClient) -> None:
    """The scheduler aborts it (FINISH_ABORT, 400): streamed, one abort chunk; else a 400."""
    bad = '{"type": "structural_tag", "format": {"type": "sequence", "elements": []}}'
    chunk = await refused_stream(http, sglang_body(user_prompt("hi"), "ga1", structural_tag=bad))
    finish = chunk["meta_info"]["finish_reason"]
    assert finish == {
        "type": "abort",
        "status_code": 400,
        "err_type": "BadRequestError",
        "message": f"Invalid grammar request: req.grammar_key=('structural_tag', {bad!r})",
    }
    assert chunk["output_ids"] == [] and chunk["meta_info"]["completion_tokens"] == 0
    whole = await http.post(
        "/generate", json={**sglang_body(user_prompt("hi"), "ga2", structural_tag=bad), "stream": False}
    )
    assert whole.status_code == 400 and whole.json()["error"]["message"].startswith("Invalid grammar request")
    two = await refused_stream(http, sglang_body(user_prompt("hi"), "ga3", regex="a", ebnf="root ::= 'a'"))
    assert two == {"error": {"message": "Only one of regex, json_schema, or ebnf can be set."}}


async def test_penalties_out_of_range_are_refused_as_the_engines_do(http: httpx.AsyncClient) -> None:
    """vLLM and SGLang take presence/frequency penalties in [-2, 2] and refuse the rest."""
    prompt = user_prompt("hi")
    resp = await http.post("/v1/completions", json=vllm_body(prompt, "pen1", presence_penalty=2.5))
    assert resp.status_code == 400 and "presence_penalty must be in [-2, 2]" in resp.json()["error"]["message"]
    event = await refused_stream(http, sglang_body(prompt, "pen2", frequency_penalty=-3))
    assert "frequency_penalty must be in [-2, 2]" in event["error"]["message"]
    ok = await events(http, "/v1/completions", vllm_body(prompt, "pen3", presence_penalty=1.5, frequency_penalty=-2))
    assert ok
