"""Engine adapters against the stand-in engine over HTTP, in each protocol: what the dispatcher
would publish equals the script's output, with finish reasons and usage."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from contracts.errors import ErrorCode
from contracts.messages.generate import GenerateRequest, SamplingParams, TokenBatch
from services.common.harmony import CALL, RETURN, harmony_encoding
from services.dispatcher.batches import BatchWriter, relay
from services.dispatcher.engines import make_adapter
from services.dispatcher.engines.base import EngineAdapter, EngineFailure
from services.dispatcher.engines.stream import open_stream
from services.simengine.app import RunningSim, serving
from services.simengine.script import plan
from services.simengine.settings import Settings as SimSettings
from tests.simengine.prompts import WEATHER, user_prompt

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
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(10, connect=2)) as c:
        yield c


def request(prompt: list[int], rid: str, **sampling: object) -> GenerateRequest:
    return GenerateRequest(
        request_id=rid, model="openai/gpt-oss-20b", prompt_token_ids=prompt,
        stop_token_ids=[RETURN, CALL], token_subject="unused",
        sampling=SamplingParams(**sampling),  # type: ignore[arg-type]
    )


async def generate(client: httpx.AsyncClient, url: str, adapter: EngineAdapter,
                   req: GenerateRequest) -> list[TokenBatch]:
    batches: list[TokenBatch] = []

    async def publish(subject: str, data: bytes, headers: dict[str, str]) -> None:
        assert headers["Chorus-Request-Id"] == req.request_id
        batches.append(TokenBatch.model_validate_json(data))

    stream = await open_stream(client, url, adapter, req, accept_timeout=5)
    try:
        await relay(stream, BatchWriter(publish, req))
    finally:
        await stream.aclose()
    assert [b.seq for b in batches] == list(range(len(batches)))
    assert [b.done for b in batches] == [False] * (len(batches) - 1) + [True]
    return batches


PROTOCOLS = [
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
    client: httpx.AsyncClient, sim: RunningSim, sim_incremental: RunningSim,
    server: str, kind: str, mode: str, tools: bool,
) -> None:
    prompt = user_prompt("What is the weather in Paris?", [WEATHER] if tools else None)
    req = request(prompt, f"a-{server}-{mode}-{tools}")
    batches = await generate(client, _target(server, sim, sim_incremental),
                             make_adapter(kind, sglang_mode=mode), req)  # type: ignore[arg-type]
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
    client: httpx.AsyncClient, sim: RunningSim, sim_incremental: RunningSim,
    server: str, kind: str, mode: str,
) -> None:
    prompt = user_prompt("Tell me a story")
    batches = await generate(client, _target(server, sim, sim_incremental),
                             make_adapter(kind, sglang_mode=mode),  # type: ignore[arg-type]
                             request(prompt, f"len-{server}-{mode}", max_tokens=5))
    assert [t for b in batches for t in b.token_ids] == plan(prompt, ENC).output_ids[:5]
    assert batches[-1].finish_reason == "length" and batches[-1].stop_token_id is None
    assert batches[-1].usage is not None and batches[-1].usage.completion_tokens == 5


@pytest.mark.parametrize(("server", "kind"), [("vllm", "vllm"), ("sglang", "sglang"),
                                              ("sglang-incremental", "sglang")])
async def test_mid_stream_error_ends_with_an_error_batch(
    client: httpx.AsyncClient, sim: RunningSim, sim_incremental: RunningSim, server: str, kind: str,
) -> None:
    prompt = user_prompt("break [[sim:error_after=4]]")
    batches = await generate(client, _target(server, sim, sim_incremental), make_adapter(kind),
                             request(prompt, f"err-{server}"))
    last = batches[-1]
    assert last.finish_reason == "error" and last.error is not None
    assert last.error.code == ErrorCode.ENGINE_ERROR and "simulated engine failure" in last.error.message
    assert [t for b in batches for t in b.token_ids] == plan(prompt, ENC).output_ids[:4]


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_http_errors_before_streaming(client: httpx.AsyncClient, sim: RunningSim, kind: str) -> None:
    adapter = make_adapter(kind)
    with pytest.raises(EngineFailure) as failure:
        await open_stream(client, sim.url, adapter, request(user_prompt("x [[sim:status=503]]"), "h1"),
                          accept_timeout=5)
    assert failure.value.error.code == ErrorCode.ENGINE_ERROR and not failure.value.retryable
    assert "503" in failure.value.error.message


async def test_context_length_is_the_callers_error(client: httpx.AsyncClient, sim: RunningSim) -> None:
    """vLLM refuses prompt + max_tokens beyond the context (SGLang clips max_new_tokens)."""
    with pytest.raises(EngineFailure) as failure:
        await open_stream(client, sim.url, make_adapter("vllm"),
                          request(user_prompt("hi"), "h2", max_tokens=10**6), accept_timeout=5)
    assert failure.value.error.code == ErrorCode.CONTEXT_LENGTH_EXCEEDED
    assert "maximum context length" in failure.value.error.message


async def test_unreachable_engine_is_retryable(client: httpx.AsyncClient) -> None:
    from services.common.infra import free_port

    with pytest.raises(EngineFailure) as failure:
        await open_stream(client, f"http://127.0.0.1:{free_port()}", make_adapter("vllm"),
                          request(user_prompt("hi"), "u1"), accept_timeout=5)
    assert failure.value.retryable and failure.value.error.code == ErrorCode.ENGINE_UNAVAILABLE


async def test_usage_reports_cached_tokens(client: httpx.AsyncClient, sim: RunningSim) -> None:
    prompt = user_prompt("the same long prompt " * 30)
    for kind in ("vllm", "sglang"):
        batches = await generate(client, sim.url, make_adapter(kind), request(prompt, f"c-{kind}"))
        assert batches[-1].usage is not None
    assert batches[-1].usage.cached_tokens and batches[-1].usage.cached_tokens >= len(prompt) - 16
