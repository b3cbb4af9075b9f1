"""Responses' ``truncation: "auto"``: a conversation longer than the context loses its oldest
messages (whole ones, starting again at a user message) and keeps room for the output; without
it, the same conversation is refused."""

from __future__ import annotations

import datetime as dt

import pytest
from openai_harmony import HarmonyEncoding

from contracts.errors import ErrorCode
from contracts.messages.encode import EncodeRequest
from contracts.messages.items import ConversationItem, FunctionCallItem, FunctionCallOutputItem, MessageItem
from services.encoder.render import RenderError
from services.encoder.renderer import Renderer

TODAY = dt.date(2025, 1, 1)
LIMIT = 1000  # tokens of context


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i % 10}" for i in range(n))


def conversation() -> list[ConversationItem]:
    return [
        MessageItem(role="user", content=words("oldest", 300)),
        MessageItem(role="assistant", content=words("reply", 300)),
        FunctionCallItem(call_id="c1", name="lookup", arguments='{"q": "x"}'),
        FunctionCallOutputItem(call_id="c1", output=words("found", 200)),
        MessageItem(role="user", content="the latest question"),
    ]


def older_and_latest() -> list[ConversationItem]:
    """A short exchange: it fits in LIMIT, with room to spare only for a small output."""
    return [
        MessageItem(role="user", content=words("older", 200)),
        MessageItem(role="assistant", content="ok"),
        MessageItem(role="user", content=words("latest", 100)),
    ]


def request(items: list[ConversationItem], truncation: str) -> EncodeRequest:
    return EncodeRequest.model_validate({"model": "m", "items": items, "truncation": truncation})


def text(encoding: HarmonyEncoding, tokens: list[int]) -> str:
    decoded: str = encoding.decode(tokens)
    return decoded


def test_without_truncation_a_long_conversation_is_refused(encoding: HarmonyEncoding) -> None:
    with pytest.raises(RenderError) as refused:
        Renderer(encoding).render(request(conversation(), "disabled"), TODAY, LIMIT)
    assert refused.value.error.code is ErrorCode.CONTEXT_LENGTH_EXCEEDED


def test_auto_drops_the_oldest_messages_and_starts_at_a_user_message(encoding: HarmonyEncoding) -> None:
    whole = Renderer(encoding).render(request(conversation(), "auto"), TODAY, None)  # no limit: all of it
    assert len(whole.token_ids) > LIMIT
    prompt = Renderer(encoding).render(request(conversation(), "auto"), TODAY, LIMIT)
    assert len(prompt.token_ids) <= LIMIT
    rendered = text(encoding, prompt.token_ids)
    assert "the latest question" in rendered and "oldest" not in rendered
    # the reply, the call and its output would fit without the oldest message, but they would
    # start the conversation with the assistant: they go too
    assert "reply" not in rendered and "found" not in rendered
    assert rendered.endswith("<|start|>assistant")


def test_auto_keeps_what_fits(encoding: HarmonyEncoding) -> None:
    items: list[ConversationItem] = [
        MessageItem(role="user", content=words("oldest", 600)),
        MessageItem(role="assistant", content="short reply"),
        MessageItem(role="user", content="a follow-up"),
        MessageItem(role="assistant", content="another reply"),
        MessageItem(role="user", content="the latest question"),
    ]
    rendered = text(encoding, Renderer(encoding).render(request(items, "auto"), TODAY, LIMIT).token_ids)
    assert "oldest" not in rendered and "short reply" not in rendered  # its answer goes with it
    for kept in ("a follow-up", "another reply", "the latest question"):
        assert kept in rendered  # only what had to go went
    assert rendered.index("a follow-up") < rendered.index("the latest question")


def test_auto_keeps_room_for_the_output(encoding: HarmonyEncoding) -> None:
    items = older_and_latest()
    roomy = text(encoding, Renderer(encoding).render(request(items, "auto"), TODAY, LIMIT).token_ids)
    assert "older" in roomy  # fits as it is
    tight = text(encoding, Renderer(encoding).render(request(items, "auto"), TODAY, LIMIT, reserve=400).token_ids)
    assert "older" not in tight and "latest" in tight


def test_auto_refuses_when_even_the_last_message_is_too_long(encoding: HarmonyEncoding) -> None:
    items: list[ConversationItem] = [
        MessageItem(role="user", content="hi"),
        MessageItem(role="user", content=words("huge", 3000)),
    ]
    with pytest.raises(RenderError) as refused:
        Renderer(encoding).render(request(items, "auto"), TODAY, LIMIT)
    assert refused.value.error.code is ErrorCode.CONTEXT_LENGTH_EXCEEDED


def test_a_tool_loop_without_a_user_message_in_reach_keeps_its_calls_with_their_outputs(
    encoding: HarmonyEncoding,
) -> None:
    """The user's request is too long to keep; the agent's calls and outputs after it fit: they
    stay (from a call, never from an output without its call), not just the last output."""
    items: list[ConversationItem] = [MessageItem(role="user", content=words("request", 700))]
    for i in range(3):
        items += [
            FunctionCallItem(call_id=f"c{i}", name="lookup", arguments=f'{{"q": "step{i}"}}'),
            FunctionCallOutputItem(call_id=f"c{i}", output=f"result{i}"),
        ]
    rendered = text(encoding, Renderer(encoding).render(request(items, "auto"), TODAY, LIMIT).token_ids)
    assert "request" not in rendered
    for i in range(3):
        assert f"step{i}" in rendered and f"result{i}" in rendered
    assert rendered.index("step0") < rendered.index("result0")


def test_auto_without_an_output_budget_keeps_an_eighth_of_the_context_free(encoding: HarmonyEncoding) -> None:
    items = older_and_latest()
    prompt = Renderer(encoding).render(request(items, "auto"), TODAY, LIMIT)
    assert len(prompt.token_ids) <= LIMIT - 1 - LIMIT // 8
