"""The HTTP edge, end to end through `chorus up`: API keys and tenants, limits, hostile bodies
that must be 4xx (never 5xx), connections that stay usable after errors, request ids."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.e2e.conftest import MODEL, RunningStack, start_stack

KEYS = ("sk-alpha-1234567890", "sk-beta-0987654321")


@pytest.fixture(scope="module")
def keyed(nats_url: str, redis_url: str) -> Iterator[RunningStack]:
    stack = start_stack(
        "keyed",
        nats_url,
        redis_url,  # `chorus up --api-key` (CHORUS_API_KEYS works too)
        extra_args=[arg for key in KEYS for arg in ("--api-key", key)],
    )
    yield stack
    stack.stop()


def client(stack: RunningStack, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0, timeout=30)


def test_keys_are_required_and_health_stays_open(keyed: RunningStack) -> None:
    with httpx.Client(base_url=keyed.base_url, timeout=30) as http:
        assert http.get("/health").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEYS[0]}):
            resp = http.get("/v1/models", headers=headers)
            assert resp.status_code == 401, resp.text
            assert resp.json()["error"]["code"] == "invalid_api_key"
            assert KEYS[0] not in resp.text
        assert http.get("/v1/models", headers={"Authorization": f"Bearer {KEYS[1]}"}).status_code == 200
    assert KEYS[0] not in keyed.log("gateway") and KEYS[1] not in keyed.log("gateway")


def test_what_a_key_stores_is_its_own(keyed: RunningStack) -> None:
    alpha, beta = client(keyed, KEYS[0]), client(keyed, KEYS[1])
    resp = alpha.responses.create(model=MODEL, input="Remember the word heron.")
    conv = alpha.conversations.create(items=[{"role": "user", "content": "hi"}])
    assert alpha.responses.retrieve(resp.id).id == resp.id
    with pytest.raises(openai.NotFoundError):
        beta.responses.retrieve(resp.id)
    with pytest.raises(openai.NotFoundError):
        beta.responses.input_items.list(resp.id)
    with pytest.raises(openai.NotFoundError):
        beta.responses.delete(resp.id)
    with pytest.raises(openai.NotFoundError):
        beta.responses.create(model=MODEL, input="Which word?", previous_response_id=resp.id)
    with pytest.raises(openai.NotFoundError):
        beta.conversations.retrieve(conv.id)
    follow = alpha.responses.create(model=MODEL, input="Which word?", previous_response_id=resp.id)
    assert follow.status == "completed"


@pytest.mark.parametrize(
    ("body", "headers", "status"),
    [
        (b"{" * 100 + b"}" * 100, {}, 400),  # nesting
        (b'{"model": "m", "input": "\\ud800"}', {}, 400),  # a lone surrogate
        (b'{"model": "m", "tools": [{"type": [1, 2]}], "input": "x"}', {}, 400),  # unhashable value
        (b'{"model": "m", "input": [{"type": "function_call_output", "call_id": 5, "output": []}]}', {}, 400),
        (b"model=m&input=hi", {"content-type": "application/x-www-form-urlencoded"}, 415),
        (b'{"model": "m", "input": "hi"}', {"content-type": "text/plain"}, 415),
        (b"\xff\xfe", {}, 400),
    ],
)
def test_hostile_bodies_are_client_errors(
    stack: RunningStack, body: bytes, headers: dict[str, str], status: int
) -> None:
    with httpx.Client(base_url=stack.base_url, timeout=30) as http:
        resp = http.post("/v1/responses", content=body, headers={"content-type": "application/json", **headers})
        assert resp.status_code == status, resp.text
        assert resp.json()["error"]["type"] == "invalid_request_error"
        assert "Error" not in resp.json()["error"]["message"]  # no exception class names
        again = http.get("/v1/models")  # the same keep-alive connection still answers
        assert again.status_code == 200


def test_deep_tool_schema_is_a_400(stack: RunningStack) -> None:
    schema: dict[str, object] = {"type": "object"}
    for _ in range(200):
        schema = {"type": "object", "properties": {"x": schema}}
    body = json.dumps(
        {"model": MODEL, "input": "hi", "tools": [{"type": "function", "name": "f", "parameters": schema}]}
    )
    with httpx.Client(base_url=stack.base_url, timeout=30) as http:
        resp = http.post("/v1/responses", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text


def test_bodies_over_the_limit_are_413(stack: RunningStack) -> None:
    big = b'{"model": "m", "input": "' + b"a" * (17 * 1024 * 1024) + b'"}'
    with httpx.Client(base_url=stack.base_url, timeout=60) as http:
        resp = http.post("/v1/chat/completions", content=big, headers={"content-type": "application/json"})
        assert resp.status_code == 413
        assert resp.json()["error"]["code"] == "request_too_large"

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted while reading
            yield b'{"model": "m", "input": "'
            for _ in range(17):
                yield b"a" * (1024 * 1024)
            yield b'"}'

        resp = http.post("/v1/responses", content=chunks(), headers={"content-type": "application/json"})
        assert resp.status_code == 413


def test_request_id_is_accepted_and_echoed(stack: RunningStack) -> None:
    with httpx.Client(base_url=stack.base_url, timeout=30) as http:
        resp = http.post(
            "/v1/chat/completions",
            headers={"x-request-id": "trace-me-42"},
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert resp.headers["x-request-id"] == "trace-me-42"
        assert http.get("/v1/models").headers["x-request-id"]
    assert "request_id=trace-me-42" in stack.log("gateway")


def test_the_simulator_is_labelled_on_the_gateways_answers(stack: RunningStack) -> None:
    """The engines are the simulator (spoken to as vLLM here): the gateway says so on every
    /v1 answer and as the models' owner, not only on the engine's own port."""
    with httpx.Client(base_url=stack.base_url, timeout=30) as http:
        answer = http.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        )
        assert answer.status_code == 200 and answer.headers["x-chorus-simulator"] == "true"
        models = http.get("/v1/models")
        assert models.headers["x-chorus-simulator"] == "true"
        assert {m["owned_by"] for m in models.json()["data"]} == {"chorus-simulator"}
        assert http.get(f"/v1/models/{MODEL}").json()["owned_by"] == "chorus-simulator"
