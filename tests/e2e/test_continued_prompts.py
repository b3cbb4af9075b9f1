"""A WebSocket chain's next turn renders only its new items (the worker that rendered the
previous turn remembers it), and the engine still gets exactly the prompt of the whole
conversation: the same token ids as the conversation sent whole over HTTP. A worker that has
forgotten the prompt (here: one that remembers nothing) makes the gateway send the whole
conversation instead, and the client sees no difference."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import MODEL, RunningStack, samples_of, start_stack, total
from tests.e2e.test_websocket import WEATHER, until_done
from tests.waiting import wait_until

TURNS = 4


def renders(stack: RunningStack, kind: str) -> float:
    """chorus_encoder_renders_total{kind} over the whole stack."""
    return total(
        samples_of(httpx.get(f"{stack.base_url}/metrics", timeout=5).text), "chorus_encoder_renders_total", kind=kind
    )


def websocket_loop(stack: RunningStack) -> tuple[list[dict[str, Any]], str]:
    """``TURNS`` tool calls on one socket (store: false), each turn sending only the tool's
    output and the next question; returns the conversation the last response answered (its
    own output left out) and that response's id."""
    history: list[dict[str, Any]] = []
    new: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in city 0?"}]
    previous: str | None = None
    with stack.client().responses.connect() as conn:
        for turn in range(TURNS):
            extra = {"previous_response_id": previous} if previous else {}
            conn.response.create(model=MODEL, input=new, tools=[WEATHER], store=False, **extra)  # type: ignore[arg-type]
            done = until_done(conn)[-1]
            assert done.type == "response.completed", done
            history += new
            previous = done.response.id
            if turn == TURNS - 1:
                break
            output = [i.model_dump(exclude_none=True) for i in done.response.output]
            history += output
            (call,) = [i for i in output if i["type"] == "function_call"]
            new = [
                {"type": "function_call_output", "call_id": call["call_id"], "output": f"Snow, -{turn}C"},
                {"role": "user", "content": f"What is the weather in city {turn + 1}?"},
            ]
    assert previous is not None
    return history, previous


def prompt_of(stack: RunningStack, response_id: str) -> list[int]:
    """The prompt of the response's generation (a second attempt's id adds its numbers)."""
    records = [r for r in stack.engine_requests() if str(r.get("request_id")).startswith(response_id)]
    assert len(records) == 1, records
    ids: list[int] = records[0]["prompt_token_ids"]
    return ids


def check_the_prompt(stack: RunningStack, history: list[dict[str, Any]], last: str) -> None:
    """The last turn's prompt is the whole conversation's, as HTTP renders it."""
    whole = stack.client().responses.create(model=MODEL, input=history, tools=[WEATHER], store=False)  # type: ignore[arg-type]
    assert prompt_of(stack, last) == prompt_of(stack, whole.id)


def test_a_chain_renders_only_its_new_items(stack: RunningStack) -> None:
    before = renders(stack, "continued")
    history, last = websocket_loop(stack)
    # every turn after the first (asked again: one scrape may miss a worker's answer)
    wait_until(lambda: renders(stack, "continued") - before >= TURNS - 1, 10, "a continued render per later turn")
    check_the_prompt(stack, history, last)


@pytest.fixture(scope="module")
def forgetful(nats_url: str, redis_url: str) -> Iterator[RunningStack]:
    stack = start_stack("forgetful", nats_url, redis_url, env={"CHORUS_REMEMBERED_PROMPT_TOKENS": "0"})
    yield stack
    stack.stop()


def test_a_forgotten_prompt_is_sent_whole(forgetful: RunningStack) -> None:
    before = renders(forgetful, "unknown")
    history, last = websocket_loop(forgetful)
    wait_until(
        lambda: renders(forgetful, "unknown") - before >= TURNS - 1, 10, "an unknown continuation per later turn"
    )
    assert renders(forgetful, "continued") == 0
    check_the_prompt(forgetful, history, last)
