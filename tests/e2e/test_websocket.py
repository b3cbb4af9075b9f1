"""Responses over WebSocket, end to end through `chorus up` with openai-python's
`client.responses.connect()`, unmodified."""

from __future__ import annotations

from typing import cast

import openai
import pytest
from openai.resources.responses.responses import ResponsesConnection
from openai.types.responses import FunctionToolParam, ResponsesServerEvent

from tests.e2e.conftest import MODEL, RunningStack

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
TERMINAL = ("response.completed", "response.incomplete", "response.failed", "error")


def until_done(conn: ResponsesConnection) -> list[ResponsesServerEvent]:
    events: list[ResponsesServerEvent] = []
    for event in conn:
        events.append(event)
        if event.type in TERMINAL:
            return events
    raise AssertionError("the socket closed before the response ended")


def test_a_tool_loop_on_one_socket_with_store_false(stack: RunningStack) -> None:
    """Turn 1 calls a tool; turn 2 sends only the tool's output (store: false): the socket
    holds the chain, and the engine sees the whole conversation."""
    with stack.client().responses.connect() as conn:
        conn.response.create(model=MODEL, input="What is the weather in Oslo?", tools=[WEATHER], store=False)
        first = until_done(conn)
        assert [e.sequence_number for e in first] == list(range(len(first)))
        done = first[-1]
        assert done.type == "response.completed", done
        (call,) = [i for i in done.response.output if i.type == "function_call"]
        conn.response.create(
            model=MODEL,
            previous_response_id=done.response.id,
            store=False,
            tools=[WEATHER],
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Snow, -3C"}],
        )
        second = until_done(conn)
        assert second[-1].type == "response.completed"
        assert "Snow, -3C" in second[-1].response.output_text
        prompt = stack.engine_prompt(second[-1].response.id)
        assert "What is the weather in Oslo?" in prompt and "Snow, -3C" in prompt
    # a new socket does not know the store: false chain
    with stack.client().responses.connect() as conn:
        conn.response.create(model=MODEL, previous_response_id=done.response.id, input="and tomorrow?")
        (error,) = until_done(conn)
        assert error.type == "error" and error.error.code == "previous_response_not_found"
        conn.response.create(model=MODEL, input="still usable?")  # the socket survives errors
        assert until_done(conn)[-1].type == "response.completed"


def test_stored_responses_continue_on_any_socket(stack: RunningStack) -> None:
    first = stack.client().responses.create(model=MODEL, input="Remember the word lapwing.")
    with stack.client().responses.connect() as conn:
        conn.response.create(model=MODEL, previous_response_id=first.id, input="Which word?")
        events = until_done(conn)
    assert events[-1].type == "response.completed"
    assert "Remember the word lapwing." in stack.engine_prompt(events[-1].response.id)


def test_lanes_and_errors(stack: RunningStack) -> None:
    with stack.client().responses.connect() as conn:
        conn.response.create(model=MODEL, input="lane a", stream_id="a")
        conn.response.create(model=MODEL, input="lane b", stream_id="b")
        ended: dict[str, str] = {}
        for event in conn:
            assert event.stream_id in ("a", "b")
            if event.type in TERMINAL:
                ended[event.stream_id] = event.type
                if len(ended) == 2:
                    break
        assert ended == {"a": "response.completed", "b": "response.completed"}
        conn.send({"type": "response.create", "model": MODEL, "input": "x", "background": True})
        (error,) = until_done(conn)
        assert error.type == "error" and error.error.param == "background"
        conn.send({"type": "response.create", "model": "no-such-model", "input": "x"})
        (error,) = until_done(conn)
        assert error.type == "error" and error.status == 404


def test_stream_true_and_background_false_are_implied(stack: RunningStack) -> None:
    """Both OpenAI Agents SDKs (JS 0.20, Python 0.24) send ``stream: true`` in every frame;
    OpenAI treats it, and ``background: false``, as implied."""
    with stack.client().responses.connect() as conn:
        conn.send({"type": "response.create", "model": MODEL, "input": "hi", "stream": True, "background": False})
        assert until_done(conn)[-1].type == "response.completed"
        conn.send({"type": "response.create", "model": MODEL, "input": "x", "stream": False})
        (error,) = until_done(conn)
        assert error.type == "error" and error.error.param == "stream"


def test_sockets_need_a_key_when_keys_are_set(nats_url: str, redis_url: str) -> None:
    from tests.e2e.conftest import start_stack

    keyed = start_stack("ws-keyed", nats_url, redis_url, env={"CHORUS_API_KEYS": "sk-ws-1"})
    try:
        bad = openai.OpenAI(base_url=f"{keyed.base_url}/v1", api_key="wrong", max_retries=0)
        with pytest.raises(Exception), bad.responses.connect() as conn:  # noqa: B017 - refused at the handshake
            conn.response.create(model=MODEL, input="x")
            until_done(conn)
        good = openai.OpenAI(base_url=f"{keyed.base_url}/v1", api_key="sk-ws-1", max_retries=0)
        with good.responses.connect() as conn:
            conn.response.create(model=MODEL, input="hello")
            assert until_done(conn)[-1].type == "response.completed"
    finally:
        keyed.stop()


def test_reconnect_after_a_dropped_socket(stack: RunningStack) -> None:
    """A socket dropped mid-response loses only that response; a new socket continues the
    stored chain."""
    with stack.client().responses.connect() as conn:
        conn.response.create(model=MODEL, input="Remember the word heron.")
        first = until_done(conn)[-1]
        assert first.type == "response.completed"
        conn.response.create(model=MODEL, input="Write a long story about it.", previous_response_id=first.response.id)
        for event in conn:
            if event.type == "response.created":
                break  # drop the socket with the response under way
    with stack.client().responses.connect() as conn:
        conn.response.create(model=MODEL, previous_response_id=first.response.id, input="Which word?")
        events = until_done(conn)
    assert events[-1].type == "response.completed"
    prompt = stack.engine_prompt(events[-1].response.id)
    assert "Remember the word heron." in prompt and "Write a long story" not in prompt
