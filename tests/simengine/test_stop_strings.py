"""Stop strings, as vLLM and SGLang apply them: matched in the output's text as it is
detokenized (special tokens skipped); the generation ends with the token that completes the
first match, which stays in the ids (the engines trim only their text), and the engine says
which string matched (vLLM: ``stop_reason``; SGLang: ``finish_reason.matched``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from services.common.harmony import CALL, RETURN, harmony_encoding
from services.simengine.app import serving
from services.simengine.settings import Settings
from tests.simengine.prompts import user_prompt

ENC = harmony_encoding()
RAW = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>one two END three<|return|>"
PROMPT = user_prompt(f"[[sim:raw={RAW}]]")
OUTPUT: list[int] = list(ENC.encode(RAW, allowed_special="all"))


def through(text: str) -> list[int]:
    """The output's ids up to and including the token that completes ``text``."""
    for i in range(1, len(OUTPUT) + 1):
        if text in ENC.decode([t for t in OUTPUT[:i] if t < 199998]):
            return OUTPUT[:i]
    raise AssertionError(f"{text!r} is not in the output")


@pytest.fixture(scope="module")
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with serving(Settings(protocol="both")) as sim, httpx.AsyncClient(base_url=sim.url, timeout=10) as client:
        yield client


async def vllm(http: httpx.AsyncClient, rid: str, **kw: Any) -> tuple[list[int], dict[str, Any]]:
    body = {"prompt": PROMPT, "max_tokens": None, "stream": True, "return_token_ids": True, "request_id": rid}
    async with http.stream("POST", "/v1/completions", json={**body, "stop_token_ids": [RETURN, CALL], **kw}) as resp:
        assert resp.status_code == 200, await resp.aread()
        chunks = [json.loads(line[6:]) for line in [x async for x in resp.aiter_lines()] if line[6:7] == "{"]
    choices = [c["choices"][0] for c in chunks if c.get("choices")]
    return [t for c in choices for t in c["token_ids"]], choices[-1]


async def test_vllm_stops_on_the_first_string_matched_and_says_which(http: httpx.AsyncClient) -> None:
    ids, last = await vllm(http, "v1", stop=["three", "END"])
    assert ids == through("END") and ids != OUTPUT
    assert (last["finish_reason"], last["stop_reason"]) == ("stop", "END")


async def test_a_string_in_the_reasoning_stops_there_too(http: httpx.AsyncClient) -> None:
    ids, last = await vllm(http, "v2", stop="Think")
    assert ids == through("Think") and last["stop_reason"] == "Think"


async def test_special_tokens_are_text_when_asked_for(http: httpx.AsyncClient) -> None:
    """Chorus asks for special tokens written out (``skip_special_tokens: false``): a stop
    string can then match one, as in vLLM's detokenized text."""
    ids, last = await vllm(http, "v5", stop=["<|message|>one"], skip_special_tokens=False)
    assert last["stop_reason"] == "<|message|>one" and ids == OUTPUT[: OUTPUT.index(ENC.encode("one")[0]) + 1]
    skipped, last = await vllm(http, "v6", stop=["<|message|>one"])
    assert skipped == OUTPUT and last["stop_reason"] is None


async def test_a_string_never_written_changes_nothing(http: httpx.AsyncClient) -> None:
    ids, last = await vllm(http, "v3", stop=["four"])
    assert ids == OUTPUT and last["stop_reason"] is None  # <|return|> is EOS: vLLM says null


async def test_max_tokens_before_the_string_wins(http: httpx.AsyncClient) -> None:
    cut = len(through("END")) - 1
    ids, last = await vllm(http, "v4", stop=["END"], max_tokens=cut)
    assert ids == OUTPUT[:cut] and last["finish_reason"] == "length" and last["stop_reason"] is None


async def test_vllm_refuses_an_empty_stop_string(http: httpx.AsyncClient) -> None:
    resp = await http.post("/v1/completions", json={"prompt": PROMPT, "stop": ["END", ""]})
    assert resp.status_code == 400 and "stop cannot contain an empty string" in resp.json()["error"]["message"]


async def test_sglang_reports_the_matched_string(http: httpx.AsyncClient) -> None:
    sampling = {"max_new_tokens": 4096, "stop_token_ids": [RETURN, CALL], "stop": ["END"], "no_stop_trim": True}
    whole = (await http.post("/generate", json={"input_ids": PROMPT, "rid": "s1", "sampling_params": sampling})).json()
    assert whole["output_ids"] == through("END")
    assert whole["meta_info"]["finish_reason"] == {"type": "stop", "matched": "END"}
