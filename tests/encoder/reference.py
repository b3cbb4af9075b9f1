"""The rendering the encoder's own is checked against: the whole Harmony conversation as
openai-harmony's messages, and one request rendered start to end."""

from __future__ import annotations

import datetime as dt

from openai_harmony import HarmonyEncoding, Message

from contracts.messages.encode import EncodeRequest
from services.encoder.render import EncodedPrompt, body_messages, prefix_messages
from services.encoder.renderer import Renderer


def conversation_messages(req: EncodeRequest, today: dt.date, knowledge_cutoff: str) -> list[Message]:
    """The whole conversation as Harmony messages. A response format is not among them:
    openai-harmony cannot express it (the encoder's ``prefix_tokens`` can)."""
    prefix = prefix_messages(req, today, knowledge_cutoff)
    return [*prefix, *(frame.message(text) for frame, text in body_messages(req))]


def render_prompt(
    req: EncodeRequest, encoding: HarmonyEncoding, today: dt.date, knowledge_cutoff: str = "2024-06"
) -> EncodedPrompt:
    return Renderer(encoding, knowledge_cutoff).render(req, today)
