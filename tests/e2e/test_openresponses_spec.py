"""Every Responses object and streamed event Chorus sends, validated against the Open Responses
OpenAPI document (see openresponses.py): response objects and their streams for each kind of
request, round trips with function call outputs and encrypted reasoning, failed, background
and cancelled responses, timestamps, compaction, error bodies and WebSocket messages.

The requests go over raw HTTP (httpx) and the WebSocket's raw frames, so what is checked is the
exact JSON Chorus writes, not openai-python's parse of it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, cast

import httpx
import pytest
from openai.types.responses import FunctionToolParam

from tests.e2e.conftest import MODEL, RunningStack
from tests.e2e.openresponses import (
    COMPACTED,
    ERROR_PAYLOAD,
    OPENAI_EVENT_NAMES,
    RESPONSE,
    WEBSOCKET_ERROR,
    conforms,
    event_conforms,
    load_document,
    output_types,
    post,
    retrieved,
    sse_events,
    stream,
)

# without ``strict``, as clients send it (openai-python's type requires the key)
WEATHER = cast(
    FunctionToolParam,
    {
        "type": "function",
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
)
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "celsius": {"type": "number"}},
    "required": ["city", "celsius"],
    "additionalProperties": False,
}


def test_the_deliberate_differences_are_still_differences() -> None:
    """Each exception in openresponses.py answers a place where the document disagrees with
    OpenAI; when the document comes round, the exception goes."""
    spec = load_document()
    document = spec["components"]["schemas"]
    union = spec["paths"]["/responses"]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
    streamed = {document[ref["$ref"].rsplit("/", 1)[-1]]["properties"]["type"]["enum"][0] for ref in union["oneOf"]}
    for openai_name, document_name in OPENAI_EVENT_NAMES.items():
        assert openai_name not in streamed
        assert document[document_name]["properties"]["type"]["enum"][0] in streamed
    assert document["JsonSchemaResponseFormat"]["properties"]["schema"] == {"type": "null"}
    assert "schema" in document["JsonSchemaResponseFormat"]["required"]


@pytest.fixture
def http(stack: RunningStack) -> Iterator[httpx.Client]:
    with stack.http() as client:
        yield client


CASES: dict[str, dict[str, Any]] = {
    "plain": {"input": "Say hello to Open Responses"},
    "instructions": {
        "input": "Who are you?",
        "instructions": "Answer in one short sentence.",
        "metadata": {"case": "instructions"},
        "temperature": 0.5,
        "top_p": 0.9,
    },
    "function_tool": {"input": "What is the weather in Paris?", "tools": [WEATHER]},
    "named_tool_choice": {
        "input": "Weather in Rome?",
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "name": "get_weather"},
    },
    "reasoning_encrypted": {
        "input": "Think about this",
        "reasoning": {"effort": "high", "summary": "auto"},
        "include": ["reasoning.encrypted_content"],
        "store": False,
    },
    "json_schema": {
        "input": "Weather in Lima as JSON",
        "text": {"format": {"type": "json_schema", "name": "weather", "schema": ANSWER_SCHEMA, "strict": True}},
    },
    "json_object": {"input": "Answer in JSON please", "text": {"format": {"type": "json_object"}}},
    "incomplete": {"input": "A long story please", "max_output_tokens": 16},
}
EXPECTED_STATUS = {"incomplete": "incomplete"}


@pytest.mark.parametrize("case", CASES)
def test_response_objects_conform(http: httpx.Client, case: str) -> None:
    body = {"model": MODEL, **CASES[case]}
    payload = post(http, body)
    assert payload["status"] == EXPECTED_STATUS.get(case, "completed"), payload
    if case in ("function_tool", "named_tool_choice"):
        assert "function_call" in output_types(payload)
    if case == "reasoning_encrypted":
        (reasoning,) = [i for i in payload["output"] if i["type"] == "reasoning"]
        assert reasoning["encrypted_content"], reasoning
    if case == "json_schema":
        assert payload["text"]["format"]["schema"] == ANSWER_SCHEMA
    if payload["store"]:
        assert retrieved(http, payload["id"]) == payload


@pytest.mark.parametrize("case", CASES)
def test_streamed_events_conform(http: httpx.Client, case: str) -> None:
    events = stream(http, {"model": MODEL, **CASES[case]})
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    final = events[-1]
    assert final["type"] == f"response.{EXPECTED_STATUS.get(case, 'completed')}", kinds
    if final["response"]["store"]:
        assert retrieved(http, final["response"]["id"]) == final["response"]


def test_function_call_output_round_trip_conforms(http: httpx.Client) -> None:
    first = post(http, {"model": MODEL, "input": "What is the weather in Oslo?", "tools": [WEATHER]})
    (call,) = [i for i in first["output"] if i["type"] == "function_call"]
    body = {
        "model": MODEL,
        "previous_response_id": first["id"],
        "tools": [WEATHER],
        "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "Snow, -3 C"}],
    }
    second = post(http, body)
    assert second["previous_response_id"] == first["id"]
    assert "Snow, -3 C" in second["output"][-1]["content"][0]["text"]
    events = stream(http, body)
    assert events[-1]["type"] == "response.completed"


def test_stateless_round_trip_with_encrypted_reasoning_conforms(http: httpx.Client) -> None:
    """store: false, the output sent back as input (encrypted reasoning included)."""
    first = post(
        http,
        {
            "model": MODEL,
            "input": "What is the weather in Bern?",
            "tools": [WEATHER],
            "store": False,
            "include": ["reasoning.encrypted_content"],
        },
    )
    call = next(i for i in first["output"] if i["type"] == "function_call")
    history = [
        {"role": "user", "content": "What is the weather in Bern?"},
        *first["output"],
        {"type": "function_call_output", "call_id": call["call_id"], "output": "Sunny"},
    ]
    second = post(
        http,
        {
            "model": MODEL,
            "input": history,
            "tools": [WEATHER],
            "store": False,
            "include": ["reasoning.encrypted_content"],
        },
    )
    assert second["status"] == "completed"


def test_reasoning_summary_events_conform(http: httpx.Client) -> None:
    events = stream(
        http, {"model": MODEL, "input": "Think it through", "reasoning": {"effort": "low", "summary": "detailed"}}
    )
    kinds = {e["type"] for e in events}
    for needed in (
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
    ):
        assert needed in kinds, needed


def test_function_call_events_conform(http: httpx.Client) -> None:
    events = stream(http, {"model": MODEL, "input": "What is the weather in Kyiv?", "tools": [WEATHER]})
    kinds = [e["type"] for e in events]
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds


def test_failed_response_conforms(http: httpx.Client) -> None:
    """The engine breaks off mid-answer: the stream ends with response.failed, its error typed."""
    events = stream(http, {"model": MODEL, "input": "Break please [[sim:error_after=3]]"})
    final = events[-1]
    assert final["type"] == "response.failed", [e["type"] for e in events]
    assert final["response"]["status"] == "failed" and final["response"]["error"]["code"]
    assert retrieved(http, final["response"]["id"])["status"] == "failed"


def test_background_and_retrieve_conform(http: httpx.Client) -> None:
    """A background response: the queued object, its event log streamed (whole, then resumed
    after a sequence number), the finished object retrieved."""
    queued = post(http, {"model": MODEL, "input": "quick one", "background": True})
    assert queued["status"] in ("queued", "in_progress") and queued["background"] is True
    events = stream(http, {}, path=f"/v1/responses/{queued['id']}?stream=true")
    assert events[-1]["type"] == "response.completed", [e["type"] for e in events]
    resumed = stream(http, {}, path=f"/v1/responses/{queued['id']}?stream=true&starting_after=1")
    assert resumed == [e for e in events if e["sequence_number"] > 1]
    final = retrieved(http, queued["id"])
    assert final["status"] == "completed" and final["background"] is True
    assert final == events[-1]["response"]


def test_cancelled_background_response_conforms(http: httpx.Client) -> None:
    slow = {"model": MODEL, "input": "Take your time [[sim:tokens=4000]] [[sim:delay_ms=5]]", "background": True}
    queued = post(http, slow)
    with http.stream("GET", f"/v1/responses/{queued['id']}?stream=true") as live:
        first = next(sse_events(live))  # the run has started
        event_conforms(first)
    r = http.post(f"/v1/responses/{queued['id']}/cancel")
    assert r.status_code == 200, r.text
    conforms(RESPONSE, r.json(), "the cancelled response")
    assert r.json()["status"] == "cancelled"
    events = stream(http, {}, path=f"/v1/responses/{queued['id']}?stream=true")
    assert events[-1]["type"] == "response.failed" and events[-1]["response"]["status"] == "cancelled"
    assert retrieved(http, queued["id"])["status"] == "cancelled"


def timestamps(payload: dict[str, Any]) -> list[Any]:
    return [payload["created_at"], *([payload["completed_at"]] if payload["completed_at"] is not None else [])]


def test_response_timestamps_are_json_integers(http: httpx.Client) -> None:
    """The document's ``integer`` admits 1700000000.0 (JSON Schema counts it an integer), but
    OpenAI writes integers and typed clients parse them as such."""
    payload = post(http, {"model": MODEL, "input": "What time is it?"})
    for shown in (payload, retrieved(http, payload["id"])):
        assert all(type(t) is int for t in timestamps(shown)), timestamps(shown)


def test_streamed_timestamps_are_json_integers(http: httpx.Client) -> None:
    events = stream(http, {"model": MODEL, "input": "What time is it?"})
    snapshots = [e["response"] for e in events if "response" in e]
    assert all(type(t) is int for s in snapshots for t in timestamps(s)), [timestamps(s) for s in snapshots]


def test_compact_conforms(http: httpx.Client) -> None:
    history = [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Nice to meet you, Ada."},
        {"role": "user", "content": "I like zebras."},
    ]
    r = http.post("/v1/responses/compact", json={"model": MODEL, "input": history})
    assert r.status_code == 200, r.text
    payload = r.json()
    conforms(COMPACTED, payload, "POST /v1/responses/compact")
    assert output_types(payload) == ["message", "message", "compaction"]


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"model": MODEL, "input": "x", "frobnicate": True}, 400),
        ({"model": MODEL, "input": "x", "max_output_tokens": "many"}, 400),
        ({"model": MODEL, "input": "x", "previous_response_id": "resp_nope"}, 404),
    ],
)
def test_error_bodies_conform(http: httpx.Client, body: dict[str, Any], status: int) -> None:
    """The document gives HTTP errors no schema of their own; their ``error`` object is checked
    against its error payload (type, code, message, param), the one its error events carry."""
    r = http.post("/v1/responses", json=body)
    assert r.status_code == status, r.text
    conforms(ERROR_PAYLOAD, r.json()["error"], f"the {status} error body")


def test_websocket_messages_conform(stack: RunningStack) -> None:
    """Over the WebSocket, progress messages are the streaming events; failures are the
    document's WebSocket error envelope."""
    with stack.client().responses.connect() as conn:
        conn.response.create(model=MODEL, input="What is the weather in Oslo?", tools=[WEATHER])
        kinds: list[str] = []
        while not kinds or kinds[-1] not in ("response.completed", "response.failed", "response.incomplete"):
            event = json.loads(conn.recv_bytes())
            event_conforms(event)
            kinds.append(event["type"])
        assert kinds[-1] == "response.completed", kinds
        conn.response.create(model=MODEL, previous_response_id="resp_nope", input="and tomorrow?")
        error = json.loads(conn.recv_bytes())
        conforms(WEBSOCKET_ERROR, error, "the WebSocket error")
