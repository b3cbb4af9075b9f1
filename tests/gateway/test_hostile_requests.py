"""Hostile request shapes the end-to-end fuzz (tests/e2e/test_hostile.py) found, each pinned
here without a stack: a 400 with a reason, never a crash later in the request."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from contracts.messages.encode import ResponseFormat
from services.common.errors import ChorusError
from services.gateway.chat.items import response_format_of
from services.gateway.chat.request import ChatRequest
from services.gateway.context import GatewayContext
from services.gateway.edge import Edge
from services.gateway.responses.request import ResponsesRequest
from services.gateway.responses.response import ResponseBody
from services.gateway.responses.routes import replay
from services.gateway.store import ResponseStore, StoredResponse
from services.gateway.structured import check
from services.gateway.structured.schemas import schema_problem

# -- response formats whose references a validator could not follow --------------------------
# (found: {"$dynamicRef": "#x"} answered 500 on Chat and broke a streamed response's connection;
#  "#/nope", remote and looping references failed only when the answer was checked)

BROKEN = {
    "dynamic ref": {"$dynamicRef": "#x"},
    "recursive ref": {"$recursiveRef": "#"},
    "pointer to nowhere": {"$ref": "#/nope"},
    "nested pointer to nowhere": {"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}},
    "remote": {"$ref": "http://127.0.0.1:1/schema"},
    "relative to an $id": {"$id": "http://127.0.0.1:1/", "$ref": "other"},
    "anchor": {"$ref": "#thing"},
    "nested $id": {"properties": {"a": {"$id": "http://x/y", "$ref": "#/z"}}},
    "into data": {"const": {"type": 5}, "$ref": "#/const"},
    "self": {"$ref": "#"},
    "loop through $defs": {"$defs": {"x": {"$ref": "#/$defs/x"}}, "$ref": "#/$defs/x"},
    "loop through anyOf": {"anyOf": [{"type": "string"}, {"$ref": "#"}]},
    "loop through allOf and not": {"$defs": {"a": {"allOf": [{"not": {"$ref": "#/$defs/a"}}]}}, "$ref": "#/$defs/a"},
    "$schema not a string": {"$schema": []},
}

FINE = {
    "recursion through a property": {"type": "object", "properties": {"next": {"$ref": "#"}}},
    "recursion through items": {"type": "array", "items": {"$ref": "#"}},
    "$defs": {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "$defs": {"a": {"type": "string"}}},
    "draft 7 definitions": {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "properties": {"a": {"$ref": "#/definitions/a"}},
        "definitions": {"a": {"type": "integer"}},
    },
    "a property called enum": {"properties": {"enum": {"type": "string"}, "b": {"$ref": "#/properties/enum"}}},
    "escaped pointer": {
        "$defs": {"a/b": {"type": "string"}, "c~d": {"type": "null"}},
        "anyOf": [{"$ref": "#/$defs/a~1b"}, {"$ref": "#/$defs/c~0d"}],
    },
    "$ref as data": {"enum": [{"$ref": "#/nowhere"}]},
    "root $id": {"$id": "http://example.com/s", "properties": {"a": {"$ref": "#/$defs/a"}}, "$defs": {"a": {}}},
}


@pytest.mark.parametrize("schema", BROKEN.values(), ids=BROKEN.keys())
def test_a_schema_whose_references_cannot_be_followed_is_a_400(schema: dict[str, Any]) -> None:
    assert schema_problem(schema)
    with pytest.raises(ChorusError) as chat:
        response_format_of(
            ChatRequest.model_validate(
                {
                    "model": "m",
                    "messages": [{"role": "user", "content": "hi"}],
                    "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
                }
            )
        )
    assert chat.value.status_code == 400 and chat.value.error.param == "response_format.json_schema.schema"
    with pytest.raises(ChorusError) as responses:  # pydantic re-raises the validator's CallerError as is
        ResponsesRequest.model_validate(
            {"model": "m", "input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}}}
        )
    assert responses.value.status_code == 400 and responses.value.error.param == "text.format.schema"


@pytest.mark.parametrize("schema", FINE.values(), ids=FINE.keys())
def test_references_inside_the_schema_are_fine(schema: dict[str, Any]) -> None:
    assert schema_problem(schema) is None
    check("{}", ResponseFormat(name="x", json_schema=schema))  # the answer's check cannot fail either


REFS = st.sampled_from(
    [
        "#",
        "#/$defs/a",
        "#/$defs/b",
        "#/properties/x",
        "#/nope",
        "#a",
        "other",
        "#/allOf/0",
        "#/enum",
        "#/properties/enum",
        "#/items",
        "http://json-schema.org/draft-04/schema#",
        "https://json-schema.org/draft/2020-12/schema",
        "http://x/y",
    ]
)
KEYWORDS = st.sampled_from(
    [
        "type",
        "properties",
        "items",
        "$ref",
        "$defs",
        "definitions",
        "allOf",
        "anyOf",
        "oneOf",
        "not",
        "if",
        "then",
        "else",
        "required",
        "additionalProperties",
        "enum",
        "const",
        "$dynamicRef",
        "$id",
        "$anchor",
        "$schema",
        "prefixItems",
        "dependentSchemas",
        "id",
        "contains",
        "propertyNames",
        "x",
        "a",
        "enum",
    ]
)


def _schemas(children: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(KEYWORDS, st.one_of(children, REFS, st.lists(children, max_size=3)), max_size=4)


SCHEMAS = _schemas(
    st.recursive(st.booleans() | st.just({}) | st.sampled_from(["string", "object", 1]), _schemas, max_leaves=10)
)
INSTANCES = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 2) | st.sampled_from(["", "x"]),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(["x", "a"]), c, max_size=3),
    max_leaves=8,
)


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(SCHEMAS, st.lists(INSTANCES, max_size=3))
def test_a_schema_the_request_accepts_can_check_any_answer(schema: dict[str, Any], answers: list[Any]) -> None:
    """The promise behind the 400s: what passes at the edge never makes the answer's check raise."""
    if schema_problem(schema) is None:
        for answer in answers:
            check(json.dumps(answer), ResponseFormat(name="x", json_schema=schema))


def test_an_answer_too_deep_to_check_is_a_failed_answer_not_a_crash() -> None:
    """(found: a recursive schema and an answer nested 400 deep raised RecursionError in the
    check: a 500 on Chat, a response stored as completed on Responses)"""
    fmt = ResponseFormat(name="x", json_schema={"type": "object", "properties": {"a": {"$ref": "#"}}})
    assert (
        check('{"a":' * 400 + "{}" + "}" * 400, fmt)
        == "the answer nests too deeply to be checked against the schema 'x'"
    )
    assert check("[" * 100_000 + "]" * 100_000, fmt) == "the answer nests too deeply to be read"
    assert check('{"a":' * 20 + "{}" + "}" * 20, fmt) is None


# -- length limits on the right member of a union ----------------------------------------------
# (found: a Responses ``input`` string over 100,000 characters was refused as "at most 100000
#  items"; a Chat ``stop`` string over 16 characters likewise)


def test_a_long_input_string_is_not_counted_as_items() -> None:
    assert ResponsesRequest.model_validate({"model": "m", "input": "a" * 300_000}).input == "a" * 300_000
    with pytest.raises(ValueError, match="at most 100000 items"):
        ResponsesRequest.model_validate({"model": "m", "input": [{"role": "user", "content": "x"}] * 100_001})


def test_a_stop_string_is_limited_as_a_string() -> None:
    assert ChatRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": "a stop sequence of some length"}
    ).stop_list == ["a stop sequence of some length"]
    with pytest.raises(ValueError, match="at most 16 items"):
        ChatRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": ["s"] * 17})
    # an empty stop string matches nothing and the engine would refuse it: it is not sent
    assert ChatRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": ["", "END"]}
    ).stop_list == ["END"]


@pytest.mark.parametrize(
    "item",
    [
        {"type": "function_call", "call_id": "c", "name": "f", "namespace": "n" * 65},
        {"type": "mcp_call", "id": "m", "server_label": "s" * 65, "name": "t"},
        {"type": "mcp_call", "id": "m", "server_label": "s", "name": "t" * 257},
        {"type": "mcp_approval_request", "id": "m", "server_label": "s" * 65, "name": "t"},
    ],
    ids=["namespace", "mcp label", "mcp name", "approval label"],
)
def test_names_rendered_in_a_message_header_are_bounded(item: dict[str, Any]) -> None:
    """(found with a tool description of 4,100,000 characters: text openai-harmony renders
    itself is encoded in time quadratic in a word; a message header is such text)"""
    with pytest.raises(ValueError, match="at most"):
        ResponsesRequest.model_validate({"model": "m", "input": [item]})


# -- a stream that breaks off is ended, not dropped ----------------------------------------------
# (found: an exception inside a streamed response left the connection without the end of its
#  chunked body: the client saw "incomplete chunked read" and lost the keep-alive connection)


async def _run_edge(app: ASGIApp) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {"type": "http", "method": "POST", "path": "/v1/responses", "headers": []}
    await Edge(app, api_keys=[], max_body_bytes=1024)(scope, receive, send)
    return sent


async def test_a_stream_that_fails_midway_ends_with_an_error_event() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream; charset=utf-8")],
            }
        )
        await send({"type": "http.response.body", "body": b"event: response.created\ndata: {}\n\n", "more_body": True})
        raise RuntimeError("a bug after the first event")

    sent = await _run_edge(app)
    last = sent[-1]
    assert last["type"] == "http.response.body" and last.get("more_body", False) is False
    event, data = last["body"].decode().strip().split("\n")
    assert event == "event: error"
    assert json.loads(data.removeprefix("data: "))["error"]["code"] == "internal_error"


async def test_a_failure_after_a_whole_answer_adds_nothing() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"{}"})
        raise RuntimeError("a bug in clean-up")

    sent = await _run_edge(app)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]


# -- replaying a response that has no event log ------------------------------------------------
# (found: GET /v1/responses/{id}?stream=true of a response created without streaming waited a
#  whole blocking read (1 s) before ending its empty stream)


class _Unlogged:
    """A store holding one finished response and no events."""

    def __init__(self) -> None:
        self.waits: list[int] = []

    async def read_events(self, response_id: str, after: str, block_ms: int) -> list[tuple[str, bytes]]:
        self.waits.append(block_ms)
        return []

    async def get_response(self, response_id: str) -> StoredResponse:
        return StoredResponse(response=ResponseBody(id=response_id, status="completed", background=True))


async def test_replaying_a_finished_response_without_events_does_not_wait() -> None:
    store = _Unlogged()
    # stand-ins for what replay reads: the idle timeout, and the store's two read methods
    ctx = cast(GatewayContext, SimpleNamespace(settings=SimpleNamespace(idle_timeout_s=30.0)))
    assert [chunk async for chunk in replay(ctx, cast(ResponseStore, store), "resp_1", -1)] == []
    assert store.waits == [0]
