"""Engine adapters against the stand-in engine over HTTP, in each protocol: what the dispatcher
would publish equals the script's output, with finish reasons and usage."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import jsonschema
import pytest

from contracts.errors import ErrorCode
from contracts.messages.generate import GenerateRequest, OutputConstraint, ParseSpec, Route, SamplingParams, TokenBatch
from services.common.harmony import CALL, RETURN, harmony_encoding
from services.dispatcher.batches import BatchWriter, relay
from services.dispatcher.engines import make_adapter
from services.dispatcher.engines.base import EngineAdapter, EngineFailure
from services.dispatcher.engines.http import EngineHttp
from services.dispatcher.engines.sglang import Mode
from services.dispatcher.engines.stream import open_stream
from services.simengine.app import RunningSim, serving
from services.simengine.script import plan
from services.simengine.settings import Settings as SimSettings
from tests.simengine.prompts import LOOKUP, WEATHER, parse_output, user_prompt

ENC = harmony_encoding()


@pytest.fixture(scope="module")
async def sim() -> AsyncIterator[RunningSim]:
    async with serving(SimSettings(protocol="both", tokens_per_chunk=2)) as running:
        yield running


@pytest.fixture(scope="module")
async def sim_incremental() -> AsyncIterator[RunningSim]:
    async with serving(SimSettings(protocol="sglang", sglang_incremental=True, tokens_per_chunk=3)) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[EngineHttp]:
    http = EngineHttp()
    try:
        yield http
    finally:
        await http.close()


def request(prompt: list[int], rid: str, **sampling: object) -> GenerateRequest:
    return GenerateRequest(
        generation_id=rid,
        model="openai/gpt-oss-20b",
        prompt_token_ids=prompt,
        stop_token_ids=[RETURN, CALL],
        parse=ParseSpec(request_id=rid),
        route=Route(gateway="g", parser="p"),
        deadline=2e9,
        sampling=SamplingParams.model_validate(sampling),
    )


async def generate(client: EngineHttp, url: str, adapter: EngineAdapter, req: GenerateRequest) -> list[TokenBatch]:
    batches: list[TokenBatch] = []
    stream = await open_stream(client, url, adapter, req, accept_timeout=5, read_timeout=10)
    try:
        await relay(stream, BatchWriter(lambda batch, urgent: batches.append(batch), req))
    finally:
        stream.close()
    offsets = [sum(len(b.token_ids) for b in batches[:i]) for i in range(len(batches))]
    assert [b.offset for b in batches] == offsets
    assert all(b.generation_id == req.generation_id for b in batches)
    assert [b.done for b in batches] == [False] * (len(batches) - 1) + [True]
    return batches


PROTOCOLS: list[tuple[str, str, Mode]] = [
    ("vllm", "sim", "auto"),
    ("sglang", "sglang", "auto"),
    ("sglang", "sglang", "cumulative"),
    ("sglang-incremental", "sglang", "auto"),
    ("sglang-incremental", "sglang", "incremental"),
]


def _target(name: str, sim: RunningSim, sim_incremental: RunningSim) -> str:
    return sim_incremental.url if name == "sglang-incremental" else sim.url


@pytest.mark.parametrize(("server", "kind", "mode"), PROTOCOLS)
@pytest.mark.parametrize("tools", [False, True])
async def test_token_ids_equal_the_script(
    client: EngineHttp, sim: RunningSim, sim_incremental: RunningSim, server: str, kind: str, mode: Mode, tools: bool
) -> None:
    prompt = user_prompt("What is the weather in Paris?", [WEATHER] if tools else None)
    req = request(prompt, f"a-{server}-{mode}-{tools}")
    batches = await generate(client, _target(server, sim, sim_incremental), make_adapter(kind, sglang_mode=mode), req)
    expected = plan(prompt, ENC).output_ids
    assert [t for b in batches for t in b.token_ids] == expected
    last = batches[-1]
    assert last.finish_reason == "stop" and last.error is None
    assert last.stop_token_id == (CALL if tools else RETURN)
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (len(prompt), len(expected))
    assert len(batches) > 2  # one batch per engine chunk, not one per request


@pytest.mark.parametrize(("server", "kind", "mode"), PROTOCOLS)
async def test_max_tokens_gives_length(
    client: EngineHttp, sim: RunningSim, sim_incremental: RunningSim, server: str, kind: str, mode: Mode
) -> None:
    prompt = user_prompt("Tell me a story")
    batches = await generate(
        client,
        _target(server, sim, sim_incremental),
        make_adapter(kind, sglang_mode=mode),
        request(prompt, f"len-{server}-{mode}", max_tokens=5),
    )
    assert [t for b in batches for t in b.token_ids] == plan(prompt, ENC).output_ids[:5]
    assert batches[-1].finish_reason == "length" and batches[-1].stop_token_id is None
    assert batches[-1].usage is not None and batches[-1].usage.completion_tokens == 5


@pytest.mark.parametrize(("server", "kind"), [("vllm", "vllm"), ("sglang", "sglang"), ("sglang-incremental", "sglang")])
async def test_mid_stream_error_ends_with_an_error_batch(
    client: EngineHttp, sim: RunningSim, sim_incremental: RunningSim, server: str, kind: str
) -> None:
    prompt = user_prompt("break [[sim:error_after=4]]")
    batches = await generate(
        client, _target(server, sim, sim_incremental), make_adapter(kind), request(prompt, f"err-{server}")
    )
    last = batches[-1]
    assert last.finish_reason == "error" and last.error is not None
    assert last.error.code == ErrorCode.ENGINE_ERROR and "simulated engine failure" in last.error.message
    assert [t for b in batches for t in b.token_ids] == plan(prompt, ENC).output_ids[:4]


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_http_errors_before_streaming(client: EngineHttp, sim: RunningSim, kind: str) -> None:
    adapter = make_adapter(kind)
    with pytest.raises(EngineFailure) as failure:
        await open_stream(
            client,
            sim.url,
            adapter,
            request(user_prompt("x [[sim:status=503]]"), "h1"),
            accept_timeout=5,
            read_timeout=10,
        )
    assert failure.value.error.code == ErrorCode.ENGINE_ERROR and not failure.value.retryable
    assert "503" in failure.value.error.message


async def test_context_length_is_the_callers_error(client: EngineHttp, sim: RunningSim) -> None:
    """vLLM refuses prompt + max_tokens beyond the context with a 400; SGLang streams its
    refusal (HTTP 200, one error event): the generation ends with the caller's error."""
    with pytest.raises(EngineFailure) as failure:
        await open_stream(
            client,
            sim.url,
            make_adapter("vllm"),
            request(user_prompt("hi"), "h2", max_tokens=10**6),
            accept_timeout=5,
            read_timeout=10,
        )
    assert failure.value.error.code == ErrorCode.CONTEXT_LENGTH_EXCEEDED
    assert "maximum context length" in failure.value.error.message
    (batch,) = await generate(
        client, sim.url, make_adapter("sglang"), request(user_prompt("hi"), "h3", max_tokens=10**6)
    )
    assert batch.finish_reason == "error" and batch.error is not None and not batch.token_ids
    assert batch.error.code == ErrorCode.CONTEXT_LENGTH_EXCEEDED and not batch.error.retryable
    assert batch.error.message.startswith("Requested token count exceeds the model's maximum context length")


@pytest.fixture(scope="module")
async def small_sim() -> AsyncIterator[RunningSim]:
    async with serving(SimSettings(protocol="both", max_model_len=2048)) as running:
        yield running


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_no_client_limit_gets_the_room_left(client: EngineHttp, small_sim: RunningSim, kind: str) -> None:
    """Without max_tokens the engine generates up to the context: vLLM's null, SGLang's null
    (sending 131072 made SGLang refuse every request: input + max_new_tokens >= context_len)."""
    prompt = user_prompt("a long one [[sim:tokens=5000]]")
    batches = await generate(client, small_sim.url, make_adapter(kind), request(prompt, f"room-{kind}"))
    last = batches[-1]
    assert last.error is None and last.finish_reason == "length"
    got = sum(len(b.token_ids) for b in batches)
    assert got == (2048 - len(prompt) if kind == "vllm" else 2048 - 1 - len(prompt) - 1)
    if kind == "sglang":  # the number it used to send
        (old,) = await generate(
            client, small_sim.url, make_adapter(kind, sglang_default_max_tokens=131072), request(prompt, "room-old")
        )
        assert old.error is not None and old.error.code == ErrorCode.CONTEXT_LENGTH_EXCEEDED


SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "score": {"type": "number"}},
    "required": ["answer", "score"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(("server", "kind", "mode"), PROTOCOLS)
async def test_constraints_reach_the_engine(
    client: EngineHttp, sim: RunningSim, sim_incremental: RunningSim, server: str, kind: str, mode: Mode
) -> None:
    """A final schema comes back as conforming JSON in the final channel; a required call goes
    to the allowed tool (the simulated engines check the tag as xgrammar does, then obey it)."""
    target = _target(server, sim, sim_incremental)
    adapter = make_adapter(kind, sglang_mode=mode)
    final = request(user_prompt("Rate this"), f"fs-{server}-{mode}", constraint=OutputConstraint(final_schema=SCHEMA))
    batches = await generate(client, target, adapter, final)
    messages = parse_output([t for b in batches for t in b.token_ids])
    assert messages[-1]["channel"] == "final" and batches[-1].stop_token_id == RETURN
    answer = json.loads(messages[-1]["content"][0]["text"])
    jsonschema.validate(answer, SCHEMA)
    call = request(
        user_prompt("Weather in Paris?", [WEATHER, LOOKUP]),
        f"tc-{server}-{mode}",
        constraint=OutputConstraint(tools=["lookup"]),
    )
    batches = await generate(client, target, adapter, call)
    messages = parse_output([t for b in batches for t in b.token_ids])
    assert messages[-1]["recipient"] == "functions.lookup" and batches[-1].stop_token_id == CALL


async def test_unreachable_engine_is_retryable(client: EngineHttp) -> None:
    from services.common.infra import free_port

    with pytest.raises(EngineFailure) as failure:
        await open_stream(
            client,
            f"http://127.0.0.1:{free_port()}",
            make_adapter("vllm"),
            request(user_prompt("hi"), "u1"),
            accept_timeout=5,
            read_timeout=10,
        )
    assert failure.value.retryable and failure.value.error.code == ErrorCode.ENGINE_UNAVAILABLE


async def test_usage_reports_cached_tokens(client: EngineHttp, sim: RunningSim) -> None:
    prompt = user_prompt("the same long prompt " * 30)
    for kind in ("vllm", "sglang"):
        batches = await generate(client, sim.url, make_adapter(kind), request(prompt, f"c-{kind}"))
        assert batches[-1].usage is not None
    usage = batches[-1].usage
    assert usage is not None and usage.cached_tokens and usage.cached_tokens >= len(prompt) - 16
