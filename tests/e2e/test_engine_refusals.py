"""An engine that refuses a request is the caller's 4xx, however the engine says it: vLLM
answers HTTP 400 before streaming, SGLang streams HTTP 200 and then an error event. Here the
engines' context (4,096 tokens) is smaller than the encoder's, so the engine is the one to refuse."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.e2e.conftest import MODEL, RunningStack, start_sim_engine, start_stack

LONG = "the lighthouse keeper logged every ship " * 900  # ~6,300 tokens


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def small_engine_stack(request: pytest.FixtureRequest, nats_url: str, redis_url: str) -> Iterator[RunningStack]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CHORUS_SIM_MAX_MODEL_LEN", "4096")
        sim, url = start_sim_engine(request.param)
    stack = start_stack(f"small-{request.param}", nats_url, redis_url, engines=[f"{request.param}={url}"], extra=[sim])
    yield stack
    stack.stop()


def test_a_refused_prompt_is_a_400_on_both_apis(small_engine_stack: RunningStack) -> None:
    client = small_engine_stack.client()
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": LONG}])
    with pytest.raises(openai.BadRequestError) as responses:
        client.responses.create(model=MODEL, input=LONG)
    for err in (chat.value, responses.value):
        body = err.response.json()["error"]
        assert "context" in body["message"] and "4096" in body["message"], body
        assert "Traceback" not in body["message"]
    if small_engine_stack.name.endswith("vllm"):  # refused before the stream starts: a 400
        with pytest.raises(openai.BadRequestError):
            list(client.responses.create(model=MODEL, input=LONG, stream=True))
    else:  # the stream had started when SGLang refused: it ends with response.failed saying why
        events = list(client.responses.create(model=MODEL, input=LONG, stream=True))
        assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
        assert events[-1].type == "response.failed"
        assert events[-1].response.error is not None and "4096" in events[-1].response.error.message
    # and the stack still answers
    assert client.responses.create(model=MODEL, input="hi").status == "completed"
